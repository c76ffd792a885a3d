"""Test doubles for collaborator actors: a ref that records what it is told."""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import errno
import importlib.util
import itertools
import json
import os
import queue
import socket
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, Generic, TypeVar, cast

import pykka
from ulid import ULID

from coms_hermes_bridge.actors.config import BridgeConfig, parse_config
from coms_hermes_bridge.actors.delivery import DeliveryActor
from coms_hermes_bridge.actors.listener import Listener
from coms_hermes_bridge.actors.logger import LoggerActor
from coms_hermes_bridge.actors.loop import Edge, shared_edge, utc_now
from coms_hermes_bridge.actors.peer import MODEL, PeerActor
from coms_hermes_bridge.actors.questions import QuestionActor, QuestionRouter
from coms_hermes_bridge.actors.registry import PeerIdentity, agents_dir, write_entry
from coms_hermes_bridge.actors.store import Store
from coms_hermes_bridge.actors.supervision import Slot, Supervised
from coms_hermes_bridge.actors.watcher import WatcherActor
from coms_hermes_bridge.messages.commands import (
    Address,
    NewQuestion,
    QuestionClosed,
    QuestionSpec,
    QueueDepthQuery,
    SendResponse,
)
from coms_hermes_bridge.messages.contract import iso, parse_prompt
from coms_hermes_bridge.messages.wire import PromptEnvelope, RegistryEntry, State

T = TypeVar("T")
A = TypeVar("A", bound=pykka.Actor)


def take(inbox: queue.Queue[T], timeout: float, missing: str) -> T:
    """The next item within `timeout` seconds, or AssertionError(`missing`)."""
    try:
        return inbox.get(timeout=max(timeout, 0))
    except queue.Empty:
        raise AssertionError(missing) from None


class FakeRef:
    """Records every `tell` in a queue, as a stand-in for a collaborator's address.

    `answers` maps a message type to what answers it, as the real collaborator would
    (say, {QueueDepthQuery: lambda query: query.reply(0)}): a message of exactly that
    type is handed to its handler, at once, on the teller's thread, and not recorded.
    Every other message is recorded."""

    def __init__(self, name: str = "fake", *,
                 answers: Mapping[type, Callable[[Any], None]] | None = None) -> None:
        self.name = name
        self.answers = dict(answers or {})
        self.inbox: queue.Queue[Any] = queue.Queue()
        self.seen: list[Any] = []

    def tell(self, message: Any) -> None:
        answer = self.answers.get(type(message))
        if answer is not None:
            answer(message)
        else:
            self.inbox.put(message)

    def expect(self, kind: type[T], timeout: float = 5.0) -> T:
        """The next message of type `kind`, skipping others (kept in `seen`)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{self.name}: no {kind.__name__} within {timeout}s; saw {self.seen}")
            try:
                message = self.inbox.get(timeout=left)
            except queue.Empty:
                continue
            self.seen.append(message)
            if isinstance(message, kind):
                return message

    def next(self, timeout: float = 5.0) -> Any:
        """The next message, whatever it is."""
        message = take(self.inbox, timeout, f"{self.name}: nothing told within {timeout}s")
        self.seen.append(message)
        return message

    def assert_nothing(self) -> None:
        """Assert nothing more has been told, now, without waiting.

        For use after a deterministic sync that leaves nothing in flight: an ask (or
        a reply) from the teller, which it handles after all it was told before; its
        stop; the `expect` of something it tells after what must not come."""
        try:
            message = self.inbox.get_nowait()
        except queue.Empty:
            return
        raise AssertionError(f"{self.name}: unexpected {message!r}")


# -- prompts ---------------------------------------------------------------------------

PROMPT_QID = "01ARZ3NDEKTSV4RRFFQ69G5FAV"


def prompt_envelope(
    qid: str = PROMPT_QID,
    *,
    text: str = "Ship?",
    sender_name: str = "builder",
    sender_endpoint: str = "/tmp/asker.sock",
    **fields: Any,
) -> PromptEnvelope:
    """A prompt as a peer sends it (W14), its msg_id `qid`; any other envelope field
    (sender_cwd, reply_timeout_ms, ...) as a keyword. Validated as an inbound one is.
    For the wire's dict or line: `.json_body()`, `.to_line()`."""
    return PromptEnvelope.model_validate({
        "msg_id": qid,
        "sender_session": "01J9Z8Y7X6W5V4T3S2R1Q0P9NM",
        "sender_endpoint": sender_endpoint,
        "hops": 0,
        "timestamp": "2026-11-30T12:00:00.000Z",
        "prompt": text,
        "sender_name": sender_name,
        "sender_cwd": "/work",
        **fields,
    })


