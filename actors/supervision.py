"""Supervision: a child's stable address (`Slot`), the supervised actor, and the restart
rule (MaxR in MaxT). A restart is a start: the child rebuilds from the store in `begin()`;
its unread mail is lost, as in OTP.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

import pykka

from ..messages.commands import Address, ChildFailed
from .loop import report
from .turns import PooledActor


class Slot:
    """A supervised child's stable address (collaborators hold it, never the ref). A tell
    while no child is bound, or to one that has died, is dropped."""

    __slots__ = ("_lock", "_ref", "_retired", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._ref: pykka.ActorRef[Any] | None = None
        self._retired = False

    def tell(self, message: Any) -> None:
        with self._lock:
            ref = self._ref
        if ref is not None:
            try:
                ref.tell(message)
            except pykka.ActorDeadError:
                pass

    def bind(self, ref: pykka.ActorRef[Any]) -> None:
        """Point at a (new) child."""
        with self._lock:
            if not self._retired:
                self._ref = ref

    def retire(self) -> None:
        """The child is gone for good: drop whatever is told to it from now on."""
        with self._lock:
            self._retired, self._ref = True, None

    @property
    def ref(self) -> pykka.ActorRef[Any] | None:
        with self._lock:
            return self._ref

    @property
    def alive(self) -> bool:
        """Is a live child bound? (Not while it restarts: what is told then is dropped.)"""
        ref = self.ref
        return ref is not None and ref.is_alive()


class Supervised(pykka.Actor):
    """An actor that, dying of an exception, frees what it owns and tells its supervisor."""

    def __init__(self, name: str, supervisor: Address) -> None:
        super().__init__()
        self.child_name = name
        self.supervisor = supervisor

    def begin(self) -> None:
        """Take over resources and rebuild from the store, before any message."""

    def release(self) -> None:
        """Free what this actor owns, on stop and after a crash. Must not raise."""

    def lost(self, message: Any) -> None:
        """`message` was not read before a crash: whoever waits on it is told. Must not raise."""

    def on_start(self) -> None:
        # pykka stops an actor whose on_start raises without on_failure: say it here
        try:
            self.begin()
        except Exception as exc:  # a failed begin is a crash; dead first, as pykka does
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
            self._refuse_unread()
        finally:
            self.supervisor.tell(ChildFailed(
                self.child_name, f"{type(exception_value).__name__}: {exception_value}"))

    def _refuse_unread(self) -> None:
        inbox = self.actor_inbox
        while not inbox.empty():
            envelope = inbox.get()
            if envelope.reply_to is None:
                try:
                    self.lost(envelope.message)
                except Exception as exc:  # crash handling: the next one is answered too
                    report(f"{self.child_name}: {exc!r}")
            else:  # an ask: its caller must not wait for an answer that won't come
                envelope.reply_to.set_exception(
                    exc_info=(pykka.ActorDeadError, pykka.ActorDeadError(self.child_name), None))


class PooledChild(Supervised, PooledActor):
    """A supervised actor whose turns run on the shared loop: every actor but the root."""


class Intensity:
    """OTP's MaxR restarts in MaxT seconds, on an injected clock."""

    __slots__ = ("_times", "clock", "max_restarts", "window_s")

    def __init__(self, max_restarts: int, window_s: float, clock: Callable[[], float]) -> None:
        self.max_restarts, self.window_s, self.clock = max_restarts, window_s, clock
        self._times: list[tuple[float, str]] = []

    def allow(self, who: str) -> bool:
        """Record one restart (of `who`) now; False when it is one too many in the window."""
        now = self.clock()
        while self._times and now - self._times[0][0] >= self.window_s:
            del self._times[0]
        self._times.append((now, who))
        return len(self._times) <= self.max_restarts

    def verdict(self) -> str:
        """Who crashed how often, and how fast: the line when it gives up."""
        whos = {who for _, who in self._times}
        window = f"{self.window_s:g}s"
        if len(whos) == 1:
            return f"{whos.pop()} crashed {len(self._times)} times within {window}"
        last = self._times[-1][1]  # asked only after allow() recorded one
        who = ", ".join(sorted(whos))
        return f"{len(self._times)} crashes within {window} ({who}; last {last})"


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Past the intensity: not restarted; `verdict` says who crashed how often."""

    verdict: str


class RestartPolicy:
    """Both supervisors' rule: every crash counts toward an intensity (over all children for
    the root, per question for the Router); the child comes back at once, or never."""

    def __init__(self, max_restarts: int, window_s: float, clock: Callable[[], float], *,
                 per_child: bool) -> None:
        self.max_restarts, self.window_s, self.clock = max_restarts, window_s, clock
        self._shared = None if per_child else Intensity(max_restarts, window_s, clock)
        self._each: dict[str, Intensity] = {}

    def crashed(self, child: str, error: str, who: str | None = None
                ) -> Literal["now"] | GiveUp:
        """Restart `child` "now" or never (GiveUp). `who` names it in the verdict."""
        intensity = self._shared or self._each.setdefault(
            child, Intensity(self.max_restarts, self.window_s, self.clock))
        if not intensity.allow(who or child):
            return GiveUp(intensity.verdict())
        report(f"{child} crashed ({error}); restarting it", "warning")
        return "now"

    def forget(self, child: str) -> None:
        """`child` is gone for good: its history."""
        self._each.pop(child, None)
