"""The actor runtime: one event loop, in one thread, runs every actor's turns (but the root
supervisor's, which has a thread of its own) and every wait.

Questions are many and mostly idle, so no other actor holds a thread of its own: a
`PooledActor` is a pykka actor (mailbox, ref, registry, `on_start`/`on_stop`/
`on_failure` as pykka means them) whose mailbox asks the loop for a turn
whenever it has mail. Whatever waits on the world (sockets, hermes, inotify,
deadlines) waits on the same loop, so one thread does the turns and the I/O:
two busy threads handed CPython's interpreter lock back and forth at nearly
every step (docs/architecture.md measures it). The price is that a turn must
be short and must never wait for another pooled actor, whose turn comes after
its own on this same thread.

The loop's clock is CLOCK_BOOTTIME: a question's deadline, stored as wall time,
becomes a delay when its timer is set, and the default CLOCK_MONOTONIC stops
while the machine is suspended, so the deadline would fire late by as long.

Supervision plumbing lives here too: a `Slot` is a child's stable address
across restarts, and a `Supervised` actor that dies hands its unread mail (and
the work it had taken) to its supervisor, which decides by a `RestartPolicy`.
pykka internals relied on (pinned in setup.cfg): the `ActorInbox` protocol,
`Actor._create_actor_inbox`, `_create_future`, `_start_actor_loop`,
`_actor_loop_setup`, `_actor_loop_teardown`, `_handle_receive`,
`_handle_failure`, `_stop`, and `Envelope.message`/`reply_to`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import functools
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

import pykka
from pykka import ActorRegistry, ThreadingFuture

from ..messages.commands import Address, ChildFailed, RestartChild

if TYPE_CHECKING:
    from pykka._actor import ActorInbox
    from pykka._envelope import Envelope

T = TypeVar("T")
# what `Edge.spawn` gives: both kinds are done with the same calls, on the loop or not
Spawned = asyncio.Future[T] | concurrent.futures.Future[T]

# -- operator lines -------------------------------------------------------------

Level = Literal["error", "warning", "info"]
MAX_REPORT = 4000  # characters of one stderr line; hermes' stderr can be long
_PRIORITY = {"error": 3, "warning": 4, "info": 6}  # syslog's, for journald's `<N>` prefix
# Reentrant: the SIGUSR1 dump reports from a signal handler, which can run on a thread
# already inside report() (a handler runs between any two bytecodes of the main thread).
_REPORT_LOCK = threading.RLock()


def _stderr_is_journal() -> bool:
    """systemd names journald's stream in JOURNAL_STREAM (dev:inode)."""
    stream = os.environ.get("JOURNAL_STREAM")
    if not stream:
        return False
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return stream == f"{st.st_dev}:{st.st_ino}"


def report(message: str, level: Level | None = None) -> None:
    """One operator-facing line on stderr; never raises. The level word lets grep and
    journald pick out what needs a look; written whole under a lock, so lines from two
    threads never run together."""
    try:
        line = " ".join(message.splitlines())
        if len(line) > MAX_REPORT:
            line = line[: MAX_REPORT - 1] + "…"
        prefix = ""
        if level is not None:
            line = f"{level}: {line}"
            if _stderr_is_journal():
                prefix = f"<{_PRIORITY[level]}>"
        with _REPORT_LOCK:
            sys.stderr.write(f"{prefix}coms-hermes-bridge: {line}\n")
            sys.stderr.flush()
    except (OSError, ValueError):
        pass


class Episode:
    """A fault that may recur many times in a row: said when it begins (or its cause
    changes), and when it ends with how often it happened: two lines, not a flood."""

    __slots__ = ("cause", "count")

    def __init__(self) -> None:
        self.count = 0
        self.cause: object = None

    def happened(self, cause: object = None) -> bool:
        """Count one more; True when it is news: the first of the episode, or a new cause."""
        self.count += 1
        first, self.cause = self.count == 1 or cause != self.cause, cause
        return first

    def over(self) -> int:
        """End the episode: how many times it happened (0 when none was going on)."""
        count, self.count = self.count, 0
        return count


def utc_now() -> datetime:
    """The wall clock, injected into actors so tests can pin it."""
    return datetime.now(UTC)


_SHORTAGE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOSPC})


