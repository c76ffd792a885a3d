"""Supervision: a child's stable address (`Slot`), the supervised actor, and the restart
rule (MaxR restarts in MaxT seconds, then give up).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

import pykka

from ..messages.commands import Address, ChildFailed, RestartChild
from .loop import is_resource_shortage, report, tell_quietly
from .turns import PooledActor

if TYPE_CHECKING:
    pass
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