def state_file(path: Path, closed: int, asker: str = "builder") -> list[str]:
    """A state file at `path` as the daemon leaves it, holding one open question and
    `closed` closed ones (answered), all from `asker`; their qids, the open one first."""
    store = Store.open(path)
    qids = [str(ULID()) for _ in range(closed + 1)]
    for qid in qids:
        prompt = prompt_envelope(qid, text="Go?", sender_name=asker)
        store.put_open(QuestionSpec(qid, prompt, parse_prompt(prompt), 60_000, time.time() + 60),
                       owner="q")
    for qid in qids[1:]:
        store.close(qid, "answered", owner="q")
    store.shutdown()
    return qids


def register_bridge(config: BridgeConfig, endpoint: str, name: str = "user-remote") -> None:
    """A live bridge (this process's pid, a fresh heartbeat) at `endpoint` in the coms
    registry of `config`'s project, as the operator's verbs look for one."""
    directory = agents_dir(config.coms_dir, config.project)
    directory.mkdir(parents=True, exist_ok=True)
    write_entry(directory / f"{name}.json", RegistryEntry(
        session_id="s", name=name, model=MODEL, pid=os.getpid(), endpoint=endpoint,
        heartbeat_at=iso(utc_now())))


def handled(ref: pykka.ActorRef[Any]) -> None:
    """Returns once the actor has handled everything told to it so far (a proxy's read
    is a message too, read in turn), and so told all it would tell for it: after it,
    an absence needs no waiting (`FakeRef.assert_nothing`). Raises ActorDeadError for
    an actor that has stopped."""
    ref.proxy().actor_urn.get(timeout=5)


def edge_caught_up(edge: Edge | None = None) -> None:
    """Returns once the edge's loop has run every callback that was ready when this was
    called: inotify's read of the events of every change made before, say, or what a
    connection's task does after its reply. A call from another thread may run ahead
    of the I/O that its own wake-up finds, so the sign is given one loop iteration
    later, after that I/O's callbacks. `edge`: a test's own instead of the shared one."""
    loop = (edge or shared_edge()).loop
    done = threading.Event()
    loop.call_soon_threadsafe(loop.call_soon, done.set)
    assert done.wait(5), "the edge's loop stalled"


def close_edge(edge: Edge) -> None:
    """Stop a test's own edge, its loop and its thread; what ran is dropped. (The daemon's
    edge lives as long as the process, so closing one is a test's business.)"""
    if not edge.loop.is_closed():
        edge.loop.call_soon_threadsafe(edge.loop.stop)
        edge._thread.join(timeout=5)
        if not edge._thread.is_alive():
            edge.loop.close()


def wait_for(
    condition: Callable[[], T | None], timeout: float = 5.0, what: str = "condition"
) -> T:
    """Poll `condition` until it is truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def said(capture: Any, what: str = "a line on stderr") -> str:
    """What has been said on stderr (a pytest capsys/capfd) once something has: for a
    line said just after the event the test waits on (a connection already closed)."""
    seen: list[str] = []

    def some() -> bool:
        seen.append(capture.readouterr().err)
        return "\n" in "".join(seen)

    wait_for(some, what=what)
    return "".join(seen)


def read_ndjson(path: Path) -> list[Any]:
    """Every whole record of an ndjson file (none if it is not there yet). Lines end at
    "\n" only: str.splitlines() would also cut at U+2028 inside a string, which JSON
    keeps raw. A last line without its "\n" is being written right now: not read yet."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    whole = data[: data.rfind(b"\n") + 1].decode("utf-8")
    return [json.loads(line) for line in whole.split("\n") if line.strip()]


def read_line(conn: socket.socket) -> bytes:
    """Bytes up to and including the first newline, or all there was before EOF."""
    buf = b""
    while b"\n" not in buf:
        chunk = conn.recv(65536)
        if not chunk:
            break
        buf += chunk
    return buf


# -- the asker ------------------------------------------------------------------------


