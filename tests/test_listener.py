"""The coms listener's limits over real unix sockets (W12-W14, W17), and the Peer's
heartbeat that keeps the listener and the registry entry found (W6)."""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from coms_hermes_bridge.actors import listener as listener_module
from coms_hermes_bridge.actors.listener import BUSY, MAX_LINE, Listener, bind_endpoint
from coms_hermes_bridge.actors.loop import Edge
from coms_hermes_bridge.actors.peer import PeerActor
from coms_hermes_bridge.actors.registry import PeerIdentity, read_entry, resolve_identity
from coms_hermes_bridge.messages.commands import (
    Heartbeat,
    NewQuestion,
    QueueDepthQuery,
)
from coms_hermes_bridge.messages.wire import AgentCard
from tests.fakes import (
    FakeRef,
    Settles,
    WiredRig,
    bridge_config,
    close_edge,
    edge_caught_up,
    prompt_envelope,
    said,
    wait_for,
)

QID = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
PING = b'{"type":"ping","msg_id":"p"}\n'
SHORT = ("coms-hermes-bridge: warning: cannot accept a coms connection: Too many open files;"
         " retrying every 0.1s\n")


def card(depth: int) -> AgentCard:
    return AgentCard(name="user-remote", purpose="p", model="m", color="c",
                     context_used_pct=0, queue_depth=depth)


def zero(query: QueueDepthQuery) -> None:
    query.reply(0)


def refuse(question: NewQuestion) -> None:
    question.verdict.set_result("no")


def refusing() -> FakeRef:
    """A router that refuses every question and has none open."""
    return FakeRef("router", answers={NewQuestion: refuse, QueueDepthQuery: zero})


def talk(path: Path, data: bytes) -> bytes:
    """Send `data` and read all the listener says until it closes the connection."""
    with connect(path) as conn:
        conn.sendall(data)
        return read_reply(conn)


def connect(path: Path) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(10)
    conn.connect(str(path))
    return conn


def read_reply(conn: socket.socket) -> bytes:
    reply = b""
    while chunk := conn.recv(4096):
        reply += chunk
    return reply


def refused(path: Path) -> bool:
    try:
        connect(path).close()
    except ConnectionRefusedError:
        return True
    return False


def in_background(path: Path, data: bytes) -> tuple[threading.Thread, list[bytes]]:
    """`talk` from a thread of its own: its reply lands in the list once it comes."""
    replies: list[bytes] = []
    sender = threading.Thread(target=lambda: replies.append(talk(path, data)))
    sender.start()
    return sender, replies


class Served:
    """A Listener on `server` (or a socket bound at `path`) with the given options, its
    router a FakeRef (`served.router`) with a depth of 0 that records each question,
    unless `answers` says how it answers them (or the depth)."""

    def __init__(self, path: Path, *, server: socket.socket | None = None,
                 card: Callable[[int], AgentCard] = card,
                 answers: Mapping[type, Callable[[Any], None]] | None = None,
                 **options: Any) -> None:
        self.path = path
        self.router = FakeRef("router", answers={QueueDepthQuery: zero, **(answers or {})})
        self.listener = Listener(server or bind_endpoint(path), self.router, card, **options)
        self.listener.start()


@pytest.fixture
def serve(coms_dir: Path) -> Iterator[Callable[..., Served]]:
    """Serves with `Served`'s options at coms_dir/l.sock; each is stopped after the test."""
    made: list[Served] = []

    def start(**options: Any) -> Served:
        served = Served(coms_dir / "l.sock", **options)
        made.append(served)
        return served

    yield start
    for served in made:
        served.listener.stop()


class FailingAccept(socket.socket):
    """A listening unix socket at `path` whose accept() fails with `code` the first
    `fails` times (changed at will)."""

    def __init__(self, path: Path, code: int, fails: int) -> None:
        super().__init__(socket.AF_UNIX, socket.SOCK_STREAM)
        self.code, self.fails, self.calls = code, fails, 0
        self.bind(str(path))
        self.listen(8)

    def accept(self) -> tuple[socket.socket, Any]:
        self.calls += 1
        if self.calls <= self.fails:
            raise OSError(self.code, os.strerror(self.code))
        return super().accept()


