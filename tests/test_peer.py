"""The PeerActor with fake collaborators, and the registry it keeps (W1-W11, W15, W17).

The Peer is started as the tree starts it, with FakeRefs for its
collaborators and a store that records what is settled; the only real sockets are the
peer's own and a fake asker that records what it is sent.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import sqlite3
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from coms_hermes_bridge.actors import listener as listener_module
from coms_hermes_bridge.actors import peer as peer_module
from coms_hermes_bridge.actors import registry
from coms_hermes_bridge.actors.daemon import unpublish_if_left
from coms_hermes_bridge.actors.peer import PeerActor
from coms_hermes_bridge.actors.registry import (
    ENTRY_LIMIT,
    IdentityError,
    PeerIdentity,
    crashed_holder,
    endpoint_accepts,
    heartbeat_fresh,
    is_live,
    live_names,
    pid_alive,
    read_entry,
    remove_entry_if_ours,
    resolve_identity,
    validate_name,
    validate_project,
    write_entry,
)
from coms_hermes_bridge.actors.responses import ResponsePool
from coms_hermes_bridge.actors.supervision import Slot
from coms_hermes_bridge.messages.commands import (
    CancelQuestion,
    ChildFailed,
    Heartbeat,
    LogEvent,
    NewQuestion,
    QueueDepthQuery,
    SendResponse,
)
from coms_hermes_bridge.messages.contract import iso
from coms_hermes_bridge.messages.wire import RegistryEntry
from tests.fakes import (
    Asker,
    PeerRig,
    Settles,
    WiredRig,
    edge_caught_up,
    exchange,
    in_forked_child,
    prompt_envelope,
    said,
    wait_for,
)

QID = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
ACKED = f'{{"type":"ack","msg_id":"{QID}"}}\n'.encode()


@pytest.fixture
def identity(coms_dir: Path) -> PeerIdentity:
    return resolve_identity(
        coms_dir, "default", "user-remote", cwd="/work", pid=os.getpid(), now=datetime.now(UTC)
    )


def start(identity: PeerIdentity, **options: Any) -> PeerRig:
    return PeerRig(identity, **options)


def ping(endpoint: Path) -> dict[str, Any]:
    reply: dict[str, Any] = json.loads(exchange(endpoint, b'{"type":"ping","msg_id":"p"}\n'))
    return reply


PROMPT_LINE = prompt_envelope(sender_endpoint="/tmp/asker.sock").to_line()


def send_in_background(rig: PeerRig, data: bytes) -> tuple[threading.Thread, list[bytes]]:
    """Send `data` from a thread of its own: its reply lands in the list once it comes."""
    replies: list[bytes] = []
    sender = threading.Thread(target=lambda: replies.append(rig.send(data)))
    sender.start()
    return sender, replies


# -- what the peer hands on (W14, W16) -----------------------------------------


def test_prompt_is_handed_on_as_new_question_and_acked(identity: PeerIdentity) -> None:  # W14
    rig = start(identity).ready()
    sender, replies = send_in_background(rig, PROMPT_LINE)
    handed = rig.router.expect(NewQuestion)
    assert handed.envelope == prompt_envelope(sender_endpoint="/tmp/asker.sock")
    assert replies == []  # not acked before the Router's word
    handed.verdict.set_result(None)
    sender.join(5)
    assert replies == [ACKED]


def test_a_refused_prompt_is_nacked_with_the_routers_words(identity: PeerIdentity) -> None:
    # W14, X2: the nack's error is the Router's reply, word for word
    rig = start(identity, answers={NewQuestion: lambda question: question.verdict.set_result(
        "bridge has 3 open questions; try later")})
    reply = json.loads(rig.ready().send(PROMPT_LINE))
    assert reply == {"type": "nack", "msg_id": QID,
                     "error": "bridge has 3 open questions; try later"}


def test_a_prompt_while_the_router_restarts_is_nacked_to_try_again(
    identity: PeerIdentity,
) -> None:  # W14: admission through the Router's slot, unbound while it restarts
    router = Slot("router")
    rig = start(identity, addresses={"router": router}).ready()
    reply = json.loads(rig.send(PROMPT_LINE))
    assert reply == {"type": "nack", "msg_id": QID, "error": "bridge is restarting; try again"}
    assert router.ref is None  # nothing told to a Router that would store it unacked


def test_prompt_is_acked_only_once_admitted(identity: PeerIdentity) -> None:  # W14
    # restart safety: the ack waits until the question is stored (admit replies)
    asked = threading.Event()
    admitted: list[str] = []
    replies_to: list[Callable[[str | None], None]] = []

    def admit(question: NewQuestion) -> None:
        admitted.append(question.envelope.msg_id)
        replies_to.append(question.verdict.set_result)
        asked.set()

    rig = start(identity, answers={NewQuestion: admit}).ready()
    sender, replies = send_in_background(rig, PROMPT_LINE)
    assert asked.wait(5)
    assert admitted == [QID]
    assert replies == []  # still waiting on admission: no ack yet
    replies_to[0](None)  # stored
    sender.join(5)
    assert replies == [ACKED]


def test_cancel_is_handed_on_as_cancel_question_and_acked(identity: PeerIdentity) -> None:  # W16
    rig = start(identity).ready()
    cancel = {
        "type": "cancel",
        "msg_id": "01ARZ3NDEKTSV4RRFFQ69G5FAW",
        "from": "builder",
        "to": "user-remote",
        "created_at": "2026-11-30T12:00:05.000Z",
        "ref_msg_id": QID,
    }
    reply = rig.send((json.dumps(cancel) + "\n").encode())
    assert reply == b'{"type":"ack","msg_id":"01ARZ3NDEKTSV4RRFFQ69G5FAW"}\n'
    got = rig.router.expect(CancelQuestion).envelope
    assert (got.msg_id, got.from_, got.to, got.ref_msg_id) == (
        cancel["msg_id"],
        "builder",
        "user-remote",
        QID,
    )


@pytest.mark.parametrize(("extra", "by_operator"), [
    ({}, False), ({"by": "operator"}, True), ({"by": "Operator"}, False),
    ({"by": ["operator"]}, False), ({"by": None}, False)])
def test_the_operators_mark_is_handed_on_with_the_cancel(
    identity: PeerIdentity, extra: dict[str, object], by_operator: bool
) -> None:  # X15: only the exact mark; anything else is an extra field like any (W18)
    rig = start(identity).ready()
    cancel = {"type": "cancel", "msg_id": "01ARZ3NDEKTSV4RRFFQ69G5FAW", "from": "builder",
              "to": "user-remote", "created_at": "2026-11-30T12:00:05.000Z",
              "ref_msg_id": QID, **extra}
    reply = rig.send((json.dumps(cancel) + "\n").encode())
    assert reply == b'{"type":"ack","msg_id":"01ARZ3NDEKTSV4RRFFQ69G5FAW"}\n'
    got = rig.router.expect(CancelQuestion)
    assert (got.envelope.ref_msg_id, got.by_operator) == (QID, by_operator)


def test_nothing_is_handed_on_for_a_ping(identity: PeerIdentity) -> None:  # W17
    rig = start(identity).ready()
    assert ping(identity.endpoint)["agent_card"]["queue_depth"] == 2
    edge_caught_up()  # the connection's task is over, what it does after the reply too
    rig.router.assert_nothing()


# -- registry entry (W5-W8) ---------------------------------------------------


def test_entry_has_every_field_the_pool_reads(identity: PeerIdentity) -> None:  # W5
    start(identity).ready()
    text = identity.entry_path.read_text()
    body = json.loads(text)
    assert ISO.fullmatch(body.pop("heartbeat_at"))
    assert body == {
        "session_id": identity.session_id,
        "name": "user-remote",
        "purpose": "Remote human via Hermes/Telegram",
        "model": "hermes-bridge",
        "color": "#38BDF8",
        "pid": os.getpid(),
        "endpoint": str(identity.endpoint),
        "cwd": "/work",
        "started_at": identity.started_at,
        "explicit": False,
        "version": 1,
        "context_used_pct": 0,
        "queue_depth": 0,
    }
    assert text.startswith('{\n  "session_id": ')  # two-space indented, as the pool writes it
    leftovers = [p.name for p in identity.agents_dir.iterdir() if p.name != "user-remote.json"]
    assert leftovers == []  # W5: the temp file was renamed, not left behind


def test_heartbeat_rewrites_entry_with_depth_and_fresh_time(identity: PeerIdentity) -> None:  # W6
    rig = start(identity).ready()
    old = read_entry(identity.entry_path)
    assert old is not None
    write_entry(
        identity.entry_path,
        old.model_copy(update={"heartbeat_at": "2000-01-01T00:00:00.000Z"}),
    )
    before = datetime.now(UTC) - timedelta(milliseconds=1)
    rig.ref.tell(Heartbeat(7))
    rig.sync()
    entry = read_entry(identity.entry_path)
    assert entry is not None and entry.queue_depth == 7
    assert entry.heartbeat_at is not None
    assert datetime.fromisoformat(entry.heartbeat_at) >= before
    assert entry.session_id == identity.session_id


def test_the_heartbeat_reports_queue_depth_every_interval(identity: PeerIdentity) -> None:  # W6
    # each beat asks the Router for its count and writes it: the beats go on by themselves
    counts = iter(range(1, 1000))
    start(identity, answers={QueueDepthQuery: lambda query: query.reply(next(counts))},
          heartbeat_ms=20)

    def beaten(times: int) -> bool:
        entry = read_entry(identity.entry_path)
        return entry is not None and entry.queue_depth >= times

    wait_for(lambda: beaten(1), what="a heartbeat with the Router's depth")
    wait_for(lambda: beaten(4), what="three heartbeats more, none of them told")


def test_the_peer_beats_every_30_s_and_gives_an_asker_10_s(identity: PeerIdentity) -> None:
    # W6's heartbeat (the default setting); W15's per-attempt bound on a response
    actor = WiredRig(PeerActor, store=Settles(), identity=identity).actor
    assert (actor.heartbeat_s, peer_module.RESPONSE_TIMEOUT_S) == (30.0, 10.0)


def test_entry_appears_only_once_the_socket_accepts(identity: PeerIdentity) -> None:  # W7
    start(identity)
    wait_for(identity.entry_path.exists, timeout=5, what="entry")
    assert endpoint_accepts(str(identity.endpoint))


def test_stop_unpublishes_before_the_socket_stops_answering(
    identity: PeerIdentity,
) -> None:  # W7, W8
    rig = start(identity).ready()
    violations: list[str] = []
    probing = threading.Event()

    def watch() -> None:
        # a refused connect followed by a still-present entry would mean the
        # socket closed while the pool still believed us ready
        while True:
            probing.set()
            entry_before = identity.entry_path.exists()
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(2.0)
                try:
                    probe.connect(str(identity.endpoint))
                    continue
                except (ConnectionRefusedError, FileNotFoundError):
                    pass  # the socket is closed for good
                except OSError:
                    continue  # a busy backlog or a slow machine proves nothing
            if entry_before and identity.entry_path.exists():
                violations.append("socket closed before the entry was removed")
            return

    watcher = threading.Thread(target=watch)
    watcher.start()
    probing.wait(5)
    rig.ref.stop()
    watcher.join(5)
    assert violations == []
    assert not identity.entry_path.exists()
    assert not identity.endpoint.exists()


def test_release_leaves_an_entry_claimed_by_another_run(identity: PeerIdentity) -> None:  # W8
    rig = start(identity).ready()
    entry = read_entry(identity.entry_path)
    assert entry is not None
    write_entry(identity.entry_path, entry.model_copy(update={"session_id": "someone-else"}))
    rig.ref.stop()
    assert identity.entry_path.exists()
    assert not identity.endpoint.exists()


def test_a_second_release_leaves_a_successors_entry_and_socket_alone(
    identity: PeerIdentity, capfd: pytest.CaptureFixture[str]
) -> None:  # W8: each step of release is done once, however often release is called
    rig = start(identity).ready()
    entry = read_entry(identity.entry_path)
    assert entry is not None
    rig.ref.stop()  # the first release: unpublished, unlistened, unlinked
    assert not identity.entry_path.exists() and not identity.endpoint.exists()
    successor = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # the next run, same session
    successor.bind(str(identity.endpoint))
    write_entry(identity.entry_path, entry)
    try:
        rig.actor.release()
        assert read_entry(identity.entry_path) == entry
        assert identity.endpoint.is_socket()
        assert capfd.readouterr().err == ""
    finally:
        successor.close()


def test_release_closes_the_listener_and_minds_a_socket_already_gone(
    identity: PeerIdentity, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:  # W8
    rig = start(identity).ready()
    listener = rig.listener
    identity.endpoint.unlink()  # removed by hand before the stop
    rig.ref.stop()
    wait_for(lambda: listener._server.fileno() == -1,  # the listening socket is closed,
             what="the listening socket closed")  # not leaked
    assert not identity.entry_path.exists()
    assert capfd.readouterr().err == ""
    # a socket already gone is no failure: the stop raised nothing for pykka to log
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_release_that_fails_is_said_and_never_raised(
    identity: PeerIdentity, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:  # W8
    def refuse(path: Path, session_id: str) -> None:
        raise PermissionError(13, "Permission denied")

    rig = start(identity).ready()
    monkeypatch.setattr(peer_module, "remove_entry_if_ours", refuse)
    rig.ref.stop()
    assert capfd.readouterr().err == (
        "coms-hermes-bridge: peer release: PermissionError(13, 'Permission denied')\n")
    monkeypatch.undo()  # each step once: a later release does the steps left, and only them
    rig.actor.release()
    assert not identity.entry_path.exists() and not identity.endpoint.exists()
    assert capfd.readouterr().err == ""


def test_a_start_whose_entry_cannot_be_written_is_undone_cleanly(
    identity: PeerIdentity, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:  # W7, W8: listening but never published; failed, its socket is left to no one
    def refuse(path: Path, entry: RegistryEntry) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(peer_module, "write_entry", refuse)
    rig = start(identity)
    failed = rig.supervisor.expect(ChildFailed)
    assert failed.error == "PermissionError: [Errno 13] Permission denied"
    assert not identity.endpoint.exists()  # unbound: the restart can bind
    assert not identity.entry_path.exists()
    assert "peer release" not in capfd.readouterr().err  # undone cleanly, half begun


# -- the heartbeat's bookkeeping (W6) --------------------------------------------


def test_a_slow_router_leaves_the_beat_its_last_count(
    identity: PeerIdentity, monkeypatch: pytest.MonkeyPatch
) -> None:  # W6: the beats go on while the Router is slow
    monkeypatch.setattr(listener_module, "DEPTH_TIMEOUT_S", 0.05)
    asks: list[Callable[[int], None]] = []
    slow = iter([False, True])  # answers the first count, then none

    def depth(query: QueueDepthQuery) -> None:
        asks.append(query.reply)
        if not next(slow, True):
            query.reply(5)

    start(identity, answers={QueueDepthQuery: depth}, heartbeat_ms=20)

    def depth_written() -> int:
        entry = read_entry(identity.entry_path)
        return -1 if entry is None else entry.queue_depth

    wait_for(lambda: depth_written() == 5 and len(asks) >= 3,
             what="beats with the last count while the Router says nothing")
    assert depth_written() == 5


def test_a_ping_asks_the_router_for_its_open_count(identity: PeerIdentity) -> None:  # W17
    rig = start(identity, depth=None).ready()
    sender, replies = send_in_background(rig, b'{"type":"ping","msg_id":"p"}\n')
    rig.router.expect(QueueDepthQuery).reply(4)
    sender.join(5)
    assert json.loads(replies[0])["agent_card"]["queue_depth"] == 4


def test_a_heartbeat_asks_the_router_for_its_open_count(identity: PeerIdentity) -> None:  # W6
    rig = start(identity, depth=None, heartbeat_ms=50).ready()
    rig.router.expect(QueueDepthQuery).reply(7)

    def written() -> bool:
        entry = read_entry(identity.entry_path)
        return entry is not None and entry.queue_depth == 7

    wait_for(written, what="the Router's count in the entry")


def test_a_registry_entry_that_cannot_be_written_is_said_once_and_again_when_it_can(
    identity: PeerIdentity, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:  # W6: never a crash, restarting would not help
    rig = start(identity).ready()

    def full(path: Path, entry: RegistryEntry) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(peer_module, "write_entry", full)
    rig.ref.tell(Heartbeat(3))
    rig.ref.tell(Heartbeat(4))
    rig.sync()
    assert capfd.readouterr().err == (
        f"coms-hermes-bridge: error: cannot write the registry entry {identity.entry_path}:"
        " [Errno 28] No space left on device; trying again at every heartbeat\n")
    monkeypatch.setattr(peer_module, "write_entry", write_entry)
    rig.ref.tell(Heartbeat(5))
    rig.sync()
    assert capfd.readouterr().err == (
        f"coms-hermes-bridge: info: registry entry {identity.entry_path} written again\n")
    rig.supervisor.assert_nothing()


def test_what_a_heartbeat_heals_it_says(
    identity: PeerIdentity, capfd: pytest.CaptureFixture[str]
) -> None:  # W6
    rig = start(identity).ready()
    shutil.rmtree(identity.agents_dir)
    capfd.readouterr()
    rig.ref.tell(Heartbeat(1))
    rig.sync()
    assert capfd.readouterr().err == (
        f"coms-hermes-bridge: warning: {identity.agents_dir} was gone; made it again (0700)\n")
    assert read_entry(identity.entry_path) is not None
    assert ping(identity.endpoint)["type"] == "pong"
    rig.supervisor.assert_nothing()


def test_a_directory_another_peer_remakes_meanwhile_is_left_as_found(
    identity: PeerIdentity, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:  # W1, W6: the pool's directories are its other peers' too; only made ones are 0700
    rig = start(identity).ready()
    shutil.rmtree(identity.agents_dir)
    real_mkdir = os.mkdir

    def another_peer_first(path: Any, mode: int = 0o777) -> None:
        if Path(path) == identity.agents_dir and not identity.agents_dir.exists():
            real_mkdir(path)
            os.chmod(path, 0o755)  # made by another peer between our look and our mkdir
        real_mkdir(path, mode)

    monkeypatch.setattr(os, "mkdir", another_peer_first)
    rig.ref.tell(Heartbeat(1))
    rig.sync()
    monkeypatch.undo()
    assert stat.S_IMODE(identity.agents_dir.stat().st_mode) == 0o755
    err = capfd.readouterr().err
    assert "tightened" not in err and "(0700)" not in err  # not ours, and not said to be
    assert (f"coms-hermes-bridge: warning: {identity.agents_dir} was gone; another peer made "
            "it again meanwhile\n") in err
    assert read_entry(identity.entry_path) is not None


def test_a_socket_deleted_under_the_peer_fails_it_and_its_restart_listens_again(
    identity: PeerIdentity, capfd: pytest.CaptureFixture[str]
) -> None:  # W6: a restart is a start; the pool finds us again at the same endpoint
    rig = start(identity).ready()
    shutil.rmtree(identity.endpoint.parent)
    rig.ref.tell(Heartbeat(1))
    failed = rig.supervisor.expect(ChildFailed)
    assert (failed.child, failed.error) == ("peer", f"RuntimeError: {identity.endpoint} was gone")
    assert not identity.entry_path.exists()  # released: unpublished
    assert (f"warning: {identity.endpoint.parent} was gone; made it again (0700)"
            in capfd.readouterr().err)
    start(identity).ready()
    assert ping(identity.endpoint)["type"] == "pong"


# -- responses (W15) ----------------------------------------------------------


def test_send_response_reaches_the_asker(identity: PeerIdentity) -> None:  # W15
    asker = Asker(identity.coms_dir / "asker.sock")
    try:
        rig = start(identity)
        rig.respond(asker.endpoint, {"selections": ["Yes"]}, owner="question:q:1")
        assert asker.got.wait(5)
        raw = asker.lines[0]
        assert raw.endswith(b"\n") and raw.count(b"\n") == 1
        body = json.loads(raw)
        assert ISO.fullmatch(body.pop("timestamp"))
        assert body == {
            "type": "response",
            "msg_id": QID,
            "sender_session": identity.session_id,
            "sender_endpoint": str(identity.endpoint),
            "hops": 0,
            "response": {"selections": ["Yes"]},
            "error": None,
        }
        # restart safety: the outbox is cleared once the asker took it
        wait_for(lambda: rig.store.settled, what="settled after the ack")
        assert rig.store.settled == [(QID, "question:q:1")]
    finally:
        asker.close()


def test_a_peer_that_starts_sends_every_response_owed_once(identity: PeerIdentity) -> None:
    # promise 1: a restart is a start; the responses owed (by the last run, or told to a
    # Peer that crashed) are sent from the outbox; one told again while it is in flight,
    # or after the asker took it, is not sent twice
    gate = threading.Event()
    asker = Asker(identity.coms_dir / "asker.sock", gate=gate)
    owed = [SendResponse(prompt_envelope(qid, sender_endpoint=asker.endpoint), {"n": n},
                         None, f"question:{qid}:1")
            for n, qid in enumerate(("01HZY3K4M5N6P7Q8R9S0T1V2WA", "01HZY3K4M5N6P7Q8R9S0T1V2WB"))]
    store = Settles(owed=owed)
    try:
        rig = start(identity, store=store)
        wait_for(lambda: asker.open_now == 2, what="both in flight")
        rig.ref.tell(owed[0])  # told again meanwhile (its question's close, say)
        rig.sync()
        gate.set()
        wait_for(lambda: len(store.settled) == 2, what="both settled")
        rig.ref.tell(owed[1])  # told again after the asker took it
        rig.sync()
        rig.ref.stop()
        again = start(identity, store=store)  # restarted: nothing owed any more
        again.sync()
        edge_caught_up()
        assert sorted(json.loads(line)["response"]["n"] for line in asker.lines) == [0, 1]
        assert asker.connections == 2
    finally:
        asker.close()


def test_a_response_owed_at_start_carries_its_error(identity: PeerIdentity) -> None:
    # W15, promise 1: what the outbox holds is sent as it was owed, its error too
    asker = Asker(identity.coms_dir / "asker.sock")
    owed = SendResponse(prompt_envelope(sender_endpoint=asker.endpoint), None,
                        "no remote answer within 5ms", "question:q:1")
    try:
        start(identity, store=Settles(owed=[owed]))
        assert asker.got.wait(5)
        body = json.loads(asker.lines[0])
        assert (body["response"], body["error"]) == (None, "no remote answer within 5ms")
    finally:
        asker.close()


def test_send_response_carries_an_error(identity: PeerIdentity) -> None:  # W15
    asker = Asker(identity.coms_dir / "asker.sock", lambda _: b'{"type":"ack","msg_id":""}\n')
    try:
        start(identity).respond(asker.endpoint, None, "no remote answer within 5ms")
        assert asker.got.wait(5)
        body = json.loads(asker.lines[0])
        assert (body["response"], body["error"]) == (None, "no remote answer within 5ms")
    finally:
        asker.close()


def test_a_dead_asker_is_said_logged_and_settled_at_once_not_fatal(
    identity: PeerIdentity, capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # W15: refused is final, no retry after the 30 s pause
    monkeypatch.setattr(peer_module, "RETRY_PAUSES_S", (30.0, 30.0))
    rig = start(identity).ready()
    rig.respond(identity.coms_dir / "gone.sock", "yes", owner="q2")
    record = rig.logger.expect(LogEvent).record  # the question stays closed
    assert (record.qid, record.event) == (QID, "response_failed")
    assert isinstance(record.detail, dict)
    reason = record.detail["error"]
    assert reason
    assert said(capfd) == (
        f"coms-hermes-bridge: error: could not deliver response for {QID}: {reason}\n")
    wait_for(lambda: rig.store.settled, timeout=3, what="settled after a refusal")
    assert rig.store.settled == [(QID, "q2")]
    assert ping(identity.endpoint)["type"] == "pong"
    rig.sync()  # alive, and had it crashed its ChildFailed would be told by now
    rig.supervisor.assert_nothing()


def test_response_nacked_by_the_asker_is_reported(
    identity: PeerIdentity, capfd: pytest.CaptureFixture[str]
) -> None:  # W15
    asker = Asker(identity.coms_dir / "asker.sock", lambda _: b'{"type":"nack","msg_id":"","error":"who?"}\n')
    try:
        start(identity).respond(asker.endpoint, "yes")
        seen: list[str] = []

        def reported() -> bool:
            seen.append(capfd.readouterr().err)
            return "who?" in "".join(seen)

        wait_for(reported, what="nack report")
        assert "".join(seen).count("\n") == 1
    finally:
        asker.close()


def test_response_to_a_silent_asker_times_out(
    identity: PeerIdentity, capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # W15
    # a timeout may pass: retried, then given up, reported and settled once
    asker = Asker(identity.coms_dir / "asker.sock", lambda _: None)
    try:
        rig = start(identity)
        monkeypatch.setattr(peer_module, "RESPONSE_TIMEOUT_S", 0.1)  # fixed bounds, shortened
        monkeypatch.setattr(peer_module, "RETRY_PAUSES_S", (0.05, 0.05))
        started = time.monotonic()
        rig.respond(asker.endpoint, "yes", owner="question:q:1")
        seen: list[str] = []

        def reported() -> bool:
            seen.append(capfd.readouterr().err)
            return "timed out" in "".join(seen)

        wait_for(reported, what="timeout report")
        assert time.monotonic() - started >= 0.3  # three tries of 0.1 s each
        wait_for(lambda: rig.store.settled, what="settled")
        assert rig.store.settled == [(QID, "question:q:1")]
    finally:
        asker.close()


def test_a_response_for_a_msg_id_that_is_no_qid_is_logged_without_one(
    identity: PeerIdentity, capfd: pytest.CaptureFixture[str]
) -> None:
    rig = start(identity)
    gone = str(identity.coms_dir / "gone.sock")
    prompt = prompt_envelope(sender_endpoint=gone).model_copy(update={"msg_id": "m-1"})
    rig.ref.tell(SendResponse(prompt, "yes"))
    record = rig.logger.expect(LogEvent).record
    assert (record.qid, record.event) == ("0" * 26, "response_failed")  # the log's no-qid
    rig.sync()
    assert capfd.readouterr().err.startswith(
        "coms-hermes-bridge: error: could not deliver response for m-1: ")


def test_askers_sharing_a_msg_id_that_is_no_qid_each_get_their_response(
    identity: PeerIdentity,
) -> None:  # C3: each asker of a prompt whose msg_id is no qid gets an error response
    gate = threading.Event()
    slow = Asker(identity.coms_dir / "slow.sock", gate=gate)
    other = Asker(identity.coms_dir / "other.sock")
    try:
        rig = start(identity).ready()
        for asker in (slow, other):
            prompt = prompt_envelope(sender_endpoint=asker.endpoint).model_copy(
                update={"msg_id": "m-1"})
            rig.ref.tell(SendResponse(prompt, None, "not a qid"))
            if asker is slow:
                wait_for(lambda: slow.open_now == 1, what="the first in flight")
        assert other.got.wait(5), "the second asker got no response"
        gate.set()
        assert slow.got.wait(5)
        assert [json.loads(a.lines[0])["error"] for a in (slow, other)] == ["not a qid"] * 2
    finally:
        gate.set()
        slow.close()
        other.close()


def test_a_response_the_full_pool_refuses_stays_owed_and_is_said(
    identity: PeerIdentity, capfd: pytest.CaptureFixture[str]
) -> None:
    rig = start(identity, responses=ResponsePool(capacity=0))
    rig.respond("/tmp/none.sock", "yes", owner="q")
    rig.sync()
    assert rig.store.settled == []  # owed: sent again at the next start
    assert capfd.readouterr().err == (
        f"coms-hermes-bridge: error: response for {QID} not sent now: 0 responses are already"
        " being sent (the limit); it stays owed in the state database and is sent at the next"
        " start\n")


def test_a_settle_that_fails_is_said(
    identity: PeerIdentity, capfd: pytest.CaptureFixture[str]
) -> None:
    # the state file's edge: a store shut under it (the daemon ending) says so, once
    rig = start(identity, store=Settles(fails=sqlite3.ProgrammingError("store shut")))
    rig.respond(identity.coms_dir / "gone.sock", "yes")
    seen: list[str] = []

    def said_it() -> bool:
        seen.append(capfd.readouterr().err)
        return "".join(seen).endswith(
            f"coms-hermes-bridge: could not record the response for {QID} as sent:"
            " ProgrammingError('store shut')\n")

    wait_for(said_it, what="the failed settle said")


# -- supervision --------------------------------------------------------------


def test_crash_then_restart_serves_the_same_endpoint(identity: PeerIdentity) -> None:
    rig = start(identity).ready()
    rig.ref.tell(object())
    failed = rig.supervisor.expect(ChildFailed)
    assert failed.child == "peer" and failed.error.startswith("UnknownMessage: peer does not take object: ")
    assert not identity.endpoint.exists()  # released: the successor can bind
    start(identity).ready()
    assert ping(identity.endpoint)["agent_card"]["name"] == "user-remote"
    entry = read_entry(identity.entry_path)
    assert entry is not None and entry.session_id == identity.session_id


def test_endpoint_owned_by_someone_else_fails_the_start(
    identity: PeerIdentity, capfd: pytest.CaptureFixture[str]
) -> None:  # W11
    owner = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    owner.bind(str(identity.endpoint))
    owner.listen(1)
    try:
        rig = start(identity)
        failed = rig.supervisor.expect(ChildFailed)
        assert f"endpoint already in use ({identity.endpoint})" in failed.error
        assert identity.endpoint.exists()  # not ours to remove
        assert not identity.entry_path.exists()
        assert "peer release" not in capfd.readouterr().err  # undone cleanly, half begun
    finally:
        owner.close()


# -- identity and names (W1-W3, W9, W10) --------------------------------------


def test_identity_places(coms_dir: Path) -> None:  # W1, W2, W3
    root = coms_dir / "coms"
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    ident = resolve_identity(root, "proj.x", "user-remote", cwd="/c", pid=42, now=now)
    assert (root.stat().st_mode & 0o777) == 0o700
    assert (root / "projects" / "proj.x" / "agents").is_dir()
    assert ident.endpoint == root / "sockets" / f"{ident.session_id}.sock"
    assert re.fullmatch(r"[0-9A-HJKMNP-TV-Z]{26}", ident.session_id)
    assert (ident.name, ident.cwd, ident.pid, ident.started_at) == (
        "user-remote",
        "/c",
        42,
        "2026-11-30T12:00:00.000Z",
    )
    again = resolve_identity(root, "proj.x", "user-remote", cwd="/c", pid=42, now=now)
    assert again.session_id != ident.session_id


def test_the_pools_shared_directories_are_left_as_found(
    coms_dir: Path, capfd: pytest.CaptureFixture[str]
) -> None:  # W1: the pool's places are its other peers' too; only the root is made 0700
    shared = [coms_dir / "projects" / "default" / "agents", coms_dir / "sockets"]
    for directory in shared:
        directory.mkdir(parents=True)
        directory.chmod(0o755)
    resolve_identity(coms_dir, "default", "user-remote", cwd="/", pid=1, now=datetime.now(UTC))
    assert [d.stat().st_mode & 0o777 for d in shared] == [0o755, 0o755]
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize("project", ["", ".", "a/b", "a\\b", "a..b", "..", "-a", ".hidden", "a b"])
def test_invalid_project_is_refused(project: str) -> None:  # W2
    with pytest.raises(IdentityError) as caught:
        validate_project(project)
    assert str(caught.value) == f'invalid project name: "{project}"'


@pytest.mark.parametrize("name", ["", "projects", "a.b", "-a", "a/b", "x" * 65, "user-remote\n"])
def test_invalid_name_is_refused(name: str) -> None:  # W2
    with pytest.raises(IdentityError) as caught:
        validate_name(name)
    assert str(caught.value) == f'invalid name: "{name}"'


@pytest.mark.parametrize("project", ["default", "A", "my-proj_1.2"])
def test_valid_projects(coms_dir: Path, project: str) -> None:  # W2
    resolve_identity(coms_dir, project, "x" * 64, cwd="/", pid=1, now=datetime.now(UTC))


def dead_pid() -> int:
    child = subprocess.Popen(["sleep", "60"])
    child.send_signal(signal.SIGKILL)
    child.wait()
    return child.pid


def plant(coms_dir: Path, name: str, *, pid: int, endpoint: str, heartbeat_at: str | None,
          file: str | None = None) -> Path:
    """An entry holding `name`, in `<file>.json` (by default `<name>.json`)."""
    agents = coms_dir / "projects" / "default" / "agents"
    agents.mkdir(parents=True, exist_ok=True)
    path = agents / f"{file or name}.json"
    entry = RegistryEntry(
        session_id="01OLDSESSION0000000000000", name=name, pid=pid, endpoint=endpoint,
        heartbeat_at=heartbeat_at,
    )
    write_entry(path, entry)
    return path


def test_crashed_holder_is_taken_over_despite_fresh_heartbeat(coms_dir: Path) -> None:  # W9, W10
    now = datetime.now(UTC)
    stale = plant(
        coms_dir, "user-remote", pid=dead_pid(),
        endpoint=str(coms_dir / "sockets" / "old.sock"), heartbeat_at=iso(now),
    )
    ident = resolve_identity(coms_dir, "default", "user-remote", cwd="/", pid=1, now=now)
    assert ident.name == "user-remote"
    assert not stale.exists()


def test_live_holder_keeps_the_name(coms_dir: Path) -> None:  # W10
    now = datetime.now(UTC)
    holder = subprocess.Popen(["sleep", "60"])
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    endpoint = coms_dir / "held.sock"
    listening.bind(str(endpoint))
    listening.listen(1)
    try:
        held = plant(coms_dir, "user-remote", pid=holder.pid, endpoint=str(endpoint),
                     heartbeat_at=iso(now))
        ident = resolve_identity(coms_dir, "default", "user-remote", cwd="/", pid=1, now=now)
        assert ident.name == "user-remote2"
        assert held.exists()
    finally:
        listening.close()
        holder.kill()
        holder.wait()


def test_next_free_suffix_is_taken(coms_dir: Path) -> None:  # W10
    now = datetime.now(UTC)
    for name in ("user-remote", "user-remote2"):
        plant(coms_dir, name, pid=os.getpid(), endpoint="", heartbeat_at=None)
    ident = resolve_identity(coms_dir, "default", "user-remote", cwd="/", pid=1, now=now)
    assert ident.name == "user-remote3"


def test_dead_and_silent_entries_are_pruned(coms_dir: Path) -> None:  # W9
    now = datetime.now(UTC)
    old = plant(coms_dir, "other", pid=dead_pid(), endpoint="",
                heartbeat_at=iso(now - timedelta(seconds=91)))
    junk = coms_dir / "projects" / "default" / "agents" / "junk.json"
    junk.write_text("{not json")
    resolve_identity(coms_dir, "default", "user-remote", cwd="/", pid=1, now=now)
    assert not old.exists()
    assert junk.exists()  # unparseable: skipped, not ours to judge


def test_no_file_among_the_entries_can_stall_or_flood_the_claim(coms_dir: Path) -> None:  # W9
    """A FIFO (whose open waits for a writer), a device behind a link (endless bytes) and
    a file past ENTRY_LIMIT are no entries: each is skipped at once, read at most to the
    limit, and the live entry beside them still holds its name."""
    now = datetime.now(UTC)
    held = plant(coms_dir, "user-remote", pid=os.getpid(), endpoint="", heartbeat_at=iso(now))
    agents = held.parent
    os.mkfifo(agents / "fifo.json")
    os.symlink("/dev/zero", agents / "zero.json")
    base = held.read_text()

    def padded(size: int) -> str:  # a valid entry of exactly `size` bytes
        pad = "x" * (size - len(base) - len('"pad": "", '))
        return base.replace('"name":', f'"pad": "{pad}", "name":', 1)

    (agents / "huge.json").write_text(padded(ENTRY_LIMIT + 1))
    (agents / "padded.json").write_text(padded(ENTRY_LIMIT))  # at the limit: an entry
    assert read_entry(agents / "padded.json") is not None
    (agents / "padded.json").unlink()
    for name in ("fifo", "zero", "huge"):
        assert read_entry(agents / f"{name}.json") is None, name
    assert read_entry(held) is not None
    claimed: list[str] = []
    claim = threading.Thread(target=lambda: claimed.append(resolve_identity(
        coms_dir, "default", "user-remote", cwd="/", pid=1, now=now).name), daemon=True)
    claim.start()
    claim.join(timeout=10)
    if claim.is_alive():  # let the stalled open go, so the test run can end
        with open(agents / "fifo.json", "wb"):
            pass
        pytest.fail("claiming a name waited on a FIFO among the entries")
    assert claimed == ["user-remote2"]
    assert {p.name for p in agents.iterdir()} == {"user-remote.json", "fifo.json", "zero.json",
                                                   "huge.json"}  # not ours to judge


def test_a_fifo_holding_a_whole_entry_is_no_entry(coms_dir: Path) -> None:  # W9
    """Only a regular file is an entry: a FIFO's bytes are never read, even when a writer
    has put a whole entry in it and holds it open (a read past them would fail)."""
    held = plant(coms_dir, "other", pid=os.getpid(), endpoint="", heartbeat_at=None)
    fifo = held.with_name("fifo.json")
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # both ends: open without waiting
    try:
        os.write(writer, held.read_bytes())
        assert read_entry(fifo) is None
    finally:
        os.close(writer)


def entry(pid: int, endpoint: str = "", heartbeat_at: str | None = None) -> RegistryEntry:
    return RegistryEntry(session_id="s", name="n", pid=pid, endpoint=endpoint,
                         heartbeat_at=heartbeat_at)


def test_liveness_rules(coms_dir: Path) -> None:  # W9
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    fresh, old = iso(now - timedelta(seconds=90)), iso(now - timedelta(seconds=91))
    gone = dead_pid()
    assert is_live(entry(os.getpid()), now)  # pid exists
    assert is_live(entry(1), now)  # pid 1: exists (EPERM counts as alive)
    assert is_live(entry(os.getpid(), heartbeat_at=old), now)  # pid exists, heartbeat old
    assert is_live(entry(gone, heartbeat_at=fresh), now)  # fresh heartbeat, pid unseen
    assert not is_live(entry(gone, heartbeat_at=old), now)
    assert is_live(entry(0, heartbeat_at=fresh), now)  # no pid: the heartbeat decides
    assert not is_live(entry(0, heartbeat_at=old), now)


def test_a_pid_no_process_can_have_is_judged_by_the_heartbeat_not_raised(
    coms_dir: Path,
) -> None:  # W9: another peer's entry may carry any integer; the start must not crash on it
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    huge = 2**40  # past what kill(2) takes
    assert pid_alive(huge) is None  # no usable pid, as 0 or a negative one
    assert is_live(entry(huge, heartbeat_at=iso(now)), now)
    assert not is_live(entry(huge, heartbeat_at=iso(now - timedelta(seconds=91))), now)
    old = plant(coms_dir, "other", pid=huge, endpoint="",
                heartbeat_at=iso(now - timedelta(seconds=91)))
    ident = resolve_identity(coms_dir, "default", "other", cwd="/", pid=1, now=now)
    assert ident.name == "other"
    assert not old.exists()  # silent, and no pid to say otherwise: pruned


def test_crashed_holder_rule(coms_dir: Path) -> None:  # W10
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    fresh = iso(now)
    gone = dead_pid()
    assert crashed_holder(entry(gone, heartbeat_at=fresh))  # dead pid, no socket
    assert not crashed_holder(entry(os.getpid(), heartbeat_at=fresh))
    assert not crashed_holder(entry(0, heartbeat_at=fresh))  # no pid: cannot tell
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = coms_dir / "l.sock"
    listening.bind(str(path))
    listening.listen(1)
    try:
        assert not crashed_holder(entry(gone, str(path), fresh))  # socket still answers
    finally:
        listening.close()


def test_other_peers_with_fresh_heartbeat_are_kept(coms_dir: Path) -> None:  # W9
    now = datetime.now(UTC)
    # e.g. a peer in another pid namespace: its pid is not visible here
    other = plant(coms_dir, "builder", pid=dead_pid(), endpoint="", heartbeat_at=iso(now))
    unseen = plant(coms_dir, "reviewer", pid=dead_pid(), endpoint="",
                   heartbeat_at=iso(now - timedelta(seconds=89)))
    ident = resolve_identity(coms_dir, "default", "user-remote", cwd="/", pid=1, now=now)
    assert ident.name == "user-remote"
    assert other.exists()
    assert unseen.exists()


def test_crashed_suffixed_holder_is_taken_over(coms_dir: Path) -> None:  # W10
    now = datetime.now(UTC)
    plant(coms_dir, "user-remote", pid=os.getpid(), endpoint="", heartbeat_at=iso(now))
    stale = plant(coms_dir, "user-remote2", pid=dead_pid(), endpoint="", heartbeat_at=iso(now))
    other = plant(coms_dir, "user-remoteX", pid=dead_pid(), endpoint="", heartbeat_at=iso(now))
    ident = resolve_identity(coms_dir, "default", "user-remote", cwd="/", pid=1, now=now)
    assert ident.name == "user-remote2"
    assert not stale.exists()
    assert other.exists()  # not a name we claim: W9 alone decides, and it is fresh


def test_heartbeat_freshness_window() -> None:  # W9
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    assert heartbeat_fresh(iso(now), now)
    assert heartbeat_fresh(iso(now - timedelta(seconds=90)), now)
    assert not heartbeat_fresh(iso(now - timedelta(seconds=90, milliseconds=1)), now)
    assert heartbeat_fresh(iso(now + timedelta(seconds=5)), now)
    assert not heartbeat_fresh(iso(now + timedelta(seconds=5, milliseconds=1)), now)
    assert not heartbeat_fresh(None, now)
    assert not heartbeat_fresh("yesterday", now)


def test_a_heartbeat_without_a_zone_is_utc_and_one_with_a_zone_keeps_it() -> None:  # W9
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    assert heartbeat_fresh("2026-11-30T11:58:30", now)  # 90 s old, read as UTC
    assert not heartbeat_fresh("2026-11-30T11:58:29", now)
    assert heartbeat_fresh("2026-11-30T13:00:00+01:00", now)  # 12:00 UTC
    assert not heartbeat_fresh("2026-11-30T12:00:00-01:00", now)  # 13:00 UTC: an hour ahead


def test_the_heartbeat_window_does_not_depend_on_the_local_zone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # W9
    monkeypatch.setenv("TZ", "WST5")  # POSIX form, no zone files needed: five hours west of UTC
    time.tzset()
    try:
        # the first minute of year 1 in UTC: in local time it would fall before year 1
        assert heartbeat_fresh("0001-01-01T00:00:00.000Z", datetime(1, 1, 1, 0, 0, 30, tzinfo=UTC))
    finally:
        monkeypatch.undo()
        time.tzset()


def _every_signal_default() -> None:
    for number in signal.valid_signals():  # (a run under nohup would ignore SIGHUP)
        with contextlib.suppress(OSError, ValueError):
            signal.signal(number, signal.SIG_DFL)


def test_asking_whether_a_pid_lives_sends_it_no_signal() -> None:  # W9: kill(pid, 0)
    # the child dies of any signal it gets, whatever this process ignores
    child = subprocess.Popen(["sleep", "60"], preexec_fn=_every_signal_default)
    try:
        assert pid_alive(child.pid) is True
    finally:
        child.terminate()
    # a process that has received a fatal signal dies of that first one: ours, not another
    assert child.wait() == -signal.SIGTERM


NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="becoming another user takes root")


def as_nobody(work: Callable[[], object]) -> str:
    """`work` in a forked child that has become another user: how a root test meets a
    process or directory not its own."""

    def dropped() -> object:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        return work()

    return in_forked_child(dropped)


@needs_root
def test_a_pid_of_another_user_is_alive() -> None:  # W9: EPERM is not ESRCH
    me = os.getpid()
    assert pid_alive(me) is True  # (here too: mutation testing runs a test for a mutant
    assert as_nobody(lambda: pid_alive(me)) == "True"  # only if it saw the test call it)


@needs_root
def test_a_root_made_by_another_user_is_used_as_it_is(coms_dir: Path) -> None:  # W1: 0700 where possible
    coms_dir.chmod(0o777)
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    own = coms_dir / "own"  # ours, made here too (mutation testing runs a test for a
    resolve_identity(own, "default", "user-remote", cwd="/", pid=1, now=now)  # mutant only
    assert stat.S_IMODE(own.stat().st_mode) == 0o700  # if it saw the test call the code)
    name = as_nobody(
        lambda: resolve_identity(coms_dir, "default", "user-remote", cwd="/", pid=1, now=now).name
    )
    assert name == "'user-remote'"
    assert stat.S_IMODE(coms_dir.stat().st_mode) == 0o777
    assert (coms_dir / "sockets").is_dir()
    assert (coms_dir / "projects" / "default" / "agents").is_dir()


def test_a_root_whose_parents_are_missing_is_made_with_them(coms_dir: Path) -> None:  # W1
    root = coms_dir / "home" / ".pi" / "coms"  # ~/.pi/coms on a machine with no ~/.pi yet
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    ident = resolve_identity(root, "default", "user-remote", cwd="/", pid=1, now=now)
    assert ident.endpoint == root / "sockets" / f"{ident.session_id}.sock"
    assert (root / "sockets").is_dir() and (root / "projects" / "default" / "agents").is_dir()
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


def test_only_crashed_holders_of_the_claimed_name_are_taken_over(coms_dir: Path) -> None:  # W9, W10
    now = datetime.now(UTC)
    gone = dead_pid()
    # each a crashed holder (pid gone, no socket) with a fresh heartbeat: (file, name inside)
    for file, name in [
        ("user-remote", "user-remote"),
        ("user-remote2", "user-remote2"),
        ("user-remote02", "user-remote02"),  # W10's suffixes are 2, 3, ...: not "02"
        ("builder", "user-remote"),  # the name is ours to claim, the file is not
        ("user-remote3", "builder"),  # the file is, the name is not
    ]:
        plant(coms_dir, name, pid=gone, endpoint="", heartbeat_at=iso(now), file=file)
    agents = coms_dir / "projects" / "default" / "agents"
    # a live entry holds both its file's name and the name inside it
    assert live_names(agents, now, "user-remote") == {
        "user-remote02", "builder", "user-remote", "user-remote3"
    }
    assert sorted(path.name for path in agents.iterdir()) == [
        "builder.json", "user-remote02.json", "user-remote3.json"
    ]


@contextlib.contextmanager
def vanishing(path: Path, entry: RegistryEntry, monkeypatch: pytest.MonkeyPatch
              ) -> Iterator[None]:
    """`path` gives `entry` to one reader and is gone right after that read: another run
    that pruned or released the same file between our read and our unlink."""
    write_entry(path, entry)
    reads: list[Path] = []
    real = registry.read_regular

    def read_then_vanish(read: Path, limit: int) -> bytes | None:
        data = real(read, limit)
        if read == path:
            reads.append(read)
            path.unlink()
        return data

    monkeypatch.setattr(registry, "read_regular", read_then_vanish)
    yield
    assert reads == [path], "nobody read the entry"


def test_an_entry_pruned_meanwhile_by_another_run_is_no_error(  # W9
        coms_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dead = RegistryEntry(session_id="s", name="other", pid=dead_pid(), endpoint="")
    with vanishing(coms_dir / "other.json", dead, monkeypatch):
        assert live_names(coms_dir, datetime.now(UTC), "user-remote") == set()
    assert list(coms_dir.iterdir()) == []


def test_an_entry_removed_meanwhile_by_another_hand_is_not_ours_removed(  # W8
        coms_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = coms_dir / "user-remote.json"
    ours = RegistryEntry(session_id="01OURS", name="user-remote", pid=os.getpid(), endpoint="")
    with vanishing(path, ours, monkeypatch):
        assert remove_entry_if_ours(path, "01OURS") is False
    assert not path.exists()


def test_a_probe_of_a_socket_with_a_full_backlog_gives_up(coms_dir: Path) -> None:  # W11
    path = str(coms_dir / "full.sock")
    answers: list[bool] = []
    probe = threading.Thread(target=lambda: answers.append(endpoint_accepts(path)), daemon=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listening, \
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as queued:
        listening.bind(path)
        listening.listen(0)  # one connection waits for an accept; the next finds no room
        queued.connect(path)
        probe.start()
        probe.join(timeout=5)
        assert answers == [False]  # timed out: stale, not a wait for ever
    probe.join(timeout=5)  # a probe that waited is let go when the listener closes


def test_the_daemon_unpublishes_what_a_stopped_peer_left(
    identity: PeerIdentity, capfd: pytest.CaptureFixture[str],
) -> None:
    # W8 at exit even when the Peer's stop came too late to run its release
    rig = start(identity).ready()
    entry = read_entry(identity.entry_path)
    assert entry is not None
    rig.ref.stop()
    # as a Peer that never got to release would leave them: its entry and its socket
    write_entry(identity.entry_path, entry)
    left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    left.bind(str(identity.endpoint))
    left.close()
    assert unpublish_if_left(identity)
    assert not identity.entry_path.exists() and not identity.endpoint.exists()
    assert not unpublish_if_left(identity)  # nothing left: nothing done

    # another run's entry is not ours to remove, nor its socket
    write_entry(identity.entry_path, entry.model_copy(update={"session_id": "someone-else"}))
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(str(identity.endpoint))
    other.close()
    assert not unpublish_if_left(identity)
    assert identity.entry_path.exists() and identity.endpoint.exists()

    # our entry over something that is not a socket: the entry goes, the file stays
    write_entry(identity.entry_path, entry)
    identity.endpoint.unlink()
    identity.endpoint.write_text("not a socket")
    assert unpublish_if_left(identity)
    assert not identity.entry_path.exists() and identity.endpoint.read_text() == "not a socket"

    # our entry with no endpoint at all: the entry goes, and nothing is said
    write_entry(identity.entry_path, entry)
    identity.endpoint.unlink()
    capfd.readouterr()
    assert unpublish_if_left(identity)
    assert not identity.entry_path.exists()
    assert capfd.readouterr().err == ""
