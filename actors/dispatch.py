"""Many actors, no thread each: a pykka actor whose turns run on the I/O edge's loop.

A `PooledActor` is a pykka actor in every way its callers can see: it has its
own mailbox, its own state, an `ActorRef` for `tell`/`ask`/`stop`, a place in
the `ActorRegistry`, and `on_start`/`on_stop`/`on_failure` with the meaning
they have for `pykka.ThreadingActor`. What differs is where its code runs.
A ThreadingActor owns an OS thread that blocks on its mailbox; with thousands
of open questions that is thousands of sleeping threads. A PooledActor's
mailbox instead asks its `Dispatcher` to run the actor for one turn whenever
it holds a message and is not already scheduled, as Akka's dispatchers do. A
turn handles up to `throughput` messages, in mailbox order, and gives the
thread back, so a busy actor cannot starve the others.

The turns run on the event loop of the I/O edge (actors/edge.py), between
its socket and timer callbacks: one thread for the actors and the I/O. Measured
against a dispatcher thread of its own beside the loop (docs/architecture.md,
"The I/O edge"): 0.81x the CPU per question and 0.84x the time for 1,000
answers, because two busy threads hand CPython's interpreter lock to each other
at nearly every step. The price is that a turn that blocks holds up the
sockets too; what a turn may block on is short and local (a SQLite write,
a file of at most 64 KiB, one log append).

The guarantees are the ones an actor needs: one turn at a time per actor
(the mailbox is scheduled, or being run, at most once), its messages handled
in the order they were put, `on_start` before the first message, and after a
failure or a stop nothing more of its code runs; what was still in its
mailbox stays readable there (`actor_inbox.empty()/get()`), so a supervised
actor can hand it over from `on_failure`, as it does on a thread of its own.
A turn must never wait for another pooled actor (an ask, a blocking stop):
that actor's turn would run on this same thread, after this one.

pykka internals relied on (pinned in setup.cfg, exercised by
tests/test_dispatch.py): the `ActorInbox` protocol (`put`, `get`, `empty`);
`Actor._create_actor_inbox`, `_create_future` and `_start_actor_loop`, the
three hooks pykka leaves for new runtimes; `Actor._actor_loop_setup`,
`_actor_loop_teardown`, `_handle_receive`, `_handle_failure` and `_stop`;
`pykka._envelope.Envelope` (`message`, `reply_to`).
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from typing import TYPE_CHECKING, Any, ClassVar

import pykka
from pykka import ActorRegistry, ThreadingFuture

from .edge import Edge, report, shared_edge

if TYPE_CHECKING:
    from pykka._actor import ActorInbox
    from pykka._envelope import Envelope

__all__ = ["Dispatcher", "PooledActor", "shared_dispatcher"]

DEFAULT_THROUGHPUT = 8


class Dispatcher:
    """Runs actor turns on an edge's loop, in the order the actors became ready.

    An actor that was just told something waits for the others' turns, and its
    mail piles up meanwhile, so its next turn handles several messages at once
    (the Logger writes them in one batch, say). Serving the long-lived actors
    first was tried and undone: each then ran for one message at a time, and
    the answers took 70 % longer.
    """

    def __init__(self, edge: Edge | None = None, name: str = "actors") -> None:
        self.edge = edge or shared_edge()
        self.name = name

    def submit(self, inbox: PoolInbox) -> None:
        """Queue one turn for the actor behind `inbox` (its caller made sure it is not queued)."""
        self.edge.call(self._turn, inbox)

    def _turn(self, inbox: PoolInbox) -> None:
        try:
            inbox.run_turn()
        except BaseException as exc:  # a bug in the turn machinery itself; keep the loop
            report(f"{self.name}: a turn failed outside its actor: {exc!r}")


_SHARED: Dispatcher | None = None
_SHARED_LOCK = threading.Lock()


def shared_dispatcher() -> Dispatcher:
    """The process's default dispatcher, on the process's edge, made on first use."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = Dispatcher()
        return _SHARED