# -- limits -------------------------------------------------------------------------------


def test_past_the_connection_cap_a_client_is_refused_at_once(
    serve: Callable[..., Served], capfd: pytest.CaptureFixture[str]
) -> None:  # W12: a nack and a close, not a wait for the line deadline
    served = serve(max_connections=3)
    silent = [connect(served.path) for _ in range(3)]
    wait_for(lambda: len(served.listener._clients) == 3, what="three connections")
    began = time.monotonic()
    with connect(served.path) as refused:
        reply = read_reply(refused)  # closed at once: EOF follows the nack
    assert reply == f'{{"type":"nack","msg_id":"","error":"{BUSY}"}}\n'.encode()
    assert time.monotonic() - began < listener_module.LINE_DEADLINE_S / 2
    silent.pop().close()
    wait_for(lambda: len(served.listener._clients) == 2, what="one closed")
    assert json.loads(talk(served.path, PING))["type"] == "pong"
    assert capfd.readouterr().err == (  # said when it began, and when it ended
        "coms-hermes-bridge: warning: 3 coms connections open; refusing more until some"
        " close\n"
        "coms-hermes-bridge: warning: refused 1 coms connection(s) while 3 were open\n")
    for conn in silent:
        conn.close()


def test_past_the_cap_a_client_already_gone_is_closed_without_a_fault(
    serve: Callable[..., Served], capfd: pytest.CaptureFixture[str]
) -> None:  # W12: its nack has nobody to read it; the listener goes on, saying only the refusal
    served = serve(max_connections=1)
    held = connect(served.path)
    wait_for(lambda: len(served.listener._clients) == 1, what="one connection")
    holding, gate = threading.Event(), threading.Event()

    def hold() -> None:
        holding.set()
        gate.wait(10)

    served.listener.edge.call(hold)  # while the loop is held, the next client waits unaccepted
    assert holding.wait(10)
    connect(served.path).close()  # it connected, and hung up before it was taken
    gate.set()
    assert said(capfd, "the refusal") == (
        "coms-hermes-bridge: warning: 1 coms connections open; refusing more until some"
        " close\n")
    held.close()
    wait_for(lambda: len(served.listener._clients) == 0, what="the first one closed")
    assert json.loads(talk(served.path, PING))["type"] == "pong"
    assert capfd.readouterr().err == (
        "coms-hermes-bridge: warning: refused 1 coms connection(s) while 1 were open\n")


def test_the_deadline_is_for_the_whole_line_not_each_recv(serve: Callable[..., Served]) -> None:
    # W12: a trickler sending one byte every 0.1 s, never a newline, is dropped at the
    # line's deadline, though each of its sends comes well within it
    served = serve(line_deadline_s=0.5)
    conn = connect(served.path)
    conn.settimeout(0.1)
    began = time.monotonic()
    closed_after: float | None = None
    while closed_after is None and time.monotonic() - began < 10:
        try:
            conn.sendall(b" ")
            if conn.recv(16) == b"":
                closed_after = time.monotonic() - began
        except TimeoutError:
            continue
        except OSError:
            closed_after = time.monotonic() - began
    conn.close()
    assert closed_after is not None and 0.4 <= closed_after < 3.0, closed_after
    wait_for(lambda: len(served.listener._clients) == 0, what="the trickler dropped")
    assert json.loads(talk(served.path, PING))["type"] == "pong"


def test_a_line_is_taken_whole_up_to_the_limit_and_refused_past_it() -> None:  # W12, W13
    def take(data: bytes, eof: bool) -> tuple[bytes | None, bool]:
        return listener_module._take_line(bytearray(data), eof)

    assert MAX_LINE == 64 * 1024
    assert take(b"x" * MAX_LINE, False) == (None, False)  # at the limit: more may come
    assert take(b"x" * MAX_LINE + b"\n", False) == (b"x" * MAX_LINE, True)
    assert take(b"\n \n", False) == (None, False)  # blank lines only: wait for a real one
    assert take(b"\n \n", True) == (None, True)  # and none came
    assert take(b"\n \r\n\t\x0b\x0c\n  ping \nnext\n", False) == (b"  ping ", True)
    assert take(b"tail", True) == (b"tail", True)
    assert take(b"\n \ntail", True) == (b"tail", True)
    for too_long in (b"x" * (MAX_LINE + 1), b"x" * (MAX_LINE + 1) + b"\n", b"\n" + b"x" * (MAX_LINE + 1)):
        with pytest.raises(listener_module._LineTooLarge):
            take(too_long, False)


