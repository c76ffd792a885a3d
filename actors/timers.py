"""One timer service for every deadline: a heap and one thread.

A `threading.Timer` per open question is a sleeping OS thread per question;
this service keeps all deadlines in one heap, ordered by when they are due
(ties in the order they were set), and one daemon thread fires them. An
action runs on that thread, so it must be quick and must not raise: a `tell`.

Deadlines are absolute on the service's clock (wall time by default, as the
questions' deadlines are stored), so a deadline that outlives a restart fires
at the same moment it would have. The thread never sleeps more than
`MAX_WAIT_S` at a time and looks at the clock again when it wakes, so a clock
that jumps (a suspend, a time adjustment) delays a deadline by at most that.
Cancelling is O(1): the entry is marked and skipped when it comes up; the heap
is rebuilt when more than half of it is cancelled, so it stays bounded by the
live timers.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable

__all__ = ["MAX_WAIT_S", "TimerHandle", "TimerService", "shared_timers"]

MAX_WAIT_S = 1.0


class TimerHandle:
    """One scheduled action; `cancel()` makes sure it does not run (if it has not yet)."""

    __slots__ = ("_service", "action", "cancelled", "when")

    def __init__(self, service: TimerService, when: float, action: Callable[[], None]) -> None:
        self._service = service
        self.when = when
        self.action = action
        self.cancelled = False

    def cancel(self) -> None:
        self._service._cancel(self)


class TimerService:
    """Deadlines on one heap, fired in order by one thread (started on first use)."""

    def __init__(self, clock: Callable[[], float] = time.time, name: str = "timers") -> None:
        self.clock = clock
        self.name = name
        self._heap: list[tuple[float, int, TimerHandle]] = []
        self._seq = itertools.count()
        self._cancelled = 0
        self._cond = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None

    def at(self, when: float, action: Callable[[], None]) -> TimerHandle:
        """Run `action` once the clock reads `when` or later (at once if it already does)."""
        handle = TimerHandle(self, when, action)
        with self._cond:
            heapq.heappush(self._heap, (when, next(self._seq), handle))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            if self._heap[0][2] is handle:  # a new earliest deadline: wake the thread
                self._cond.notify()
        return handle

    def after(self, delay: float, action: Callable[[], None]) -> TimerHandle:
        """Run `action` `delay` seconds from now."""
        return self.at(self.clock() + delay, action)

    def schedule(self, delay: float, action: Callable[[], None]) -> Callable[[], None]:
        """`after` in the shape the supervisors take: returns the function that cancels."""
        return self.after(delay, action).cancel

    def __len__(self) -> int:
        """Timers set and not yet fired or cancelled."""
        with self._cond:
            return len(self._heap) - self._cancelled

    def _cancel(self, handle: TimerHandle) -> None:
        with self._cond:
            if handle.cancelled:
                return
            handle.cancelled = True
            if handle.action is _fired:
                return  # already ran (or is running): nothing is left in the heap
            handle.action = _fired
            self._cancelled += 1
            if self._cancelled > 64 and self._cancelled * 2 > len(self._heap):
                self._heap = [entry for entry in self._heap if not entry[2].cancelled]
                heapq.heapify(self._heap)
                self._cancelled = 0

    def _due(self) -> Callable[[], None]:
        """Wait for the earliest live deadline to come; pop it and return its action."""
        with self._cond:
            while True:
                while self._heap and self._heap[0][2].cancelled:
                    heapq.heappop(self._heap)
                    self._cancelled -= 1
                if not self._heap:
                    self._cond.wait()
                    continue
                when, _, handle = self._heap[0]
                wait = when - self.clock()
                if wait <= 0:
                    heapq.heappop(self._heap)
                    action, handle.action = handle.action, _fired
                    return action
                self._cond.wait(min(wait, MAX_WAIT_S))

    def _run(self) -> None:
        while True:
            action = self._due()
            try:
                action()
            except Exception as exc:  # one bad action must not stop every other deadline
                from .base import report

                report(f"{self.name}: a timer action failed: {exc!r}")


def _fired() -> None:
    """Nothing: stands in for an action that has run or was cancelled."""


_SHARED: TimerService | None = None
_SHARED_LOCK = threading.Lock()


def shared_timers() -> TimerService:
    """The process's timer service (wall clock), made on first use."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = TimerService()
        return _SHARED
