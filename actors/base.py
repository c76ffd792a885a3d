"""Supervision plumbing shared by every actor.

`Slot` is a child's stable address: collaborators hold the slot, never the
actor ref, so a restarted child is reachable at once and nothing told to it
while it was down is lost. `Child` is the base of every supervised actor: when
it dies of an exception it hands what was still in its mailbox to its
supervisor, which restarts it and replays those messages in order.
"""

from __future__ import annotations

import sys
import threading
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

import pykka

from coms_hermes_bridge.messages.commands import Address, ChildFailed


class Slot:
    """A stable, thread-safe address for one supervised child."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._ref: pykka.ActorRef[Any] | None = None
        self._held: list[Any] = []
        self._retired = False

    def tell(self, message: Any) -> None:
        """Deliver now, or hold until the child is (re)bound."""
        with self._lock:
            if self._retired:
                return
            if self._ref is not None:
                try:
                    self._ref.tell(message)
                    return
                except pykka.ActorDeadError:
                    pass
            self._held.append(message)

    def bind(self, ref: pykka.ActorRef[Any], unread: tuple[Any, ...] = ()) -> None:
        """Point the slot at a (new) actor: replay `unread`, then what was held."""
        with self._lock:
            self._ref = ref
            for message in (*unread, *self._held):
                ref.tell(message)
            self._held.clear()

    def retire(self) -> None:
        """The child is gone for good: drop whatever is told to it from now on."""
        with self._lock:
            self._retired = True
            self._ref = None
            self._held.clear()

    @property
    def ref(self) -> pykka.ActorRef[Any] | None:
        with self._lock:
            return self._ref

    def __repr__(self) -> str:
        return f"Slot({self.name})"


def utc_now() -> datetime:
    """The wall clock, injected into actors so tests can pin it."""
    return datetime.now(UTC)


def report(message: str) -> None:
    """One operator-facing line on stderr; never raises."""
    try:
        print(f"coms-hermes-bridge: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


class Child(pykka.ThreadingActor):
    """A supervised actor: on a crash it tells its supervisor and hands over its mailbox."""

    # The daemon must be able to exit even if an actor thread is wedged.
    use_daemon_thread = True

    def __init__(self, name: str, supervisor: Address) -> None:
        super().__init__()
        self.child_name = name
        self.supervisor = supervisor

    def begin(self) -> None:
        """Take over this actor's resources; runs in the actor's thread before any message."""

    def on_start(self) -> None:
        # pykka stops an actor whose on_start raises without calling
        # on_failure; report it here so the supervisor can retry or give up.
        try:
            self.begin()
        except Exception as exc:
            # Dead first (as pykka does before on_failure), so nothing told from
            # now on is accepted into a mailbox that is about to be dropped.
            pykka.ActorRegistry.unregister(self.actor_ref)
            self.actor_stopped.set()
            try:
                self.release()
            finally:
                self._hand_over(f"{type(exc).__name__}: {exc}")
            raise

    def release(self) -> None:
        """Free what this actor owns (threads, sockets, processes).

        Called on orderly stop and after a crash, so a restarted successor can
        take the same resources over. Subclasses extend it; it must not raise.
        """

    def on_stop(self) -> None:
        self.release()

    def on_failure(
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            self.release()
        finally:
            kind = exception_type.__name__ if exception_type else "Error"
            self._hand_over(f"{kind}: {exception_value}")

    def _hand_over(self, error: str) -> None:
        """Give the supervisor what this actor had not read yet, so its successor gets it."""
        unread: list[Any] = []
        while not self.actor_inbox.empty():
            envelope = self.actor_inbox.get()
            if envelope.reply_to is None:
                unread.append(envelope.message)
            else:  # an ask: its caller must not wait for an answer that won't come
                envelope.reply_to.set_exception(
                    exc_info=(pykka.ActorDeadError, pykka.ActorDeadError(self.child_name), None)
                )
        self.supervisor.tell(ChildFailed(self.child_name, error, tuple(unread)))
