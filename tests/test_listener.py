"""The coms listener's limits over real unix sockets (W12)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pykka
import pytest

from coms_hermes_bridge.actors import peer as peer_module
from coms_hermes_bridge.actors.edge import Edge
from coms_hermes_bridge.actors.peer import (
    BUSY,
    MAX_LINE,
    Listener,
    PeerActor,
    ResponsePool,
    bind_endpoint,
)
from coms_hermes_bridge.actors.registry import PeerIdentity, read_entry, resolve_identity
from coms_hermes_bridge.messages.commands import (
    ChildFailed,
    NewQuestion,
    QueueDepthQuery,
    SendResponse,
)
from coms_hermes_bridge.messages.wire import AgentCard, PromptEnvelope
from tests.fakes import FakeRef, handled, prompt_envelope, said, wait_for

QID = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
PING = b'{"type":"ping","msg_id":"p"}\n'


def card(depth: int | None) -> AgentCard:
    return AgentCard(name="user-remote", purpose="p", model="m", color="c",
                     context_used_pct=0, queue_depth=depth or 0)


def exchange(path: Path, data: bytes, timeout: float = 5.0) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(str(path))
        conn.sendall(data)
        reply = b""
        while chunk := conn.recv(4096):
            reply += chunk
        return reply


def connect(path: Path) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(5)
    conn.connect(str(path))
    return conn


class Served:
    def __init__(self, tmp: Path, server: socket.socket | None = None, **limits: Any) -> None:
        self.path = tmp / "l.sock"
        self.questions = FakeRef("questions")
        self.admit = limits.pop("admit", None)
        self.listener = Listener(server or bind_endpoint(self.path), self.questions, card,
                                 self.admit, lambda reply: reply(0), **limits)
        self.listener.start()

    def stop(self) -> None:
        self.listener.stop()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    path = Path(f"/tmp/chl{os.getpid()}-{time.monotonic_ns()}")
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_past_the_connection_cap_a_client_is_refused_at_once(
    short_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:  # 9.1
    served = Served(short_tmp, max_connections=3)
    try:
        silent = [connect(served.path) for _ in range(3)]
        wait_for(lambda: served.listener.open_connections == 3, what="three connections")
        began = time.monotonic()
        with connect(served.path) as refused:
            reply = b""
            while chunk := refused.recv(4096):  # closed at once: EOF follows the nack
                reply += chunk
        assert reply == f'{{"type":"nack","msg_id":"","error":"{BUSY}"}}\n'.encode()
        assert time.monotonic() - began < 1.0
        silent.pop().close()
        wait_for(lambda: served.listener.open_connections == 2, what="one closed")
        assert json.loads(exchange(served.path, PING))["type"] == "pong"
        assert capfd.readouterr().err == (  # said when it began, and when it ended
            "coms-hermes-bridge: warning: 3 coms connections open; refusing more until some"
            " close\n"
            "coms-hermes-bridge: warning: refused 1 coms connection(s) while 3 were open\n")
        for conn in silent:
            conn.close()
    finally:
        served.stop()


def test_the_deadline_is_for_the_whole_line_not_each_recv(short_tmp: Path) -> None:  # 9.1, W12
    served = Served(short_tmp, line_deadline_s=0.5)
    try:
        conn = connect(served.path)
        began = time.monotonic()
        closed_after: float | None = None
        for _ in range(30):  # one byte every 0.1 s, never a newline: a trickler
            try:
                conn.sendall(b" ")
                conn.settimeout(0.1)
                if conn.recv(16) == b"":
                    closed_after = time.monotonic() - began
                    break
            except TimeoutError:
                continue
            except OSError:
                closed_after = time.monotonic() - began
                break
        conn.close()
        assert closed_after is not None and 0.4 <= closed_after < 1.5, closed_after
        wait_for(lambda: served.listener.open_connections == 0, what="the trickler dropped")
        assert json.loads(exchange(served.path, PING))["type"] == "pong"
    finally:
        served.stop()


def test_waiting_clients_and_admissions_take_no_threads(short_tmp: Path) -> None:
    # 9.1, 14.3: many open connections and admissions pending, not one thread for them
    pending: list[Any] = []
    lock = threading.Lock()

    def slow_admit(envelope: PromptEnvelope, reply: Any) -> None:
        with lock:
            pending.append(reply)  # answered later, from the test's own thread

    warm = Served(short_tmp, max_connections=40, admit=slow_admit)  # the edge, warm
    warm.stop()
    before = set(threading.enumerate())
    served = Served(short_tmp, max_connections=40, admit=slow_admit)
    try:
        waiting = [connect(served.path) for _ in range(30)]
        replies: dict[str, bytes] = {}

        def ask(n: int) -> None:
            msg_id = f"01ARZ3NDEKTSV4RRFFQ69G{n:04d}"
            replies[msg_id] = exchange(served.path, prompt_envelope(msg_id).to_line())

        askers = [threading.Thread(target=ask, args=(n,)) for n in range(4)]
        for thread in askers:
            thread.start()
        wait_for(lambda: served.listener.open_connections == 34, what="all connected")
        wait_for(lambda: len(pending) == 4, what="four admissions pending")
        assert set(threading.enumerate()) - before == set(askers)  # none of ours
        for reply in pending:
            reply(None)
        for thread in askers:
            thread.join(10)
        assert sorted(replies) == [f"01ARZ3NDEKTSV4RRFFQ69G{n:04d}" for n in range(4)]
        assert all(json.loads(r)["type"] == "ack" for r in replies.values())
        for conn in waiting:
            conn.close()
    finally:
        served.stop()


class ShortOfDescriptors(socket.socket):
    """A listening socket whose accept() fails with EMFILE the first `fails` times."""

    fails = 3
    calls = 0

    def accept(self) -> tuple[socket.socket, Any]:
        ShortOfDescriptors.calls += 1
        if ShortOfDescriptors.calls <= self.fails:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return super().accept()


def test_accept_out_of_descriptors_is_retried_not_fatal(
    short_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # 9.1
    path = short_tmp / "l.sock"
    ShortOfDescriptors.calls = 0  # the count is per class: start afresh if run again in-process
    server = ShortOfDescriptors(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    served = Served(short_tmp, server=server)
    try:
        assert json.loads(exchange(path, PING))["type"] == "pong"
        assert ShortOfDescriptors.calls > ShortOfDescriptors.fails
        assert capsys.readouterr().err == (
            "coms-hermes-bridge: warning: cannot accept a coms connection: Too many open files;"
            " retrying every 0.1s\n"
            "coms-hermes-bridge: info: accepting coms connections again\n")
    finally:
        served.stop()


def test_a_pause_for_descriptors_is_still_serving(short_tmp: Path) -> None:
    # the Peer's heartbeat fails the Peer when its listener is not serving: a pause in
    # accepting (out of descriptors) must not read as that, or a shortage restarts it
    path = short_tmp / "l.sock"
    ShortOfDescriptors.calls = 0
    server = ShortOfDescriptors(socket.AF_UNIX, socket.SOCK_STREAM)
    server.fails = 10**9  # short for as long as the test likes
    server.bind(str(path))
    server.listen(8)
    served = Served(short_tmp, server=server)
    try:
        waiting = connect(path)  # sits in the backlog while accept() fails
        wait_for(lambda: ShortOfDescriptors.calls >= 2, what="accept retried after a pause")
        assert served.listener.serving
        server.fails = 0
        waiting.sendall(PING)
        assert json.loads(read_reply(waiting))["type"] == "pong"
        waiting.close()
    finally:
        served.stop()


def read_reply(conn: socket.socket) -> bytes:
    reply = b""
    while chunk := conn.recv(4096):
        reply += chunk
    return reply


# The response pool itself is tested over real sockets in tests/test_responses.py.


@pytest.fixture
def identity(coms_dir: Path) -> PeerIdentity:
    return resolve_identity(
        coms_dir, "default", "user-remote", cwd="/w", pid=os.getpid(), now=datetime.now(UTC)
    )


def test_a_full_response_pool_is_a_logged_refusal_and_stays_owed(
    identity: PeerIdentity, capsys: pytest.CaptureFixture[str]
) -> None:  # 9.1: never a silent drop; the outbox keeps it
    pool = ResponsePool(capacity=0)
    settled: list[str] = []
    ref = PeerActor.start(
        supervisor=FakeRef(), identity=identity, questions=FakeRef(),
        depth=lambda reply: reply(0), settle=lambda qid, owner: settled.append(qid),
        responses=pool,
    )
    envelope = prompt_envelope(QID)
    ref.ask(SendResponse(envelope, {"kind": "freeform", "text": "yes"}, None, "q"), timeout=5)
    err = capsys.readouterr().err
    assert (f"response for {QID} not sent now: 0 responses are already being sent (the "
            "limit); it stays owed in the state database and is sent at the next start") in err
    assert settled == []
    ref.stop()


def test_heartbeat_heals_deleted_registry_and_sockets_dirs(identity: PeerIdentity) -> None:
    # 9.3: back within one beat, and the endpoint answers again
    supervisor = FakeRef("supervisor")
    ref = PeerActor.start(supervisor=supervisor, identity=identity, questions=FakeRef(),
                          depth=lambda reply: reply(0), heartbeat_s=0.2)
    wait_for(identity.entry_path.exists, what="entry")
    shutil.rmtree(identity.agents_dir)
    shutil.rmtree(identity.endpoint.parent)
    began = time.monotonic()
    wait_for(identity.entry_path.exists, timeout=2, what="entry back")
    assert time.monotonic() - began < 0.2 + 0.4  # one beat, and a little for the write
    assert (identity.agents_dir.stat().st_mode & 0o777) == 0o700
    wait_for(identity.endpoint.exists, timeout=2, what="socket back")
    assert json.loads(exchange(identity.endpoint, PING))["type"] == "pong"
    entry = read_entry(identity.entry_path)
    assert entry is not None and entry.endpoint == str(identity.endpoint)
    handled(ref)  # alive, and had it crashed its ChildFailed would be told by now
    supervisor.assert_nothing()


def test_a_failing_heartbeat_write_is_reported_not_a_crash(
    identity: PeerIdentity, capsys: pytest.CaptureFixture[str]
) -> None:  # 9.3: no restart loop; the next beat tries again
    supervisor = FakeRef("supervisor")
    ref = PeerActor.start(supervisor=supervisor, identity=identity, questions=FakeRef(),
                          depth=lambda reply: reply(0), heartbeat_s=0.1)
    wait_for(identity.entry_path.exists, what="entry")
    shutil.rmtree(identity.agents_dir)
    identity.agents_dir.write_text("in the way")  # the directory cannot be made
    time.sleep(0.5)  # several beats fail meanwhile
    err = capsys.readouterr().err
    assert err.count("cannot write the registry entry") == 1
    handled(ref)  # alive, and had it crashed its ChildFailed would be told by now
    supervisor.assert_nothing()
    identity.agents_dir.unlink()
    wait_for(identity.entry_path.exists, timeout=2, what="entry back")
    wait_for(lambda: "written again" in capsys.readouterr().err, what="recovery line")
    assert not any(isinstance(m, ChildFailed) for m in supervisor.seen)


def test_new_question_reaches_the_questions_address(short_tmp: Path) -> None:  # W14
    served = Served(short_tmp)
    try:
        replies: list[bytes] = []
        sender = threading.Thread(target=lambda: replies.append(exchange(served.path, prompt_envelope(QID).to_line())))
        sender.start()
        handed = served.questions.expect(NewQuestion)
        assert handed.envelope.msg_id == QID
        handed.reply(None)  # the Router stored it
        sender.join(5)
        assert json.loads(replies[0])["type"] == "ack"
    finally:
        served.stop()


# -- the listener's own faults and its line boundaries ------------------------------


class AcceptFails(socket.socket):
    """A listening socket whose accept() fails the first time with an error that is
    not a shortage of descriptors."""

    calls = 0

    def accept(self) -> tuple[socket.socket, Any]:
        AcceptFails.calls += 1
        if AcceptFails.calls == 1:
            raise OSError(errno.EPROTO, os.strerror(errno.EPROTO))
        return super().accept()


def test_an_accept_that_fails_otherwise_is_said_and_tried_again(
    short_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path = short_tmp / "l.sock"
    AcceptFails.calls = 0
    server = AcceptFails(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    served = Served(short_tmp, server=server)
    try:
        assert json.loads(exchange(path, PING))["type"] == "pong"
        assert capfd.readouterr().err == (
            "coms-hermes-bridge: warning: cannot accept a coms connection: [Errno 71] Protocol"
            " error\n")
    finally:
        served.stop()


def test_a_client_that_says_nothing_gets_nothing_and_nothing_is_said(
    short_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:  # W12
    served = Served(short_tmp)
    try:
        for said in (b"", b"\n  \n"):
            with connect(served.path) as conn:
                conn.sendall(said)
                conn.shutdown(socket.SHUT_WR)  # and nothing more: EOF
                assert read_reply(conn) == b""
        assert json.loads(exchange(served.path, PING))["type"] == "pong"  # served in turn
        assert capfd.readouterr().err == ""
    finally:
        served.stop()


def test_a_fault_while_serving_a_connection_is_said_and_the_listener_goes_on(
    short_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    def no_card(depth: int | None) -> AgentCard:
        raise RuntimeError("no card")

    path = short_tmp / "l.sock"
    listener = Listener(bind_endpoint(path), FakeRef("questions"), no_card, None,
                        lambda reply: reply(0))
    listener.start()
    try:
        assert exchange(path, PING) == b""  # no reply it could stand behind
        assert said(capfd) == (  # said just after the connection closed
            "coms-hermes-bridge: error serving a coms connection: RuntimeError('no card')\n")
        assert listener.serving
    finally:
        listener.stop()


def test_a_cancel_that_cannot_be_handed_on_is_said_after_its_ack(
    short_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    class Gone:
        def tell(self, message: object) -> None:
            raise RuntimeError("router gone")

    path = short_tmp / "l.sock"
    listener = Listener(bind_endpoint(path), Gone(), card,  # type: ignore[arg-type]
                        lambda prompt, reply: reply(None), lambda reply: reply(0))
    listener.start()
    try:
        cancel = json.dumps({"type": "cancel", "msg_id": "c-1", "from": "builder",
                             "to": "user-remote", "created_at": "2026-12-02T06:00:00.000Z",
                             "ref_msg_id": QID}).encode() + b"\n"
        assert json.loads(exchange(path, cancel)) == {"type": "ack", "msg_id": "c-1"}
        assert said(capfd) == (
            "coms-hermes-bridge: error handing on a coms envelope: RuntimeError('router gone')\n")
    finally:
        listener.stop()


def test_a_question_not_stored_in_time_is_acked_anyway_and_said(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:  # W14: the Router is slow, not refusing
    monkeypatch.setattr(peer_module, "ADMIT_TIMEOUT_S", 0.1)
    served = Served(short_tmp, admit=lambda prompt, reply: None)  # never answers
    try:
        reply = json.loads(exchange(served.path, prompt_envelope(QID).to_line()))
        assert reply == {"type": "ack", "msg_id": QID}
        assert capfd.readouterr().err == (
            f"coms-hermes-bridge: question {QID} is queued but was not stored within 0.1s;"
            " acking it anyway\n")
    finally:
        served.stop()


def test_an_envelope_whose_text_is_not_unicode_is_nacked_naming_the_field(
    short_tmp: Path,
) -> None:  # X12
    served = Served(short_tmp)
    try:
        line = prompt_envelope(QID).to_line().replace(b'"msg_id":"', b'"msg_id":"\\ud800', 1)
        reply = json.loads(exchange(served.path, line))
        assert reply["type"] == "nack"
        assert reply["error"] == "invalid prompt envelope: msg_id is not valid Unicode"
    finally:
        served.stop()


def test_a_line_is_taken_whole_up_to_the_limit_and_refused_past_it() -> None:  # W12
    take = peer_module._take_line
    assert take(b"x" * MAX_LINE, False) == (None, False)  # at the limit: more may come
    assert take(b"\n \n", False) == (None, False)  # blank lines only: wait for a real one
    assert take(b"\n \nping\n", False) == (b"ping", True)
    assert take(b"tail", True) == (b"tail", True)
    for too_long in (b"x" * (MAX_LINE + 1), b"x" * (MAX_LINE + 1) + b"\n"):
        with pytest.raises(peer_module._LineTooLarge):
            take(too_long, False)


def test_without_a_depth_callable_a_ping_asks_the_router(short_tmp: Path) -> None:  # W17
    path = short_tmp / "l.sock"
    questions = FakeRef("questions")
    listener = Listener(bind_endpoint(path), questions, card)
    listener.start()
    try:
        replies: list[bytes] = []
        pinger = threading.Thread(target=lambda: replies.append(exchange(path, PING)))
        pinger.start()
        questions.expect(QueueDepthQuery).reply(4)
        pinger.join(5)
        assert json.loads(replies[0])["agent_card"]["queue_depth"] == 4
    finally:
        listener.stop()


def test_a_listening_socket_that_cannot_be_watched_is_said_and_not_serving(
    short_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:  # the Peer's next heartbeat then fails it, and its restart binds afresh
    server = bind_endpoint(short_tmp / "l.sock")
    listener = Listener(server, FakeRef("questions"), card, None, lambda reply: reply(0))
    server.close()  # closed before the loop could watch it
    listener.start()
    try:
        wait_for(lambda: not listener.serving, what="not serving")
        assert capfd.readouterr().err == (
            "coms-hermes-bridge: error: cannot listen for coms connections: Invalid file"
            " descriptor: -1\n")
    finally:
        listener.stop()



def test_stop_from_another_thread_waits_for_the_shut_but_not_for_ever(
    short_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    edge = Edge("test-listener")
    try:
        path = short_tmp / "l.sock"
        listener = Listener(bind_endpoint(path), FakeRef("questions"), card, None,
                            lambda reply: reply(0), edge=edge)
        listener.start()
        assert json.loads(exchange(path, PING))["type"] == "pong"
        began = time.monotonic()
        listener.stop()  # the loop is free: shut at once, quietly
        assert time.monotonic() - began < peer_module.JOIN_TIMEOUT_S
        with pytest.raises(ConnectionRefusedError):
            exchange(path, PING)
        second = Listener(bind_endpoint(short_tmp / "m.sock"), FakeRef("questions"), card,
                          None, lambda reply: reply(0), edge=edge)
        second.start()
        edge.call(time.sleep, 3 * peer_module.JOIN_TIMEOUT_S)  # the loop is busy
        began = time.monotonic()
        second.stop()  # gives up waiting after JOIN_TIMEOUT_S; the loop shuts it later
        elapsed = time.monotonic() - began  # the loop stays busy for 3 s: never waited out
        assert peer_module.JOIN_TIMEOUT_S <= elapsed < 2.5 * peer_module.JOIN_TIMEOUT_S
        assert capfd.readouterr().err == ""
    finally:
        edge.close()


class Paused:
    """A listener on an edge of its own whose accept() has failed for want of
    descriptors, so that it waits out ACCEPT_PAUSE_S; `pause_over()` returns after."""

    def __init__(self, tmp: Path) -> None:
        self.edge = Edge("test-listener")
        self.path = tmp / "l.sock"
        ShortOfDescriptors.calls = 0
        server = ShortOfDescriptors(socket.AF_UNIX, socket.SOCK_STREAM)
        server.fails = 10**9
        server.bind(str(self.path))
        server.listen(8)
        self.listener = Listener(server, FakeRef("questions"), card, None,
                                 lambda reply: reply(0), edge=self.edge)
        self.listener.start()
        self.waiting = connect(self.path)  # accept() fails: the listener pauses
        wait_for(lambda: ShortOfDescriptors.calls >= 1, what="a failed accept")

    def pause_over(self) -> None:
        resumed = threading.Event()
        self.edge.after(2 * peer_module.ACCEPT_PAUSE_S, resumed.set)  # after its end
        assert resumed.wait(5)

    def close(self) -> None:
        self.waiting.close()
        self.listener.stop()
        self.edge.close()


@pytest.fixture
def paused(short_tmp: Path, capfd: pytest.CaptureFixture[str]) -> Iterator[Paused]:
    # capfd first: what the pause says is the test's to read
    made = Paused(short_tmp)
    yield made
    made.close()


def test_a_listener_stopped_during_a_pause_for_descriptors_stays_stopped(
    paused: Paused, capfd: pytest.CaptureFixture[str]
) -> None:
    paused.listener.stop()
    paused.pause_over()
    assert paused.listener.serving  # not watched again, so never found broken either
    assert capfd.readouterr().err == (
        "coms-hermes-bridge: warning: cannot accept a coms connection: Too many open files;"
        " retrying every 0.1s\n")


def test_a_socket_replaced_during_a_pause_for_descriptors_is_not_watched_again(
    paused: Paused, capfd: pytest.CaptureFixture[str]
) -> None:  # the heartbeat re-binds a deleted path while accept() waits out a shortage
    paused.path.unlink()
    paused.listener.replace_server(bind_endpoint(paused.path))
    paused.pause_over()
    assert paused.listener.serving
    assert json.loads(exchange(paused.path, PING))["type"] == "pong"  # the new one answers
    assert "cannot listen" not in capfd.readouterr().err


def test_an_actor_that_stopped_is_told_nothing_and_nothing_fails() -> None:
    ref = FakeRef("gone")

    def dead(message: object) -> None:
        raise pykka.ActorDeadError("gone")

    ref.tell = dead  # type: ignore[method-assign]
    peer_module._tell(ref, object())  # from the edge: no error for the loop