def request(endpoint: str | Path, message: dict[str, Any] | bytes, timeout: float = 5.0) -> Any:
    """Connect, write one line, read one reply line (W12); parsed JSON or None on EOF."""
    line = message if isinstance(message, bytes) else (json.dumps(message) + "\n").encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(endpoint))
        s.sendall(line)
        buf = read_line(s)
    return json.loads(buf.split(b"\n", 1)[0]) if buf.strip() else None


def ack(line: bytes) -> bytes:
    """An asker's ack of a response line, with its msg_id (W15)."""
    try:
        msg_id = json.loads(line.split(b"\n", 1)[0]).get("msg_id")
    except (ValueError, AttributeError):
        msg_id = None
    return json.dumps({"type": "ack", "msg_id": msg_id}).encode() + b"\n"


class Asker:
    """A coms peer waiting for its responses (W15), for every test layer and the benchmark.

    It reads one line per connection, records it, and answers `reply(line)`
    (None: silent, until the sender gives up and closes). `threaded`: a thread
    per connection, as most peers are written; otherwise one loop answers each
    connection in turn, the fastest an asker can be. `backlog` is its listen
    backlog: a full one makes the sender wait for room.
    """

    def __init__(
        self,
        endpoint: Path | str,
        reply: Callable[[bytes], bytes | None] = ack,
        *,
        threaded: bool = True,
        backlog: int = 64,
        gate: threading.Event | None = None,
        split: bool = False,
        linger: bool = False,
    ) -> None:
        self.endpoint = str(endpoint)
        self.reply = reply
        self.threaded = threaded
        self.gate = gate  # each answer waits for it
        self.split = split  # the answer in two writes, a moment apart
        self.linger = linger  # keep the connection open after answering
        self.lines: list[bytes] = []  # each response line as read, newline included
        self.got = threading.Event()  # set at the first line
        self.responses: queue.Queue[dict[str, Any]] = queue.Queue()  # parsed, in order
        self.arrivals: dict[str, float] = {}  # msg_id -> perf_counter() at its first line
        self.errors: dict[str, Any] = {}  # msg_id -> the response's error, when it has one
        self.line_sizes: dict[str, int] = {}  # msg_id -> bytes of its line, newline included
        self.connections = self.open_now = self.most_open = 0
        self._lock = threading.Lock()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.endpoint)
        self._server.listen(backlog)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @classmethod
    def beside(cls, directory: Path, **options: Any) -> Asker:
        """An asker with a socket of its own in `directory`."""
        return cls(directory / f"asker-{os.getpid()}-{next(_ASKERS)}.sock", **options)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            if self.threaded:
                threading.Thread(target=self._one, args=(conn,), daemon=True).start()
            else:
                self._one(conn)

    def _one(self, conn: socket.socket) -> None:
        with self._lock:
            self.connections += 1
            self.open_now += 1
            self.most_open = max(self.most_open, self.open_now)
        try:
            conn.settimeout(30)  # a stuck sender is dropped, not waited for forever
            line = read_line(conn)
            if not line.strip():
                return  # the sender went away before it wrote anything
            self._record(line)
            if self.gate is not None:
                self.gate.wait(10)
            answer = self.reply(line)
            if answer is None:
                conn.recv(1)  # silent: until the sender gives up and closes
            elif self.split:
                conn.sendall(answer[:5])
                time.sleep(0.05)
                conn.sendall(answer[5:])
            else:
                conn.sendall(answer)
            if answer is not None and self.linger:
                conn.recv(1)  # until the sender closes
        except OSError:
            pass
        finally:
            with self._lock:
                self.open_now -= 1
            conn.close()

    def _record(self, line: bytes) -> None:
        try:
            envelope = json.loads(line.split(b"\n", 1)[0])
        except ValueError:
            envelope = None
        with self._lock:
            self.lines.append(line)
            if isinstance(envelope, dict):
                msg_id = str(envelope.get("msg_id", ""))
                self.arrivals.setdefault(msg_id, time.perf_counter())
                self.line_sizes[msg_id] = len(line.split(b"\n", 1)[0]) + 1
                if envelope.get("error") is not None:
                    self.errors[msg_id] = envelope["error"]
        self.got.set()
        if isinstance(envelope, dict):
            self.responses.put(envelope)

    def prompt_envelope(self, text: str, qid: str | None = None, **fields: Any) -> dict[str, Any]:
        """A prompt from this asker as the wire's dict: `prompt_envelope`'s, answered here."""
        fields = {"sender_cwd": "/work/app", "conversation_id": None, "response_schema": None,
                  **fields}
        envelope = prompt_envelope(qid or str(ULID()), text=text, sender_endpoint=self.endpoint,
                                   **fields)
        return {"type": "prompt", **envelope.model_dump(mode="json", exclude_unset=True)}

    def count(self) -> int:
        """How many responses (by msg_id) have come."""
        with self._lock:
            return len(self.arrivals)

    def response(self, timeout: float = 10.0) -> dict[str, Any]:
        return take(self.responses, timeout, f"no response within {timeout}s")

    def response_for(self, msg_id: str, timeout: float = 10.0) -> dict[str, Any]:
        """The response to `msg_id`, passing over (and dropping) any other on the way."""
        deadline = time.monotonic() + timeout
        while True:
            env = take(self.responses, deadline - time.monotonic(),
                       f"no response to {msg_id} within {timeout}s")
            if env.get("msg_id") == msg_id:
                return env

    def no_response(self, within: float = 0.5) -> None:
        try:
            env = self.responses.get(timeout=within)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected response {env}")

    def close(self) -> None:
        """Go away as a dead asker does: nothing listens at the endpoint any more."""
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)  # close() alone does not wake accept()
        self._server.close()
        self._thread.join(timeout=2)