def test_blank_lines_are_cut_from_the_buffer_and_the_rest_kept() -> None:  # W12
    # what makes a flood of blank lines cost its length once, whatever its chunks
    buffer = bytearray(b"\n \r\n\n  {\"ty")
    assert listener_module._take_line(buffer, False) == (None, False)
    assert buffer == b'  {"ty'
    buffer = bytearray(b"\n\n \t")
    assert listener_module._take_line(buffer, False) == (None, False)
    assert buffer == b" \t"
    buffer = bytearray(b"\nping\n")
    assert listener_module._take_line(buffer, False) == (b"ping", True)
    assert buffer == b"ping\n"


def test_waiting_clients_and_admissions_take_no_threads(serve: Callable[..., Served]) -> None:
    # many open connections and admissions pending, not one thread for them
    pending: list[Callable[[str | None], None]] = []
    lock = threading.Lock()

    def slow_admit(question: NewQuestion) -> None:
        with lock:
            pending.append(question.verdict.set_result)  # answered later, from the test's own thread

    serve(max_connections=40, answers={NewQuestion: slow_admit}).listener.stop()  # the edge, warm
    edge_caught_up()  # shut: its socket path may be bound again
    before = set(threading.enumerate())
    served = serve(max_connections=40, answers={NewQuestion: slow_admit})
    waiting = [connect(served.path) for _ in range(30)]
    replies: dict[str, bytes] = {}

    def ask(n: int) -> None:
        msg_id = f"01ARZ3NDEKTSV4RRFFQ69G{n:04d}"
        replies[msg_id] = talk(served.path, prompt_envelope(msg_id).to_line())

    askers = [threading.Thread(target=ask, args=(n,)) for n in range(4)]
    for thread in askers:
        thread.start()
    wait_for(lambda: len(served.listener._clients) == 34, what="all connected")
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


# -- accepting ------------------------------------------------------------------------------


def test_out_of_descriptors_accept_pauses_still_serving_and_resumes(
    coms_dir: Path, serve: Callable[..., Served], capfd: pytest.CaptureFixture[str]
) -> None:
    # a pause in accepting is no failure: a shortage must not restart the Peer
    server = FailingAccept(coms_dir / "l.sock", errno.EMFILE, fails=10**9)
    served = serve(server=server)
    waiting = connect(served.path)  # sits in the backlog while accept() fails
    wait_for(lambda: server.calls >= 3, what="accept tried again after each pause")
    server.fails = 0
    waiting.sendall(PING)
    assert json.loads(read_reply(waiting))["type"] == "pong"
    waiting.close()
    assert capfd.readouterr().err == (  # said once when it began, and when it ended
        SHORT + "coms-hermes-bridge: info: accepting coms connections again\n")


def test_an_accept_that_fails_otherwise_is_said_and_tried_again(
    coms_dir: Path, serve: Callable[..., Served], capfd: pytest.CaptureFixture[str]
) -> None:
    served = serve(server=FailingAccept(coms_dir / "l.sock", errno.EPROTO, fails=1))
    assert json.loads(talk(served.path, PING))["type"] == "pong"
    assert capfd.readouterr().err == (
        "coms-hermes-bridge: warning: cannot accept a coms connection: [Errno 71] Protocol"
        " error\n")