def is_resource_shortage(exc: BaseException | None) -> bool:
    """Did this crash come from the machine running short (fds, memory, disk, threads)?

    Restarting at once would fail the same way, so such a crash is retried with
    backoff and not counted as a crash loop. The cause chain is followed: wrappers
    ("cannot create ...: [Errno 24]") are common.
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, MemoryError):
            return True
        if isinstance(exc, OSError) and exc.errno in _SHORTAGE_ERRNOS:
            return True
        if isinstance(exc, RuntimeError) and "can't start new thread" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


# -- the loop -------------------------------------------------------------------


class _BootLoop(asyncio.SelectorEventLoop):
    def time(self) -> float:
        return time.clock_gettime(time.CLOCK_BOOTTIME)


class Edge:
    """The event loop and its thread (a daemon thread: the process never waits for it).
    One serves the process (`shared_edge()`); it is tied to no actor's life, so a
    restarted actor finds its sends, timers and processes running."""

    def __init__(self, name: str = "edge") -> None:
        self.name = name
        self.loop: asyncio.AbstractEventLoop = _BootLoop()
        self.loop.set_exception_handler(self._fault)
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def on_loop(self) -> bool:
        return self._thread is threading.current_thread()

    def call(self, fn: Callable[..., object], *args: Any) -> None:
        """Run `fn(*args)` on the loop, soon, in the order the calls were made."""
        if self.on_loop():
            self.loop.call_soon(fn, *args)
        else:
            self.loop.call_soon_threadsafe(fn, *args)

    def spawn(self, coro: Coroutine[Any, Any, T]) -> Spawned[T]:
        """Run a coroutine on the loop; a non-actor thread may wait on its future. From the
        loop itself, a task at once: the hand-over between threads was 6 % of the loop's
        time with 10,000 answers (measured)."""
        if self.on_loop():
            return self.loop.create_task(coro)
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def _fault(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """What a callback or task raised with nobody to see it: one line, never the loop."""
        exc = context.get("exception")
        report(f"{self.name}: {context['message']}" + (f": {exc!r}" if exc is not None else ""))


_SHARED_LOCK = threading.Lock()  # not functools.cache: two first callers would make two
_SHARED_EDGE: Edge | None = None


def shared_edge() -> Edge:
    """The process's edge, made on first use."""
    global _SHARED_EDGE
    with _SHARED_LOCK:
        if _SHARED_EDGE is None:
            _SHARED_EDGE = Edge()
        return _SHARED_EDGE


def later(delay: float, action: Callable[[], None]) -> None:
    """`action` on the shared edge `delay` seconds from this call, from any thread (a
    supervisor's schedule): due from when it was set, however long the loop takes to get
    to the call that sets it."""
    edge = shared_edge()
    loop = edge.loop
    edge.call(loop.call_at, loop.time() + delay, action)


def tell_quietly(ref: Address, message: Any) -> None:
    """From the loop: an actor that stopped meanwhile needs to hear nothing more."""
    with contextlib.suppress(pykka.ActorDeadError):
        ref.tell(message)


async def awaited(send: Callable[[Callable[[T], None]], None], timeout: float) -> T:
    """Hand `send` a reply callback (safe from any thread, at most once used) and wait on
    the loop for its value; TimeoutError after `timeout`. How an actor answers the edge:
    the message carries the callback, and no thread blocks in an ask."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(value: T) -> None:
        if not future.done():
            future.set_result(value)

    def reply(value: T) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(settle, value)

    send(reply)
    async with asyncio.timeout(timeout):
        return await future


# -- processes ------------------------------------------------------------------

@functools.cache
def spawner() -> concurrent.futures.ThreadPoolExecutor:
    """The one thread that starts processes (made at the first start): Popen blocks until
    the child has exec'd, and on the loop that stalled every socket meanwhile (acks 1.12x
    slower, measured). (actors/sends.py starts hermes' waiters on it.)"""
    return concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="edge-spawn")


def read_at_most(fd: int, limit: int) -> bytes | None:
    """Up to `limit` bytes from `fd`; None if there are more (the file grew past it). Kept
    here, the module every actor's turn runs in, so that reading an answer file takes no
    module of its own on a question's path (scripts/path_files.py)."""
    chunks: list[bytes] = []
    got = 0
    while got <= limit:
        chunk = os.read(fd, limit + 1 - got)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        got += len(chunk)
    return None


# -- actor turns on the loop ----------------------------------------------------

