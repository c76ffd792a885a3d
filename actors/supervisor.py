"""The root supervisor: starts its children from child specs and restarts what crashes.

Shaped like an OTP supervisor with the `one_for_one` strategy. It holds no
business state (no questions, no files): only the specs, one slot per child,
the restart history and the pending backoff timers. Everything it does is
driven by messages, so it is tested with fake children and a fake clock.

- **Restart types.** `permanent` children are always restarted after a crash,
  `transient` ones too (a crash is never a normal exit; a child that stops
  normally sends nothing), `temporary` ones never.
- **Intensity.** One bound over all children, as OTP's MaxR in MaxT: more than
  `max_restarts` restarts within `window_s` seconds means a crash loop, and
  the daemon gives up (`on_fatal`), so that its service manager starts it
  afresh.
- **Resource shortages** (out of file descriptors, threads, memory or disk)
  are not crash loops: restarting at once would fail the same way. Such a
  child is restarted after an exponential backoff (0.1 s doubling up to 30 s),
  reported once per episode, and its restarts are not counted. The delay is a
  message scheduled for later, never a sleep in the supervisor's turn.
- **Hand-over.** A crashed child's unread messages (and the work it had taken
  out of its mailbox) come back in its ChildFailed and are replayed, in order,
  to its successor ahead of anything told to the slot meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

import pykka

from ..messages.commands import Address, ChildFailed, RestartChild, UnknownMessage
from .base import Slot, is_resource_shortage, report
from .edge import shared_edge

Restart = Literal["permanent", "transient", "temporary"]

# (delay in seconds, what to run then) -> a function that cancels it
Schedule = Callable[[float, Callable[[], None]], Callable[[], None]]

BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 30.0


def timer_schedule(delay: float, action: Callable[[], None]) -> Callable[[], None]:
    """The default scheduler: a timer on the process's I/O edge (actors/edge.py)."""
    return shared_edge().schedule(delay, action)


@dataclass(frozen=True)
class ChildSpec:
    """How to start one child: `start(supervisor, incarnation)` returns its ref.

    `incarnation` counts starts from 0, so a child can tell its first start
    (resume what the last run left) from a restart. Children are started in
    the order of the specs and stopped in the reverse order, each given
    `shutdown_s` to finish.
    """

    slot: Slot
    start: Callable[[Address, int], pykka.ActorRef[Any]]
    restart: Restart = "permanent"
    shutdown_s: float = 1.0

    @property
    def id(self) -> str:
        return self.slot.name


class Intensity:
    """MaxR restarts in MaxT seconds, over a monotonic clock; pure and injectable."""

    __slots__ = ("_times", "clock", "max_restarts", "window_s")

    def __init__(self, max_restarts: int, window_s: float, clock: Callable[[], float]) -> None:
        self.max_restarts = max_restarts
        self.window_s = window_s
        self.clock = clock
        # A list, not a deque: it holds at most a few entries, and one Intensity
        # per open question must not cost an empty deque's 600 bytes each.
        self._times: list[tuple[float, str]] = []

    def allow(self, who: str) -> bool:
        """Record one restart (of `who`) now; False when it is one too many in the window."""
        now = self.clock()
        while self._times and now - self._times[0][0] >= self.window_s:
            del self._times[0]
        self._times.append((now, who))
        return len(self._times) <= self.max_restarts

    def verdict(self) -> str:
        """Why the bound was passed, for the operator: who crashed how often, and how fast."""
        whos = {who for _, who in self._times}
        window = f"{self.window_s:g}s"
        if len(whos) == 1:
            return f"{whos.pop()} crashed {len(self._times)} times within {window}"
        last = self._times[-1][1] if self._times else "?"
        names = ", ".join(sorted(whos))
        return f"{len(self._times)} crashes within {window} ({names}; last {last})"


class Backoff:
    """Delays for restarts after resource shortages, per child, with episodes.

    The delay doubles from `first_s` up to `max_s`. An episode (one stderr
    line) ends when the child has gone `max_s` past its last delay without
    another shortage.
    """

    def __init__(
        self,
        clock: Callable[[], float],
        first_s: float = BACKOFF_FIRST_S,
        max_s: float = BACKOFF_MAX_S,
    ) -> None:
        self.clock = clock
        self.first_s = first_s
        self.max_s = max_s
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
    """Past the intensity: the child is not restarted; `verdict` says who crashed how often."""

    verdict: str