def test_a_socket_that_cannot_be_watched_yet_is_said_once_and_watched_once_it_can(
    coms_dir: Path, capfd: pytest.CaptureFixture[str]
) -> None:  # a shortage is waited out, not a crash
    edge = Edge("test-listener")
    watch, tries = edge.loop.add_reader, [0]

    def short_of_memory(*args: Any) -> None:  # as epoll_ctl fails the first three times
        tries[0] += 1
        if tries[0] <= 3:
            raise OSError(errno.ENOMEM, os.strerror(errno.ENOMEM))
        watch(*args)

    edge.loop.add_reader = short_of_memory  # type: ignore[method-assign]
    path = coms_dir / "l.sock"
    listener = Listener(bind_endpoint(path), refusing(), card, edge=edge)
    try:
        listener.start()
        assert json.loads(talk(path, PING))["type"] == "pong"
        assert tries[0] > 3
        assert capfd.readouterr().err == (
            "coms-hermes-bridge: warning: cannot accept a coms connection: Cannot allocate"
            " memory; retrying every 0.1s\n"
            "coms-hermes-bridge: info: accepting coms connections again\n")
    finally:
        listener.stop()
        close_edge(edge)


class Paused:
    """A listener on an edge of its own whose accept() has failed for want of
    descriptors, so that it waits out ACCEPT_PAUSE_S; `pause_over()` returns after."""

    def __init__(self, tmp: Path) -> None:
        self.edge = Edge("test-listener")
        self.path = tmp / "l.sock"
        self.server = FailingAccept(self.path, errno.EMFILE, fails=10**9)
        self.listener = Listener(self.server, refusing(), card, edge=self.edge)
        self.listener.start()
        self.waiting = connect(self.path)  # accept() fails: the listener pauses
        wait_for(lambda: self.server.calls >= 1, what="a failed accept")

    def pause_over(self) -> None:
        resumed = threading.Event()
        self.edge.call(self.edge.loop.call_later, 2 * listener_module.ACCEPT_PAUSE_S,
                       resumed.set)  # after its end
        assert resumed.wait(5)

    def close(self) -> None:
        self.waiting.close()
        self.listener.stop()
        close_edge(self.edge)


@pytest.fixture
def paused(coms_dir: Path, capfd: pytest.CaptureFixture[str]) -> Iterator[Paused]:
    # capfd first: what the pause says is the test's to read
    made = Paused(coms_dir)
    yield made
    made.close()


def test_a_listener_stopped_during_a_pause_for_descriptors_stays_stopped(
    paused: Paused, capfd: pytest.CaptureFixture[str]
) -> None:
    paused.listener.stop()
    edge_caught_up(paused.edge)
    calls = paused.server.calls
    paused.pause_over()
    assert paused.server.calls == calls  # not watched again
    assert capfd.readouterr().err == SHORT