class PoolInbox:
    """A mailbox that asks its edge for a turn of its actor when mail comes, as Akka's
    dispatchers do: never more than one turn queued or running. `get` never blocks
    (the actor reads only in a turn, or drains what is left when it dies), and a put
    is never refused, so a `tell` never blocks its caller."""

    __slots__ = ("__weakref__", "_actor", "_edge", "_lock", "_queue", "_scheduled", "slot")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Made when mail comes, dropped when read: an empty deque costs over 600 bytes,
        # and thousands of questions sit with empty mailboxes.
        self._queue: deque[Envelope[Any]] | None = None
        self._actor: PooledActor | None = None
        self._edge: Edge | None = None
        self._scheduled = False
        self.slot: Slot | None = None  # the address that feeds it (see Supervised)

    def attach(self, actor: PooledActor, edge: Edge) -> None:
        """Start running `actor`: its first turn runs on_start, then the mail."""
        with self._lock:
            self._actor, self._edge, self._scheduled = actor, edge, True
        edge.call(self.run_turn)

    def put(self, envelope: Envelope[Any], /) -> None:
        with self._lock:
            if self._queue is None:
                self._queue = deque()
            self._queue.append(envelope)
            if self._scheduled or self._edge is None:
                return
            self._scheduled = True
            edge = self._edge
        edge.call(self.run_turn)

    def get(self) -> Envelope[Any]:  # its callers (pykka's teardown, _hand_over) ask empty() first
        return self.take()  # type: ignore[return-value]

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

    def run_turn(self) -> None:
        """One turn of the actor; then another is queued if mail came, else it is idle."""
        actor, edge = self._actor, self._edge
        assert actor is not None and edge is not None
        try:
            actor._turn()
        except BaseException as exc:  # a bug of the turn machinery itself: keep the loop,
            report(f"{edge.name}: a turn failed outside its actor: {exc!r}")
            with self._lock:  # and try again only when more mail comes, never in a spin
                self._scheduled = False
            return
        with self._lock:
            if not self._queue:
                self._scheduled = False
                return
        edge.call(self.run_turn)  # still marked scheduled: nobody else queues it


class StopFlag:
    """`actor_stopped` as a bare flag: pykka's Event costs some 700 bytes per actor, paid
    by each of thousands of questions, and pykka (4.1 to 4.5) only calls `set` and
    `is_set` on it; a blocking stop waits on its own future."""

    __slots__ = ("_flag",)

    def __init__(self) -> None:
        self._flag = False

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        self._flag = True


class PooledActor(pykka.Actor):
    """A pykka actor whose turns run on an edge's loop (the shared one unless `edge`
    says), at most `throughput` messages a turn so a busy actor starves nobody."""

    edge: ClassVar[Edge | None] = None
    throughput: ClassVar[int] = 8
    _started = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        stopped = StopFlag()  # before the actor starts or its ref is handed out
        self.actor_stopped = stopped  # type: ignore[assignment]
        self._actor_ref.actor_stopped = stopped  # type: ignore[assignment]

    @staticmethod
    def _create_actor_inbox() -> ActorInbox:
        return PoolInbox()

    @staticmethod
    def _create_future() -> pykka.Future[Any]:
        return ThreadingFuture()

    def _start_actor_loop(self) -> None:
        """pykka registers the actor before this runs: one that can never run must not
        stay registered, or a stop of every actor would wait for it forever."""
        inbox = self.actor_inbox
        assert isinstance(inbox, PoolInbox)
        try:
            inbox.attach(self, self.edge or shared_edge())
        except BaseException:
            ActorRegistry.unregister(self.actor_ref)
            raise

    def tell_later(self, delay: float, message: Any, to: Address | None = None
                   ) -> asyncio.TimerHandle:
        """Tell `to` (this actor by default) `message` after `delay`. In a turn only: the
        handle is the loop's, and only the loop may cancel it."""
        edge = self.edge or shared_edge()
        assert edge.on_loop(), "tell_later outside a turn"
        return edge.loop.call_later(delay, tell_quietly, to or self.actor_ref, message)

    def _turn(self) -> None:
        """pykka's actor loop cut into turns: on_start first, then at most `throughput`
        messages, each handled as pykka does, and pykka's teardown once stopped."""
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
            ActorRegistry.stop_all(block=False)  # never block the loop on pooled actors' stops


# -- supervision ----------------------------------------------------------------


