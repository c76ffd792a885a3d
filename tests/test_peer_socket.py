"""The coms listener over a real unix socket: one line in, exactly one reply line out (W11-W18).

Replies are asserted byte for byte, because other peers parse them and the
daemon we replace wrote exactly these bytes.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from coms_hermes_bridge.actors import responses
from coms_hermes_bridge.actors.listener import EndpointInUse, bind_endpoint
from coms_hermes_bridge.actors.registry import PeerIdentity, resolve_identity
from coms_hermes_bridge.messages.commands import CancelQuestion, NewQuestion, QueueDepthQuery
from tests.fakes import FakeRef, PeerRig, edge_caught_up, exchange, prompt_envelope

QID = "01ARZ3NDEKTSV4RRFFQ69G5FAV"

PROMPT: dict[str, Any] = prompt_envelope(
    QID, text="Ship it?", sender_endpoint="/tmp/nowhere.sock", sender_cwd="/work/app"
).json_body()

CANCEL: dict[str, Any] = {
    "type": "cancel",
    "msg_id": "01ARZ3NDEKTSV4RRFFQ69G5FAW",
    "from": "builder",
    "to": "user-remote",
    "created_at": "2026-11-30T12:00:05.000Z",
    "ref_msg_id": QID,
}

NOT_TAKEN = "bridge accepts prompts, cancels, and pings"


def line(body: Any) -> bytes:
    return (json.dumps(body) + "\n").encode()


def nack(msg_id: str, error: str) -> bytes:
    return f'{{"type":"nack","msg_id":"{msg_id}","error":"{error}"}}\n'.encode()


def pong(msg_id: str, depth: int, name: str = "user-remote") -> bytes:
    return (
        f'{{"type":"pong","msg_id":"{msg_id}","agent_card":{{"name":"{name}",'
        '"purpose":"Remote human via Hermes/Telegram","model":"hermes-bridge",'
        f'"color":"#38BDF8","context_used_pct":0,"queue_depth":{depth}}}}}\n'
    ).encode()


def identity_in(coms_dir: Path) -> PeerIdentity:
    return resolve_identity(
        coms_dir, "default", "user-remote", cwd="/work", pid=os.getpid(), now=datetime.now(UTC)
    )


def serving(identity: PeerIdentity, **options: Any) -> PeerRig:
    """A Peer whose Router takes every prompt at once, recorded in `rig.router` as what
    else it is told."""
    router: list[FakeRef] = []

    def admit(question: NewQuestion) -> None:  # (only told once the rig is ready)
        router[0].inbox.put(question)
        question.verdict.set_result(None)

    rig = PeerRig(identity, answers={NewQuestion: admit, **options.pop("answers", {})},
                  **options)
    router.append(rig.router)
    return rig.ready()


@pytest.fixture
def peer(coms_dir: Path) -> PeerRig:
    return serving(identity_in(coms_dir), depth=3)


# -- replies ------------------------------------------------------------------


def test_prompt_is_acked_with_its_msg_id(peer: PeerRig) -> None:  # W12, W14
    assert exchange(peer.endpoint, line(PROMPT)) == f'{{"type":"ack","msg_id":"{QID}"}}\n'.encode()
    assert peer.router.expect(NewQuestion).envelope.msg_id == QID


def test_cancel_is_acked(peer: PeerRig) -> None:  # W12, W16
    reply = exchange(peer.endpoint, line(CANCEL))
    assert reply == b'{"type":"ack","msg_id":"01ARZ3NDEKTSV4RRFFQ69G5FAW"}\n'
    assert peer.router.expect(CancelQuestion).envelope.ref_msg_id == QID


def test_ping_gets_pong_with_agent_card(peer: PeerRig) -> None:  # W12, W17
    assert exchange(peer.endpoint, b'{"type":"ping","msg_id":"p1"}\n') == pong("p1", 3)


def test_the_one_off_commands_send_their_line_as_the_pool_does(
    peer: PeerRig, coms_dir: Path
) -> None:  # W12: `doctor` reads the reply line, `cancel` the verdict on it
    ping = b'{"type":"ping","msg_id":"p1"}\n'
    assert responses.exchange(str(peer.endpoint), ping, 5) == pong("p1", 3)
    assert responses.send_envelope(str(peer.endpoint), line(CANCEL), 5) == (None, True)
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # accepts, never replies
    mute.bind(str(coms_dir / "mute.sock"))
    mute.listen(1)
    with mute, pytest.raises(TimeoutError):
        responses.exchange(str(coms_dir / "mute.sock"), ping, 0.2)


def test_ping_without_msg_id_is_answered_with_empty_id(peer: PeerRig) -> None:  # W17
    assert exchange(peer.endpoint, b'{"type":"ping"}\n') == pong("", 3)


def test_extra_fields_are_ignored(peer: PeerRig) -> None:  # W18
    body = {**PROMPT, "trace": {"span": 1}, "future": [1, 2]}
    assert exchange(peer.endpoint, line(body)) == f'{{"type":"ack","msg_id":"{QID}"}}\n'.encode()


# -- refusals -----------------------------------------------------------------


def test_invalid_json_is_nacked(peer: PeerRig) -> None:  # W13
    assert exchange(peer.endpoint, b"{not json\n") == nack("", "invalid json")


def test_non_utf8_is_invalid_json(peer: PeerRig) -> None:  # W12, W13
    assert exchange(peer.endpoint, b'\xff\xfe{"type":"ping"}\n') == nack("", "invalid json")


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_nan_is_invalid_json_as_for_a_node_peer(peer: PeerRig, constant: bytes) -> None:  # W13
    assert exchange(peer.endpoint, b'{"type":"ping","msg_id":%s}\n' % constant) == nack(
        "", "invalid json")
    # a prompt otherwise valid, its number NaN or Infinity, which JSON.parse refuses:
    # the line is refused, not the prompt
    prompt = line(PROMPT).replace(b'"hops": 0', b'"hops":' + constant)
    assert b'"hops":' + constant in prompt
    assert exchange(peer.endpoint, prompt) == nack("", "invalid json")
    schema = line(PROMPT).replace(b'"hops": 0', b'"hops": 0, "response_schema": {"max": %s}' % constant)
    assert exchange(peer.endpoint, schema) == nack("", "invalid json")
    peer.router.assert_nothing()


@pytest.mark.parametrize("number", [b"1e400", b"-1E+999", b"2e308"])
def test_a_number_past_a_double_is_json_and_its_field_is_named(
    peer: PeerRig, number: bytes
) -> None:  # X17, W13, W14: JSON.parse reads it as Infinity, a number, so the line is JSON
    def holding(body: dict[str, Any], field: str, value: bytes) -> bytes:
        held = line({**body, field: "@"}).replace(b'"@"', value)
        assert value in held
        return held

    for field, value, why in (
        ("hops", number, "is not a finite number"),
        ("reply_timeout_ms", b"-" + number.lstrip(b"-"), "is not a finite number"),
        ("response_schema", b'{"max": %s}' % number, "holds a number that is not finite"),
        ("conversation_id", b"[1, [%s]]" % number, "holds a number that is not finite"),
    ):
        assert exchange(peer.endpoint, holding(PROMPT, field, value)) == nack(
            QID, f"invalid prompt envelope: {field} {why}")
    assert exchange(peer.endpoint, holding(CANCEL, "ref_msg_id", number)) == nack(
        CANCEL["msg_id"], "invalid cancel envelope: ref_msg_id is not a finite number")
    peer.router.assert_nothing()  # stored nowhere, told to nobody
    # where no field of ours holds it, nothing is wrong: an unknown field is ignored
    # (W18), and a ping's msg_id that is no string is answered with "" as any other is
    extra = holding(PROMPT, "trace", number)
    assert exchange(peer.endpoint, extra) == f'{{"type":"ack","msg_id":"{QID}"}}\n'.encode()
    assert peer.router.expect(NewQuestion).envelope.msg_id == QID
    assert exchange(peer.endpoint, b'{"type":"ping","msg_id":%s}\n' % number) == pong("", 3)


@pytest.mark.parametrize(
    ("body", "msg_id"),
    [
        ({"type": "response", "msg_id": "m1"}, "m1"),
        ({"type": "hello", "msg_id": 5}, ""),
        ({"msg_id": "m2"}, "m2"),
        ([1, 2], ""),
        ("ping", ""),
        (None, ""),
    ],
)
def test_unknown_type_is_nacked_naming_what_we_take(
    peer: PeerRig, body: Any, msg_id: str
) -> None:  # W13
    assert exchange(peer.endpoint, line(body)) == nack(msg_id, NOT_TAKEN)


def test_prompt_missing_hops_is_nacked(peer: PeerRig) -> None:  # W14
    body = {k: v for k, v in PROMPT.items() if k != "hops"}
    assert exchange(peer.endpoint, line(body)) == nack(QID, "invalid prompt envelope")
    edge_caught_up()  # the connection's task is over, what it does after the reply too
    peer.router.assert_nothing()


@pytest.mark.parametrize(
    "change",
    [{"hops": "0"}, {"prompt": 5}, {"sender_endpoint": None}, {"msg_id": None}],
)
def test_prompt_with_wrong_field_types_is_nacked(
    peer: PeerRig, change: dict[str, Any]
) -> None:  # W14
    body = {**PROMPT, **change}
    msg_id = body["msg_id"] if isinstance(body["msg_id"], str) else ""
    assert exchange(peer.endpoint, line(body)) == nack(msg_id, "invalid prompt envelope")


def test_cancel_with_empty_ref_msg_id_is_nacked(peer: PeerRig) -> None:  # W16
    body = {**CANCEL, "ref_msg_id": ""}
    assert exchange(peer.endpoint, line(body)) == nack(CANCEL["msg_id"], "invalid cancel envelope")
    edge_caught_up()  # the connection's task is over, what it does after the reply too
    peer.router.assert_nothing()


def test_oversize_line_without_newline_is_refused(peer: PeerRig) -> None:  # W13
    assert exchange(peer.endpoint, b"a" * 65537) == nack("", "line too large")


def test_oversize_line_with_newline_is_refused(peer: PeerRig) -> None:  # W13
    assert exchange(peer.endpoint, b"a" * 100_000 + b"\n") == nack("", "line too large")


def test_line_of_exactly_64_kib_is_taken(peer: PeerRig) -> None:  # W13 boundary
    ping = b'{"type":"ping","msg_id":"big"}'
    padded = ping + b" " * (65536 - len(ping)) + b"\n"
    assert exchange(peer.endpoint, padded) == pong("big", 3)


# -- framing ------------------------------------------------------------------


def test_blank_lines_are_skipped(peer: PeerRig) -> None:  # W12
    assert exchange(peer.endpoint, b"\n  \r\n" + b'{"type":"ping","msg_id":"b"}\n') == pong("b", 3)


def test_blank_lines_up_to_64_kib_are_skipped_and_past_it_refused(peer: PeerRig) -> None:  # W12, W13
    ping = b'{"type":"ping","msg_id":"b"}\n'
    assert exchange(peer.endpoint, b"\n" * 65536 + ping) == pong("b", 3)
    assert exchange(peer.endpoint, b" \n" * 32768 + b"\n" + ping) == nack("", "line too large")
    assert exchange(peer.endpoint, b"\n" * 1_000_000 + ping) == nack("", "line too large")
    # the loop was never held up: the next client is served
    assert exchange(peer.endpoint, ping) == pong("b", 3)


def test_eof_without_newline_is_a_line(peer: PeerRig) -> None:  # W12
    reply = exchange(peer.endpoint, b'{"type":"ping","msg_id":"e"}', half_close=True)
    assert reply == pong("e", 3)


def test_only_the_first_line_is_answered(peer: PeerRig) -> None:  # W12
    data = b'{"type":"ping","msg_id":"one"}\n{"type":"ping","msg_id":"two"}\n'
    assert exchange(peer.endpoint, data) == pong("one", 3)


def test_a_client_that_says_nothing_gets_nothing(peer: PeerRig) -> None:  # W12
    assert exchange(peer.endpoint, b"", half_close=True) == b""


def test_a_silent_client_does_not_block_others(peer: PeerRig) -> None:  # W12
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
        silent.connect(str(peer.endpoint))
        assert exchange(peer.endpoint, b'{"type":"ping","msg_id":"s"}\n') == pong("s", 3)


def test_fifty_concurrent_connections_are_all_answered(peer: PeerRig) -> None:  # W12
    ids = [f"01ARZ3NDEKTSV4RRFFQ69G{n:04d}" for n in range(50)]
    replies: dict[str, bytes] = {}
    barrier = threading.Barrier(50)

    def ask(msg_id: str) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(5)
            conn.connect(str(peer.endpoint))
            barrier.wait(5)  # all fifty open at once before any of them speaks
            conn.sendall(line({**PROMPT, "msg_id": msg_id}))
            reply = b""
            while chunk := conn.recv(4096):
                reply += chunk
            replies[msg_id] = reply

    threads = [threading.Thread(target=ask, args=(i,)) for i in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert replies == {i: f'{{"type":"ack","msg_id":"{i}"}}\n'.encode() for i in ids}
    handed_on = {peer.router.expect(NewQuestion).envelope.msg_id for _ in ids}
    assert handed_on == set(ids)


# -- queue depth in the pong (C21, W17) -----------------------------------------


def test_pong_reports_the_last_depth_when_the_router_does_not_answer(
    coms_dir: Path,
) -> None:  # W17
    answers = [4]

    def depth(query: QueueDepthQuery) -> None:
        if answers:
            query.reply(answers.pop())
        # else: the Router is busy and never answers in time

    peer = serving(identity_in(coms_dir), depth=None, answers={QueueDepthQuery: depth},
                   heartbeat_ms=3_600_000)
    assert exchange(peer.endpoint, b'{"type":"ping","msg_id":"1"}\n') == pong("1", 4)
    assert exchange(peer.endpoint, b'{"type":"ping","msg_id":"2"}\n') == pong("2", 4)


# -- binding (W11) --------------------------------------------------------------


def test_stale_socket_path_is_taken_over(coms_dir: Path) -> None:  # W11
    path = coms_dir / "stale.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()  # the file stays, nobody listens: what a SIGKILL leaves behind
    server = bind_endpoint(path)
    try:
        assert path.exists()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.connect(str(path))
    finally:
        server.close()


def test_a_socket_path_someone_answers_on_is_not_stolen(coms_dir: Path) -> None:  # W11
    path = coms_dir / "busy.sock"
    owner = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    owner.bind(str(path))
    owner.listen(1)
    try:
        with pytest.raises(EndpointInUse, match=r"endpoint already in use \(.*busy\.sock\)"):
            bind_endpoint(path)
        assert path.exists()
    finally:
        owner.close()