_ASKERS = itertools.count()


# -- the Router's rig -------------------------------------------------------------------


def replied(ref: pykka.ActorRef[Any], message: Callable[[Callable[[T], None]], object],
            timeout: float = 5.0) -> T:
    """Tell `ref` `message(reply)` and wait for the value it replies with, on its own
    turn: a sync too, since it handles what it was told before first."""
    got: list[T] = []
    done = threading.Event()

    def reply(value: T) -> None:
        got.append(value)
        done.set()

    ref.tell(message(reply))
    assert done.wait(timeout), f"no reply within {timeout} s"
    assert len(got) == 1
    return got[0]


class ActorRig(Generic[A]):
    """The unit layer's rig: one actor under test, started for real, each collaborator
    a FakeRef named for its role (`rig.peer`, `rig.logger`, ...); `options` are the
    actor's own. Each test file adds what its actor needs on top (a subclass)."""

    def __init__(self, actor_class: type[A], roles: Iterable[str], **options: Any) -> None:
        self.fakes = {role: FakeRef(role) for role in roles}
        self.ref: pykka.ActorRef[A] = self.start(actor_class, options)

    def start(self, actor_class: type[A], options: dict[str, Any]) -> pykka.ActorRef[A]:
        return actor_class.start(**self.fakes, **options)

    def __getattr__(self, role: str) -> FakeRef:
        try:
            return self.__dict__["fakes"][role]  # type: ignore[no-any-return]
        except KeyError:
            raise AttributeError(role) from None

    def sync(self) -> None:
        """Returns once the actor has handled everything told to it so far (a proxy's
        read is a message too, read in turn), and so told all it would tell for it."""
        handled(self.ref)

    def stopped(self) -> None:
        """Returns once the actor has stopped: its last turn is over (on_stop included:
        the stop flag is set before it runs, in the same turn), and it tells nobody
        anything more."""
        wait_for(lambda: not self.ref.is_alive(), what=f"{self.ref} stops")
        edge_caught_up()

    @property
    def actor(self) -> A:
        """The actor object itself, for a white-box read of its state."""
        actor = self.ref._actor_weakref()
        assert actor is not None
        return actor


# -- the daemon's actors, wired ---------------------------------------------------------

ROLES = ("supervisor", "logger", "delivery", "router", "watcher", "peer")
NO_HOME = Path("/nonexistent-home-of-a-test")


def bridge_config(home: Path = NO_HOME, **overrides: Any) -> BridgeConfig:
    """The settings the daemon parses from no flags (HOME at `home`), with `overrides`."""
    config = parse_config([], {"HOME": str(home)})
    return dataclasses.replace(config, **overrides)


DISK_ERROR = sqlite3.OperationalError("disk I/O error")


class FailingConnection:
    """A store's SQLite connection whose `commit` raises `commit`, and whose `rollback`
    raises `rollback` after rolling back (white-box: put in the store's `_conn`)."""

    def __init__(self, conn: sqlite3.Connection, *, commit: Exception | None = None,
                 rollback: Exception | None = None) -> None:
        self._conn, self._commit_error, self._rollback_error = conn, commit, rollback

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def commit(self) -> None:
        if self._commit_error is not None:
            raise self._commit_error
        self._conn.commit()

    def rollback(self) -> None:
        self._conn.rollback()
        if self._rollback_error is not None:
            raise self._rollback_error


