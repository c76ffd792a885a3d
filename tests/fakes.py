"""Test doubles for collaborator actors: a ref that records what it is told."""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pykka

from coms_hermes_bridge.actors.base import Supervised
from coms_hermes_bridge.actors.edge import shared_edge
from coms_hermes_bridge.actors.router import QuestionRouter
from coms_hermes_bridge.actors.store import Store
from coms_hermes_bridge.messages.commands import (
    Address,
    NewQuestion,
    QueueDepthQuery,
    StartQuestion,
)
from coms_hermes_bridge.messages.wire import PromptEnvelope

T = TypeVar("T")


class FakeRef:
    """Records every `tell` in a queue, as a stand-in for a collaborator's address."""

    def __init__(self, name: str = "fake") -> None:
        self.name = name
        self.inbox: queue.Queue[Any] = queue.Queue()
        self.seen: list[Any] = []

    def tell(self, message: Any) -> None:
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
        try:
            message = self.inbox.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.name}: nothing told within {timeout}s") from None
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


def handled(ref: pykka.ActorRef[Any]) -> None:
    """Returns once the actor has handled everything told to it so far (a proxy's read
    is a message too, read in turn), and so told all it would tell for it: after it,
    an absence needs no waiting (`FakeRef.assert_nothing`). Raises ActorDeadError for
    an actor that has stopped."""
    ref.proxy().actor_urn.get(timeout=5)


def edge_caught_up() -> None:
    """Returns once the edge's loop has run every callback that was ready when this was
    called: inotify's read of the events of every change made before, say, or what a
    connection's task does after its reply. A call from another thread may run ahead
    of the I/O that its own wake-up finds, so the sign is given one loop iteration
    later, after that I/O's callbacks."""
    loop = shared_edge().loop
    done = threading.Event()
    loop.call_soon_threadsafe(loop.call_soon, done.set)
    assert done.wait(5), "the edge's loop stalled"


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


class RouterRig:
    """A QuestionRouter run for real on a real Store; each collaborator is a FakeRef
    named for its role. `options` are the Router's own (timeout_ms and run_tag at least).
    """

    def __init__(self, store: Store, **options: Any) -> None:
        self.store = store
        self.supervisor = FakeRef("supervisor")
        self.questions = FakeRef("questions")
        self.peer = FakeRef("peer")
        self.delivery = FakeRef("delivery")
        self.watcher = FakeRef("watcher")
        self.logger = FakeRef("logger")
        self.ref: pykka.ActorRef[QuestionRouter] = QuestionRouter.start(
            supervisor=self.supervisor, questions=self.questions, peer=self.peer,
            delivery=self.delivery, watcher=self.watcher, logger=self.logger, store=store,
            **options,
        )

    def admit(self, envelope: PromptEnvelope) -> str | None:
        """NewQuestion's reply: None once it is stored (acked), else the nack's error."""
        reply: str | None = replied(self.ref, functools.partial(NewQuestion, envelope))
        return reply

    def opened(self, envelope: PromptEnvelope) -> StartQuestion:
        """Admit `envelope` (acked) and return the StartQuestion that runs it."""
        assert self.admit(envelope) is None
        return self.questions.expect(StartQuestion)

    def depth(self) -> int:
        """QueueDepthQuery's reply; handled in turn, so also a sign all told before is
        handled, and all it told meanwhile is in the FakeRefs."""
        return replied(self.ref, QueueDepthQuery)

    @property
    def router(self) -> QuestionRouter:
        actor = self.ref._actor_weakref()  # white-box: the table
        assert actor is not None
        return actor


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


class FakeSchedule:
    """Records delayed restarts instead of running them; `fire()` runs the oldest."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self._actions: list[Callable[[], None]] = []

    def __call__(self, delay: float, action: Callable[[], None]) -> Callable[[], None]:
        self.delays.append(delay)
        self._actions.append(action)
        return lambda: None

    def fire(self) -> None:
        self._actions.pop(0)()


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