class RestartPolicy:
    """The one restart decision both supervisors make, and the restarts it put off.

    A crash from a resource shortage comes back after a backoff (reported once
    per episode) and is not counted; any other crash counts toward an
    intensity (one over all children for the root, one per child for the
    question supervisor) and comes back at once, or never past its bound. A
    restart put off is a RestartChild told to the supervisor later, never a
    sleep in its turn.
    """

    def __init__(self, max_restarts: int, window_s: float, clock: Callable[[], float],
                 schedule: Schedule, *, per_child: bool) -> None:
        self.max_restarts = max_restarts
        self.window_s = window_s
        self.clock = clock
        self.schedule = schedule
        self.backoff = Backoff(clock)
        self._shared = None if per_child else Intensity(max_restarts, window_s, clock)
        self._each: dict[str, Intensity] = {}
        self._pending: dict[str, Callable[[], None]] = {}

    def crashed(self, child: str, error: str, unread: tuple[Any, ...], shortage: bool,
                me: Address, who: str | None = None) -> Literal["now", "later"] | GiveUp:
        """Restart `child` "now", or GiveUp: never. A shortage's restart is "later":
        RestartChild(child, unread) comes to `me` after the backoff. `who` names the
        child in the verdict, if not by its name."""
        if shortage:
            delay, fresh = self.backoff.next(child)
            if fresh:
                report(f"{child} ran short of a resource ({error}); restarting it with backoff "
                       f"from {self.backoff.first_s:g}s up to {self.backoff.max_s:g}s", "warning")
            self._pending[child] = self.schedule(
                delay, lambda: me.tell(RestartChild(child, unread)))
            return "later"
        self.backoff.forget(child)
        intensity = self._shared or self._each.setdefault(
            child, Intensity(self.max_restarts, self.window_s, self.clock))
        if not intensity.allow(who or child):
            return GiveUp(intensity.verdict())
        report(f"{child} crashed ({error}); restarting it", "warning")
        return "now"

    def restarting(self, child: str) -> None:
        """The put-off restart of `child` is here."""
        self._pending.pop(child, None)

    def forget(self, child: str) -> None:
        """`child` is gone for good: its history and any restart put off with it."""
        self.backoff.forget(child)
        self._each.pop(child, None)
        cancel = self._pending.pop(child, None)
        if cancel is not None:
            cancel()

    def cancel_all(self) -> None:
        for cancel in self._pending.values():
            cancel()
        self._pending.clear()


class RootSupervisor(pykka.ThreadingActor):
    """one_for_one over child specs; the only business it knows is how to start them."""

    use_daemon_thread = True

    def __init__(
        self,
        *,
        specs: Sequence[ChildSpec],
        on_fatal: Callable[[str], None],
        max_restarts: int,
        window_s: float,
        clock: Callable[[], float] = time.monotonic,
        schedule: Schedule = timer_schedule,
    ) -> None:
        super().__init__()
        self.specs = {spec.id: spec for spec in specs}
        self.order = [spec.id for spec in specs]
        self.on_fatal = on_fatal
        self.policy = RestartPolicy(max_restarts, window_s, clock, schedule, per_child=False)
        self.incarnations: dict[str, int] = {}
        self._failed = False

    # -- life ---------------------------------------------------------------

    def on_start(self) -> None:
        for child in self.order:
            self._start(child, ())

    def on_stop(self) -> None:
        # No message is handled after this (pykka): no crash of a child stopped here
        # can restart it.
        self.policy.cancel_all()
        for child in reversed(self.order):
            spec = self.specs[child]
            ref = spec.slot.ref
            spec.slot.retire()
            if ref is not None:
                try:
                    ref.stop(block=True, timeout=spec.shutdown_s)
                except (pykka.ActorDeadError, pykka.Timeout):
                    pass

    def on_failure(
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._fatal(f"supervisor failed: {exception_value!r}")

    # -- messages -----------------------------------------------------------

    def on_receive(self, message: Any) -> Any:
        match message:
            case ChildFailed(child=child, error=error, unread=unread, shortage=shortage):
                self._child_failed(child, error, unread, shortage)
            case RestartChild(child=child, unread=unread):
                self.policy.restarting(child)
                if not self._failed:
                    self._start(child, unread)
            case _:
                raise UnknownMessage("supervisor", message)
        return None

    def _child_failed(
        self, child: str, error: str, unread: tuple[Any, ...], shortage: bool
    ) -> None:
        spec = self.specs.get(child)
        if spec is None or self._failed:
            return
        if spec.restart == "temporary":
            report(f"{child} crashed ({error}); not restarted", "warning")
            spec.slot.retire()
            return
        verdict = self.policy.crashed(child, error, unread, shortage, self.actor_ref)
        if isinstance(verdict, GiveUp):
            self._fatal(f"{verdict.verdict}; last error: {error}")
        elif verdict == "now":
            self._start(child, unread)

    def _start(self, child: str, unread: tuple[Any, ...]) -> None:
        spec = self.specs[child]
        incarnation = self.incarnations.get(child, 0)
        self.incarnations[child] = incarnation + 1
        try:
            ref = spec.start(self.actor_ref, incarnation)
        except Exception as exc:  # e.g. no thread for it: the same as a crash at start
            error = f"{type(exc).__name__}: {exc}"
            self._child_failed(child, error, unread, is_resource_shortage(exc))
            return
        spec.slot.bind(ref, unread)

    def _fatal(self, reason: str) -> None:
        if not self._failed:
            self._failed = True
            report(reason, "error")
            self.on_fatal(reason)