def test_stop_from_another_thread_never_waits_for_a_busy_loop(
    coms_dir: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    edge = Edge("test-listener")
    try:
        path = coms_dir / "l.sock"
        listener = Listener(bind_endpoint(path), refusing(), card, edge=edge)
        listener.start()
        assert json.loads(talk(path, PING))["type"] == "pong"
        busy = threading.Event()
        edge.call(busy.wait, 10)  # the loop is busy until the test says
        began = time.monotonic()
        listener.stop()
        assert time.monotonic() - began < 1.0
        busy.set()
        wait_for(lambda: refused(path), what="the socket closed once the loop was free")
        assert capfd.readouterr().err == ""
    finally:
        close_edge(edge)


# -- what a line gets ---------------------------------------------------------------------


def test_a_new_question_reaches_the_router_and_is_acked_once_stored(
    serve: Callable[..., Served],
) -> None:  # W14
    served = serve()
    sender, replies = in_background(served.path, prompt_envelope(QID).to_line())
    handed = served.router.expect(NewQuestion)
    assert handed.envelope.msg_id == QID
    assert replies == []  # not acked before it is stored
    handed.verdict.set_result(None)  # the Router stored it
    sender.join(10)
    assert json.loads(replies[0]) == {"type": "ack", "msg_id": QID}


def test_a_question_not_taken_in_time_is_withdrawn_refused_and_said(
    serve: Callable[..., Served], monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:  # W14: an ack means stored, so a question the Router is too busy to take is not acked
    monkeypatch.setattr(listener_module, "ADMIT_TIMEOUT_S", 0)
    held: list[NewQuestion] = []
    served = serve(answers={NewQuestion: held.append})  # queued, not taken
    reply = json.loads(talk(served.path, prompt_envelope(QID).to_line()))
    assert reply == {"type": "nack", "msg_id": QID,
                     "error": "bridge is busy: too many questions waiting; try again"}
    assert [question.envelope.msg_id for question in held] == [QID]
    # withdrawn: the Router, coming to it, finds it is not to be taken
    assert held[0].verdict.set_running_or_notify_cancel() is False
    assert capfd.readouterr().err == (
        f"coms-hermes-bridge: question {QID} was not taken within 0s; nacked it"
        " (bridge is busy: too many questions waiting; try again)\n")


def test_a_question_taken_as_the_wait_ends_gets_its_verdict(
    serve: Callable[..., Served], monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:  # W14: taken by the Router, it cannot be withdrawn; its verdict is the reply
    monkeypatch.setattr(listener_module, "ADMIT_TIMEOUT_S", 0)
    taken: list[NewQuestion] = []

    def take(question: NewQuestion) -> None:
        assert question.verdict.set_running_or_notify_cancel()
        taken.append(question)

    served = serve(answers={NewQuestion: take})
    for verdict, reply in ((None, {"type": "ack", "msg_id": QID}),
                           ("no", {"type": "nack", "msg_id": QID, "error": "no"})):
        sender, replies = in_background(served.path, prompt_envelope(QID).to_line())
        wait_for(lambda: bool(taken), what="the question taken")
        taken.pop().verdict.set_result(verdict)  # after the listener stopped waiting: it was 0 s
        sender.join(10)
        assert json.loads(replies[0]) == reply
    assert capfd.readouterr().err == ""


def test_a_question_taken_but_never_judged_gets_no_reply_and_its_connection_ends(
    serve: Callable[..., Served], monkeypatch: pytest.MonkeyPatch,
) -> None:  # W14: neither an ack nor a nack can be true; the asker tries again (X2)
    monkeypatch.setattr(listener_module, "ADMIT_TIMEOUT_S", 0)
    monkeypatch.setattr(listener_module, "REPLY_GRACE_S", 0.1)
    taken: list[NewQuestion] = []

    def take(question: NewQuestion) -> None:
        assert question.verdict.set_running_or_notify_cancel()
        taken.append(question)  # and never judged

    served = serve(answers={NewQuestion: take})
    assert talk(served.path, prompt_envelope(QID).to_line()) == b""
    wait_for(lambda: len(served.listener._clients) == 0, what="its connection ended")
    assert len(taken) == 1


def test_an_envelope_whose_text_is_not_unicode_is_nacked_naming_the_field(
    serve: Callable[..., Served],
) -> None:  # X12
    served = serve()
    line = prompt_envelope(QID).to_line().replace(b'"msg_id":"', b'"msg_id":"\\ud800', 1)
    reply = json.loads(talk(served.path, line))
    assert reply["type"] == "nack"
    assert reply["error"] == "invalid prompt envelope: msg_id is not valid Unicode"


def test_a_client_that_says_nothing_gets_nothing_and_nothing_is_said(
    serve: Callable[..., Served], capfd: pytest.CaptureFixture[str]
) -> None:  # W12
    served = serve()
    for sent in (b"", b"\n  \n"):
        with connect(served.path) as conn:
            conn.sendall(sent)
            conn.shutdown(socket.SHUT_WR)  # and nothing more: EOF
            assert read_reply(conn) == b""
    assert json.loads(talk(served.path, PING))["type"] == "pong"  # served in turn
    assert capfd.readouterr().err == ""


def test_a_fault_while_serving_a_connection_is_said_and_the_listener_goes_on(
    serve: Callable[..., Served], capfd: pytest.CaptureFixture[str]
) -> None:  # a bug meets one connection alone: it is closed, and the loop says the fault
    faults = [RuntimeError("no card")]

    def no_card(depth: int) -> AgentCard:
        if faults:
            raise faults.pop()
        return card(depth)

    served = serve(card=no_card)
    assert talk(served.path, PING) == b""  # no reply it could stand behind
    edge_caught_up()
    gc.collect()  # the task's fault is said once nobody holds it
    assert "RuntimeError('no card')" in said(capfd)
    assert json.loads(talk(served.path, PING))["type"] == "pong"


# -- the Peer's heartbeat ---------------------------------------------------------------


@pytest.fixture
def identity(coms_dir: Path) -> PeerIdentity:
    return resolve_identity(
        coms_dir, "default", "user-remote", cwd="/w", pid=os.getpid(), now=datetime.now(UTC)
    )


def beat(rig: WiredRig[PeerActor]) -> None:
    """One heartbeat, handled."""
    rig.ref.tell(Heartbeat(0))
    rig.sync()


def test_a_heartbeat_heals_what_was_deleted_and_rides_out_what_it_cannot_heal(
    identity: PeerIdentity, capfd: pytest.CaptureFixture[str]
) -> None:  # W6: found again within one beat; a write that fails is no crash, no restart
    rig = WiredRig(PeerActor, store=Settles(), identity=identity,
                   addresses={"router": FakeRef("router", answers={QueueDepthQuery: zero})})
    wait_for(identity.entry_path.exists, what="the entry")
    shutil.rmtree(identity.agents_dir)
    beat(rig)
    assert (identity.agents_dir.stat().st_mode & 0o777) == 0o700
    entry = read_entry(identity.entry_path)
    assert entry is not None and entry.endpoint == str(identity.endpoint)
    assert json.loads(talk(identity.endpoint, PING))["type"] == "pong"
    capfd.readouterr()

    shutil.rmtree(identity.agents_dir)
    identity.agents_dir.write_text("in the way")  # the directory cannot be made
    for _ in range(3):
        beat(rig)
    assert capfd.readouterr().err == (  # said once, however many beats fail
        f"coms-hermes-bridge: error: cannot write the registry entry {identity.entry_path}:"
        f" {identity.agents_dir} is not a directory; trying again at every heartbeat\n")
    identity.agents_dir.unlink()
    beat(rig)
    assert read_entry(identity.entry_path) is not None
    assert capfd.readouterr().err == (
        f"coms-hermes-bridge: warning: {identity.agents_dir} was gone; made it again (0700)\n"
        f"coms-hermes-bridge: info: registry entry {identity.entry_path} written again\n")
    rig.supervisor.assert_nothing()  # never failed: no ChildFailed


def test_an_open_count_answered_after_the_peer_stopped_fails_nobody(
    identity: PeerIdentity,
) -> None:  # the Router answers in its own turn: a Peer gone meanwhile must not fail it
    rig = WiredRig(PeerActor, store=Settles(), identity=identity,  # the open count
                   config=bridge_config(heartbeat_ms=10))
    asked = rig.router.expect(QueueDepthQuery)
    rig.ref.stop()
    asked.reply(3)


# -- bounds and the stop ------------------------------------------------------------------


def test_an_owner_that_never_accepts_is_judged_stale_within_the_probe(coms_dir: Path) -> None:
    # W11: the probe connects for 250 ms; timed out means stale: unlink and bind
    path = coms_dir / "l.sock"
    wedged = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    wedged.bind(str(path))
    wedged.listen(0)
    queued: list[socket.socket] = []
    try:
        with pytest.raises(BlockingIOError):
            while True:  # its backlog full: a connect now waits
                queued.append(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
                queued[-1].setblocking(False)
                queued[-1].connect(str(path))
        taken: list[socket.socket] = []
        binder = threading.Thread(target=lambda: taken.append(bind_endpoint(path)), daemon=True)
        binder.start()
        binder.join(3)
        assert taken, "the probe waited on an owner that never accepts"
        assert json.loads(talk_when_served(taken[0], path))["type"] == "pong"
    finally:
        wedged.close()
        for conn in queued:
            conn.close()


def talk_when_served(server: socket.socket, path: Path) -> bytes:
    listener = Listener(server, refusing(), card)
    listener.start()
    try:
        return talk(path, PING)
    finally:
        listener.stop()
        wait_for(lambda: server.fileno() == -1, what="the socket closed by the stop")


def test_a_stale_socket_removed_by_another_during_the_probe_is_bound_all_the_same(
    coms_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # W11: stale means unlink and bind; someone else's unlink first is the same
    path = coms_dir / "l.sock"
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).bind(str(path))  # left behind, stale
    probe = listener_module.endpoint_accepts

    def probed_then_gone(endpoint: str, timeout: float) -> bool:
        answer = probe(endpoint, timeout)
        Path(endpoint).unlink()
        return answer

    monkeypatch.setattr(listener_module, "endpoint_accepts", probed_then_gone)
    assert json.loads(talk_when_served(bind_endpoint(path), path))["type"] == "pong"


def test_a_wakeup_with_no_connection_waiting_never_holds_the_loop(coms_dir: Path) -> None:
    # "accept() must never wait": the loop serves everything else (W12)
    edge = Edge("test-listener")
    path = coms_dir / "l.sock"
    try:
        listener = Listener(bind_endpoint(path), refusing(), card, edge=edge)
        listener.start()
        edge.call(listener._accept)  # as if readable, with nobody there
        edge_caught_up(edge)
        listener.stop()
        wait_for(lambda: refused(path), what="the socket closed")
    finally:
        with contextlib.suppress(OSError):
            connect(path).close()  # frees a loop held in accept
        close_edge(edge)


def test_a_router_that_never_says_its_open_count_is_taken_as_none_open(
    serve: Callable[..., Served], monkeypatch: pytest.MonkeyPatch,
) -> None:  # W17: the last count seen when the Router is slow, and none seen yet is 0
    monkeypatch.setattr(listener_module, "DEPTH_TIMEOUT_S", 0.05)
    served = serve(answers={QueueDepthQuery: lambda query: None})  # never answers
    assert json.loads(talk(served.path, PING))["agent_card"]["queue_depth"] == 0


def test_a_client_that_never_reads_its_reply_is_dropped_after_the_grace(
    serve: Callable[..., Served], coms_dir: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # bounded everywhere: writing the reply waits REPLY_GRACE_S, then the client goes
    monkeypatch.setattr(listener_module, "REPLY_GRACE_S", 0.5)

    def big_card(depth: int) -> AgentCard:  # a whole line (W13), more than the buffer holds
        return card(depth).model_copy(update={"purpose": "p" * MAX_LINE})

    served = serve(server=SmallBuffers(coms_dir / "l.sock"), card=big_card)
    with connect(served.path) as conn:
        conn.sendall(PING)  # and never reads
        wait_for(lambda: len(served.listener._clients) == 1, what="the client served")
        wait_for(lambda: len(served.listener._clients) == 0, what="the stalled client dropped")


class SmallBuffers(socket.socket):
    """A listening unix socket at `path` whose connections buffer 4 KiB to send."""

    def __init__(self, path: Path) -> None:
        super().__init__(socket.AF_UNIX, socket.SOCK_STREAM)
        self.bind(str(path))
        self.listen(8)

    def accept(self) -> tuple[socket.socket, Any]:
        conn, address = super().accept()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        return conn, address


class FailingClose(socket.socket):
    """A listening unix socket at `path` whose close() fails once it has closed."""

    def __init__(self, path: Path) -> None:
        super().__init__(socket.AF_UNIX, socket.SOCK_STREAM)
        self.bind(str(path))
        self.listen(8)

    def close(self) -> None:
        super().close()
        raise OSError(errno.EIO, os.strerror(errno.EIO))


def test_stop_drops_every_client_though_the_socket_fails_to_close(
    serve: Callable[..., Served], coms_dir: Path
) -> None:  # W12: a stopped listener leaves no client waiting for its line's deadline
    served = serve(server=FailingClose(coms_dir / "l.sock"), line_deadline_s=60)
    with connect(served.path) as silent:
        wait_for(lambda: len(served.listener._clients) == 1, what="the client served")
        served.listener.stop()
        silent.settimeout(5)
        assert silent.recv(16) == b""


def test_a_second_stop_is_harmless_and_says_nothing(
    serve: Callable[..., Served], capfd: pytest.CaptureFixture[str]
) -> None:  # the Peer's release stops it once, but a stop may come twice
    served = serve()
    assert json.loads(talk(served.path, PING))["type"] == "pong"
    served.listener.stop()
    served.listener.stop()
    edge_caught_up()
    wait_for(lambda: refused(served.path), what="the socket closed")
    assert capfd.readouterr().err == ""