class Slot:
    """A supervised child's stable address (collaborators hold it, never the ref).

    Deliveries and a dying child's detach (before it drains its mailbox) take the same
    lock, so a message told through the slot is either in the mailbox (and handed
    over) or held for the successor, never in a mailbox nobody reads."""

    __slots__ = ("_held", "_lock", "_ref", "_retired", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._ref: pykka.ActorRef[Any] | None = None
        self._held: list[Any] = []
        self._retired = False

    def tell(self, message: Any) -> None:
        with self._lock:
            if self._retired:
                return
            if self._ref is not None:
                try:
                    self._ref.tell(message)
                    return
                except pykka.ActorDeadError:
                    self._ref = None
            self._held.append(message)

    def bind(self, ref: pykka.ActorRef[Any], unread: tuple[Any, ...] = ()) -> None:
        """Point at a (new) child: `unread` first, then what was held. A child that died
        before it was bound leaves the rest held for the rebind its ChildFailed brings."""
        ref.actor_inbox.slot = self  # type: ignore[attr-defined]  # a PoolInbox or a Queue
        with self._lock:
            if self._retired:
                return
            pending, self._held, self._ref = [*unread, *self._held], [], ref
            for index, message in enumerate(pending):
                try:
                    ref.tell(message)
                except pykka.ActorDeadError:
                    self._ref, self._held = None, pending[index:]
                    return

    def detach(self, ref: pykka.ActorRef[Any]) -> None:
        """`ref` is dying: hold whatever is told from now on (if the slot still points at it)."""
        with self._lock:
            if self._ref is not None and self._ref.actor_urn == ref.actor_urn:
                self._ref = None

    def retire(self) -> None:
        """The child is gone for good: drop whatever is told to it from now on."""
        with self._lock:
            self._retired, self._ref = True, None
            self._held.clear()

    @property
    def ref(self) -> pykka.ActorRef[Any] | None:
        with self._lock:
            return self._ref


class Supervised(pykka.Actor):
    """An actor that, when it dies of an exception, tells its supervisor and hands over
    the work it had not done. Its runtime comes from the concrete class (`PooledChild`
    for the daemon's actors; a test's fake child may have a thread of its own)."""

    def __init__(self, name: str, supervisor: Address) -> None:
        super().__init__()
        self.child_name = name
        self.supervisor = supervisor

    def begin(self) -> None:
        """Take over this actor's resources, in its first turn, before any message."""

    def release(self) -> None:
        """Free what this actor owns; on stop and after a crash, so a successor can take
        the same resources. It must not raise."""

    def taken(self) -> tuple[Any, ...]:
        """Work taken out of the mailbox and not finished at a crash: handed over first."""
        return ()

    def on_start(self) -> None:
        # pykka stops an actor whose on_start raises without on_failure: say it here
        try:
            self.begin()
        except Exception as exc:
            # dead first, as pykka is before on_failure: nothing told from now on is
            # accepted into a mailbox about to be dropped
            pykka.ActorRegistry.unregister(self.actor_ref)
            self.actor_stopped.set()
            self.on_failure(type(exc), exc, exc.__traceback__)
            raise

    def on_stop(self) -> None:
        self.release()

    def on_failure(self, exception_type: type[BaseException] | None,
                   exception_value: BaseException | None,
                   traceback: TracebackType | None) -> None:
        try:
            self.release()
        finally:
            self._hand_over(exception_value)

    def _hand_over(self, exc: BaseException | None) -> None:
        slot = getattr(self.actor_inbox, "slot", None)
        if slot is not None:  # from here on, what is told through the slot is held
            slot.detach(self.actor_ref)
        try:
            unread: list[Any] = list(self.taken())
        except Exception:  # must not keep the mailbox from being handed over
            unread = []
        while not self.actor_inbox.empty():
            envelope = self.actor_inbox.get()
            if envelope.reply_to is None:
                unread.append(envelope.message)
            else:  # an ask: its caller must not wait for an answer that won't come
                envelope.reply_to.set_exception(
                    exc_info=(pykka.ActorDeadError, pykka.ActorDeadError(self.child_name), None))
        self.supervisor.tell(ChildFailed(self.child_name, f"{type(exc).__name__}: {exc}",
                                         tuple(unread), is_resource_shortage(exc)))


class PooledChild(Supervised, PooledActor):
    """A supervised actor whose turns run on the shared loop: every actor of the daemon
    but the root. Its turns must be short (what waits, waits on the loop)."""


# (delay in seconds, what to run then)
Schedule = Callable[[float, Callable[[], None]], None]
BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 30.0


class Intensity:
    """OTP's MaxR restarts in MaxT seconds, on an injected clock."""

    __slots__ = ("_times", "clock", "max_restarts", "window_s")

    def __init__(self, max_restarts: int, window_s: float, clock: Callable[[], float]) -> None:
        self.max_restarts, self.window_s, self.clock = max_restarts, window_s, clock
        self._times: list[tuple[float, str]] = []  # a list: one per question, no deque's bytes

    def allow(self, who: str) -> bool:
        """Record one restart (of `who`) now; False when it is one too many in the window."""
        now = self.clock()
        while self._times and now - self._times[0][0] >= self.window_s:
            del self._times[0]
        self._times.append((now, who))
        return len(self._times) <= self.max_restarts

    def verdict(self) -> str:
        """Who crashed how often, and how fast: the operator's line when it gives up."""
        whos = {who for _, who in self._times}
        window = f"{self.window_s:g}s"
        if len(whos) == 1:
            return f"{whos.pop()} crashed {len(self._times)} times within {window}"
        last = self._times[-1][1] if self._times else "?"
        who = ", ".join(sorted(whos))
        return f"{len(self._times)} crashes within {window} ({who}; last {last})"


class Backoff:
    """Per child, delays doubling from `first_s` to `max_s`; an episode (one stderr line)
    ends once the child has gone `max_s` past its last delay without another shortage."""

    def __init__(self, clock: Callable[[], float], first_s: float = BACKOFF_FIRST_S,
                 max_s: float = BACKOFF_MAX_S) -> None:
        self.clock, self.first_s, self.max_s = clock, first_s, max_s
        self._state: dict[str, tuple[int, float, float]] = {}  # id -> (attempt, at, delay)

    def next(self, child: str) -> tuple[float, bool]:
        """The delay before the next restart of `child`, and whether a new episode began."""
        now = self.clock()
        attempt, at, delay = self._state.get(child, (0, 0.0, 0.0))
        fresh = child not in self._state or now - at > delay + self.max_s
        attempt = 0 if fresh else attempt + 1
        delay = min(self.first_s * (2**attempt), self.max_s)
        self._state[child] = (attempt, now, delay)
        return delay, fresh

    def forget(self, child: str) -> None:
        self._state.pop(child, None)


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Past the intensity: not restarted; `verdict` says who crashed how often."""

    verdict: str


class RestartPolicy:
    """The restart decision both supervisors make.

    A shortage comes back after a backoff (said once per episode) and is not
    counted; any other crash counts toward an intensity (one over all children for
    the root, one per child for questions) and comes back at once, or never past
    its bound. A restart put off is a RestartChild told later, never a sleep, and
    never cancelled: one that comes too late (the child closed, its supervisor
    stopped or gave up) is let be where it is read.
    """

    def __init__(self, max_restarts: int, window_s: float, clock: Callable[[], float],
                 schedule: Schedule, *, per_child: bool) -> None:
        self.max_restarts, self.window_s, self.clock = max_restarts, window_s, clock
        self.schedule = schedule
        self.backoff = Backoff(clock)
        self._shared = None if per_child else Intensity(max_restarts, window_s, clock)
        self._each: dict[str, Intensity] = {}

    def crashed(self, child: str, error: str, unread: tuple[Any, ...], shortage: bool,
                me: Address, who: str | None = None) -> Literal["now", "later"] | GiveUp:
        """Restart `child` "now", "later" (RestartChild(child, unread) comes to `me` after
        the backoff) or never (GiveUp). `who` names it in the verdict, if not its name."""
        if shortage:
            delay, fresh = self.backoff.next(child)
            if fresh:
                report(f"{child} ran short of a resource ({error}); restarting it with backoff "
                       f"from {self.backoff.first_s:g}s up to {self.backoff.max_s:g}s", "warning")
            self.schedule(delay, functools.partial(tell_quietly, me, RestartChild(child, unread)))
            return "later"
        self.backoff.forget(child)
        intensity = self._shared or self._each.setdefault(
            child, Intensity(self.max_restarts, self.window_s, self.clock))
        if not intensity.allow(who or child):
            return GiveUp(intensity.verdict())
        report(f"{child} crashed ({error}); restarting it", "warning")
        return "now"

    def forget(self, child: str) -> None:
        """`child` is gone for good: its history."""
        self.backoff.forget(child)
        self._each.pop(child, None)