# what each of the daemon's actors is started with, as start_tree gives it
WIRED: dict[type, tuple[str, ...]] = {
    LoggerActor: ("log_path", "project"),
    DeliveryActor: ("config", "store", "router", "logger", "now"),
    WatcherActor: ("questions_dir", "poll_ms", "router", "delivery", "logger", "now"),
    PeerActor: ("store", "router", "logger", "heartbeat_s", "now"),
    QuestionRouter: ("config", "store", "router", "peer", "delivery", "watcher", "logger",
                     "now", "clock", "run_tag"),
    QuestionActor: ("store", "router", "delivery", "peer", "watcher", "logger", "target",
                    "remind_before_ms", "now", "clock"),
}


class WiredRig(ActorRig[A]):
    """One of the daemon's actors under test, started as the tree starts it: each
    collaborator it takes is a FakeRef named for its role (the supervisor too), unless
    `addresses` gives another (a FakeRef given is then `rig.<role>`); `store` (a real
    Store or a stand-in; by default none at all), the settings it takes from `config`
    (`bridge_config()` by default), and the clocks. `options` are the actor's own
    keyword arguments, and override any of those."""

    def __init__(self, actor_class: type[A], *, store: Any = None,
                 config: BridgeConfig | None = None, now: Callable[[], Any] = utc_now,
                 clock: Callable[[], float] = time.time, addresses: dict[str, Address] | None = None,
                 **options: Any) -> None:
        self.fakes = {role: FakeRef(role) for role in ROLES}
        self.fakes.update({role: fake for role, fake in (addresses or {}).items()
                           if isinstance(fake, FakeRef)})
        self.config = config = config or bridge_config()
        self.wired: dict[str, Any] = {role: self.fakes[role] for role in ROLES[1:]}
        self.wired.update(addresses or {})
        self.wired.update(
            config=config, store=store or cast(Store, object()), now=now, clock=clock,
            run_tag="t", log_path=config.log_path, project=config.project, questions_dir=config.questions_dir,
            poll_ms=config.poll_ms, heartbeat_s=config.heartbeat_ms / 1000,
            target=config.target, remind_before_ms=config.remind_before_ms)
        self.ref = self.start(actor_class, options)

    def collaborators(self, actor_class: type[pykka.Actor]) -> dict[str, Any]:
        """What `actor_class` is started with, as the tree would give it."""
        return {name: self.wired[name] for name in WIRED[actor_class]}

    def start(self, actor_class: type[A], options: dict[str, Any]) -> pykka.ActorRef[A]:
        """The actor's start, as the tree's: a subclass may add options of its own."""
        return actor_class.start(**{**self.collaborators(actor_class), **options},
                                 supervisor=self.fakes["supervisor"])


class RouterRig(WiredRig[QuestionRouter]):
    """A QuestionRouter run for real on a real Store, its own address a Slot bound to it
    (so its questions report back to it). Each question it starts is a FakeRef named
    for it (`rig.started[qid]`), unless `start_question` says otherwise. `config` keys
    (timeout_ms, max_open, ...) go to the settings; the rest are the Router's own."""

    def __init__(self, store: Store, *, config: dict[str, Any] | None = None,
                 **options: Any) -> None:
        self.store = store
        self.me = Slot("router")
        self.started: dict[str, list[tuple[QuestionSpec, str, FakeRef]]] = {}
        options.setdefault("start_question", self._fake_question)
        options.setdefault("question_restarts", 3)  # the tree's own bound
        options.setdefault("window_s", 10.0)
        super().__init__(QuestionRouter, store=store, config=bridge_config(**(config or {})),
                         addresses={"router": self.me}, **options)
        self.me.bind(self.ref)

    def _fake_question(self, spec: QuestionSpec, child: str) -> Any:
        question = FakeRef(child)
        self.started.setdefault(spec.qid, []).append((spec, child, question))
        return _FakeChild(question)

    def question(self, qid: str) -> FakeRef:
        """What the question for `qid` (its last start) has been told."""
        wait_for(lambda: qid in self.started, what=f"question {qid} started")
        return self.started[qid][-1][2]

    def admit(self, envelope: PromptEnvelope) -> str | None:
        """NewQuestion's verdict: None once it is stored (acked), else the nack's error."""
        verdict: concurrent.futures.Future[str | None] = concurrent.futures.Future()
        self.ref.tell(NewQuestion(envelope, verdict))
        return verdict.result(5.0)

    def opened(self, envelope: PromptEnvelope) -> tuple[QuestionSpec, str, FakeRef]:
        """Admit `envelope` (acked): the spec, name and fake of the question it runs."""
        assert self.admit(envelope) is None
        return self.started[envelope.msg_id][-1]

    def depth(self) -> int:
        """QueueDepthQuery's reply; handled in turn, so also a sign all told before is
        handled, and all it told meanwhile is in the FakeRefs."""
        return replied(self.ref, QueueDepthQuery)

    def close(self, qid: str, state: State | None, child: str, **stored: Any) -> None:
        """What a question does as it ends: its close stored (the one memory of how it
        ended), then said to the Router, with the answer file that closed it, if any."""
        self.store.close(qid, state, owner=child, **stored)
        self.ref.tell(QuestionClosed(qid, child, stored.get("answer_file")))