class PoolInbox:
    """An actor's mailbox that schedules a turn on its dispatcher when it has mail.

    `get` never blocks: the actor only reads when a turn runs, or when it
    drains what is left at failure or stop. Putting is never refused (as
    pykka's unbounded queue), so a `tell` does not block its caller.
    """

    __slots__ = ("__weakref__", "_actor", "_dispatcher", "_lock", "_queue", "_scheduled")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Made when mail comes and dropped when it is read: an empty deque costs
        # over 600 bytes, and thousands of questions sit with empty mailboxes.
        self._queue: deque[Envelope[Any]] | None = None
        self._actor: PooledActor | None = None
        self._dispatcher: Dispatcher | None = None
        self._scheduled = False

    def attach(self, actor: PooledActor, dispatcher: Dispatcher) -> None:
        """Start running `actor` (its on_start comes first, in the first turn)."""
        with self._lock:
            self._actor = actor
            self._dispatcher = dispatcher
            self._scheduled = True
        dispatcher.submit(self)

    def put(self, envelope: Envelope[Any], /) -> None:
        with self._lock:
            if self._queue is None:
                self._queue = deque()
            self._queue.append(envelope)
            if self._scheduled or self._dispatcher is None:
                return
            self._scheduled = True
            dispatcher = self._dispatcher
        dispatcher.submit(self)

    def get(self) -> Envelope[Any]:
        envelope = self.take()
        if envelope is None:
            raise IndexError("get from an empty mailbox")  # callers check empty() first
        return envelope

    def take(self) -> Envelope[Any] | None:
        with self._lock:
            queue = self._queue
            if not queue:
                return None
            envelope = queue.popleft()
            if not queue:
                self._queue = None
            return envelope

    def empty(self) -> bool:
        with self._lock:
            return not self._queue

    def qsize(self) -> int:
        with self._lock:
            return len(self._queue) if self._queue else 0

    def run_turn(self) -> None:
        """Run the actor once; then schedule it again if mail came, or mark it idle."""
        actor = self._actor
        assert actor is not None and self._dispatcher is not None
        actor._turn()  # the inbox is the actor's own runtime
        with self._lock:
            if not self._queue:
                self._scheduled = False
                return
        self._dispatcher.submit(self)  # still marked scheduled: nobody else submits it


class StopFlag:
    """`actor_stopped` for a pooled actor: a threading.Event's interface, without
    its Condition until someone waits.

    pykka makes a threading.Event per actor; its Condition's empty deque costs
    some 700 bytes, paid by every one of thousands of open questions although
    the runtime only ever calls `set` and `is_set`. A waiter (anyone may call
    `ref.actor_stopped.wait()`) gets a real Event, made on demand.
    """

    __slots__ = ("_event", "_flag")
    _lock = threading.Lock()  # one for all flags: only `set` and a first `wait` take it

    def __init__(self) -> None:
        self._flag = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        with StopFlag._lock:
            self._flag = True
            if self._event is not None:
                self._event.set()

    def clear(self) -> None:
        with StopFlag._lock:
            self._flag = False
            if self._event is not None:
                self._event.clear()

    def wait(self, timeout: float | None = None) -> bool:
        with StopFlag._lock:
            if self._flag:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)


class PooledActor(pykka.Actor):
    """A pykka actor that runs on a `Dispatcher` instead of a thread of its own.

    `dispatcher` picks the pool (the shared one by default); `throughput` is
    how many messages one turn may handle before the thread goes to another
    actor.
    """

    dispatcher: ClassVar[Dispatcher | None] = None
    throughput: ClassVar[int] = DEFAULT_THROUGHPUT

    _started = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # pykka made an Event and gave it to the ref; both get the flag instead,
        # before the actor is started or its ref handed out (start() does both later).
        stopped = StopFlag()
        self.actor_stopped = stopped  # type: ignore[assignment]
        self._actor_ref.actor_stopped = stopped  # type: ignore[assignment]

    @staticmethod
    def _create_actor_inbox() -> ActorInbox:
        return PoolInbox()

    @staticmethod
    def _create_future() -> pykka.Future[Any]:
        return ThreadingFuture()

    def _start_actor_loop(self) -> None:
        inbox = self.actor_inbox
        assert isinstance(inbox, PoolInbox)
        inbox.attach(self, self.dispatcher or shared_dispatcher())

    def _turn(self) -> None:
        """One turn: on_start the first time, then up to `throughput` messages.

        Mirrors pykka's ThreadingActor loop message for message, so the hooks
        keep their meaning: an exception from an ask goes to its caller, one
        from a tell stops the actor and calls on_failure, a BaseException stops
        every actor. Once stopped, what is left is torn down as pykka does
        (asks get ActorDeadError, a late stop is answered), also for mail that
        comes after the stop.
        """
        inbox = self.actor_inbox
        assert isinstance(inbox, PoolInbox)
        if not self._started:
            self._started = True
            self._actor_loop_setup()
        for _ in range(self.throughput):
            if self.actor_stopped.is_set():
                break
            envelope = inbox.take()
            if envelope is None:
                break
            self._handle_envelope(envelope)
        if self.actor_stopped.is_set():
            self._actor_loop_teardown()

    def _handle_envelope(self, envelope: Envelope[Any]) -> None:
        try:
            response = self._handle_receive(envelope.message)
            if envelope.reply_to is not None:
                envelope.reply_to.set(response)
        except Exception:
            if envelope.reply_to is not None:
                envelope.reply_to.set_exception()
            else:
                self._handle_failure(*sys.exc_info())
                try:
                    self.on_failure(*sys.exc_info())
                except Exception:
                    self._handle_failure(*sys.exc_info())
        except BaseException:
            self._stop()
            # never block a pool thread on other pooled actors' stops
            ActorRegistry.stop_all(block=False)