class _FakeChild:
    """What the Router binds a question's slot to in a RouterRig: a ref-like that tells
    the FakeRef, stops on demand, and is known by its name."""

    def __init__(self, fake: FakeRef) -> None:
        self.fake = fake
        self.actor_urn = fake.name
        self.actor_inbox = SimpleNamespace()  # takes the slot bound to it
        self.stops = 0

    def tell(self, message: Any) -> None:
        self.fake.tell(message)

    def stop(self, block: bool = True, timeout: float | None = None) -> None:
        self.stops += 1
        self.fake.tell("stopped")


# -- fake children for supervisor tests -----------------------------------------------


class Boom:
    """Makes a Recorder crash with a plain bug."""


@dataclass(frozen=True)
class Short:
    """Makes a Recorder crash as if the machine ran out of `errno`."""

    errno: int = errno.EMFILE


@dataclass(frozen=True)
class Hold:
    """Makes a Recorder wait, so that what is told meanwhile stays unread."""

    release: threading.Event = field(compare=False)


class Child(Supervised, pykka.ThreadingActor):
    """A supervised actor on a thread of its own: a fake child whose turns may block
    (Hold) without holding up the daemon's actors on the edge's thread."""

    use_daemon_thread = True


class Recorder(Child):
    """Forwards each message it reads, tagged with its incarnation, to `seen`."""

    def __init__(self, *, supervisor: Address, seen: FakeRef, name: str, incarnation: int) -> None:
        super().__init__(name, supervisor)
        self.seen = seen
        self.incarnation = incarnation

    def on_receive(self, message: Any) -> None:
        match message:
            case Boom():
                raise RuntimeError("boom")
            case Short(errno=code):
                raise OSError(code, "short")
            case Hold(release=release):
                release.wait(5)
            case _:
                self.seen.tell((self.incarnation, message))


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def thread_count() -> int:
    """The process's OS threads, as the kernel counts them (/proc/self/status)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no Threads line in /proc/self/status")


@contextlib.contextmanager
def actors_held() -> Iterator[None]:
    """The actors' thread (the shared edge's loop) waits while the block runs: what the
    block tells is all in the mailboxes before any of it is handled."""
    hold = threading.Event()
    shared_edge().call(hold.wait, 10)
    try:
        yield
    finally:
        hold.set()


SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def script(name: str) -> ModuleType:
    """A module of scripts/ (a folder, not a package), loaded afresh from its file, with
    its sibling scripts importable by name as when it runs."""
    if str(SCRIPTS) not in sys.path:
        sys.path.append(str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class NotifySocket:
    """The service manager's end: a datagram socket that records what it is told, and when."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.messages: queue.Queue[tuple[float, str]] = queue.Queue()
        self.seen: list[tuple[float, str]] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(path))
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            self.messages.put((time.monotonic(), data.decode()))

    def next(self, timeout: float = 10.0) -> tuple[float, str]:
        item = take(self.messages, timeout, f"no datagram within {timeout}s; saw {self.seen}")
        self.seen.append(item)
        return item

    def until(self, field: str, timeout: float = 10.0) -> tuple[float, str]:
        deadline = time.monotonic() + timeout
        while True:
            at, text = self.next(max(0.01, deadline - time.monotonic()))
            if field in text.split("\n"):
                return at, text

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        self._thread.join(timeout=2)

    def sync(self) -> list[str]:
        """Every datagram sent to it so far: a marker sent after them comes after them."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as marker:
            marker.sendto(b"MARK", str(self.path))
        seen: list[str] = []
        while (text := self.next()[1]) != "MARK":
            seen.append(text)
        return seen


class Settles:
    """The store as the Peer uses it: each `settle` (the response is no longer owed)
    recorded as (qid, owner), or refused with `fails`; `owed` is its outbox (what a start
    sends), and a response is owed until settled."""

    def __init__(self, fails: Exception | None = None,
                 owed: list[SendResponse] | None = None) -> None:
        self.settled: list[tuple[str, str | None]] = []
        self.settle_fails = fails
        self.owed = owed or []

    def outbox(self) -> list[SendResponse]:
        return [r for r in self.owed if (r.prompt.msg_id, r.owner) not in self.settled]

    def response_owed(self, qid: str, owner: str) -> bool:
        return (qid, owner) not in self.settled

    def settle(self, qid: str, owner: str | None = None) -> None:
        if self.settle_fails is not None:
            raise self.settle_fails
        self.settled.append((qid, owner))


class PeerRig(WiredRig[PeerActor]):
    """A PeerActor on `identity`, its collaborators FakeRefs (`rig.router`, `rig.logger`,
    `rig.supervisor`), its store a Settles (`rig.store`). The router answers each
    QueueDepthQuery at once with `depth` (None: it records them, for the test to answer)
    and what else `answers` says (FakeRef's `answers`, overriding the depth's)."""

    def __init__(self, identity: PeerIdentity, *, depth: int | None = 2,
                 answers: Mapping[type, Callable[[Any], None]] | None = None,
                 heartbeat_ms: float = 30_000, store: Settles | None = None,
                 addresses: dict[str, Address] | None = None, **options: Any) -> None:
        self.identity = identity
        self.store = store or Settles()
        told: dict[type, Callable[[Any], None]] = {}
        if depth is not None:
            count = depth
            told[QueueDepthQuery] = lambda query: query.reply(count)
        router = FakeRef("router", answers={**told, **(answers or {})})
        super().__init__(PeerActor, store=self.store,
                         config=bridge_config(heartbeat_ms=heartbeat_ms),
                         addresses={"router": router, **(addresses or {})},
                         identity=identity, **options)

    def ready(self) -> PeerRig:
        """Once the entry is published: the socket answers from then on (W7)."""
        wait_for(self.identity.entry_path.exists, what="registry entry")
        return self

    @property
    def endpoint(self) -> Path:
        return self.identity.endpoint

    def send(self, data: bytes) -> bytes:
        return exchange(self.identity.endpoint, data)

    def respond(self, endpoint: Path | str, response: Any, error: str | None = None,
                owner: str | None = None) -> None:
        prompt = prompt_envelope(sender_endpoint=str(endpoint))
        self.ref.tell(SendResponse(prompt, response, error, owner=owner))

    @property
    def listener(self) -> Listener:
        listener = self.actor._listener
        assert listener is not None
        return listener


def exchange(endpoint: Path | str, data: bytes, *, half_close: bool = False) -> bytes:
    """Send `data`, read until the peer closes: the whole reply, so extra lines would show."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(5)
        conn.connect(str(endpoint))
        try:
            conn.sendall(data)
            if half_close:
                conn.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the peer may drop an oversize sender mid-write; its reply is already queued
        reply = b""
        while True:
            try:
                chunk = conn.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                return reply
            reply += chunk
        return reply


def in_forked_child(work: Callable[[], object]) -> str:
    """The repr of what `work` returns, or the error it raises, run in a forked child: for
    what a test must not do to its own process (become another user, lead a session).
    Forked, not started anew, so that it runs the code exactly as this process loaded it."""
    reading, writing = os.pipe()
    child = os.fork()
    if child == 0:  # the child reports through the pipe, and never returns
        try:
            os.close(reading)
            try:
                result = repr(work())
            except BaseException as error:
                result = f"{type(error).__name__}: {error}"
            os.write(writing, result.encode())
        finally:
            os._exit(0)
    os.close(writing)
    with os.fdopen(reading, "rb") as pipe:
        result = pipe.read().decode()
    os.waitpid(child, 0)
    return result
