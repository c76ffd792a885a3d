"""Actor turns on the loop: a pykka actor whose mailbox asks the loop for a turn when mail
comes. Every private pykka name the daemon relies on (pinned in setup.cfg) is here: the
`ActorInbox` protocol, `_create_actor_inbox`, `_start_actor_loop`, `_actor_loop_setup`,
`_actor_loop_teardown`, `_handle_receive`, `_handle_failure`, `_stop`, `Envelope`'s fields."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import pykka
from pykka import ActorRegistry

from ..messages.commands import Address
from .loop import Edge, report, shared_edge, tell_quietly

if TYPE_CHECKING:
    from pykka._actor import ActorInbox
    from pykka._envelope import Envelope


class PoolInbox:
    """Asks its edge for a turn of its actor when mail comes, as Akka's dispatchers do: at
    most one turn queued or running; a `tell` never blocks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: deque[Envelope[Any]] = deque()
        self._actor: PooledActor | None = None
        self._edge: Edge | None = None
        self._scheduled = False

    def attach(self, actor: PooledActor, edge: Edge) -> None:
        """Start running `actor`: its first turn runs on_start, then the mail."""
        with self._lock:
            self._actor, self._edge, self._scheduled = actor, edge, True
        edge.call(self.run_turn)

    def put(self, envelope: Envelope[Any], /) -> None:
        with self._lock:
            self._queue.append(envelope)
            if self._scheduled or self._edge is None:
                return
            self._scheduled = True
            edge = self._edge
        edge.call(self.run_turn)

    def get(self) -> Envelope[Any] | None:  # never blocks: None when empty
        with self._lock:
            return self._queue.popleft() if self._queue else None

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


class PooledActor(pykka.ThreadingActor):
    """A pykka actor whose turns run on an edge's loop, at most `throughput` messages a turn
    so a busy actor starves nobody."""

    edge: ClassVar[Edge | None] = None
    throughput: ClassVar[int] = 8
    _started = False

    @classmethod
    def start_bound(cls, bind: Callable[[pykka.ActorRef[Any]], None], *args: Any,
                    **kwargs: Any) -> pykka.ActorRef[Any]:
        """pykka's `start`, binding its slot before the first turn: nothing told is dropped."""
        actor = cls(*args, **kwargs)
        bind(actor.actor_ref)
        ActorRegistry.register(actor.actor_ref)
        actor._start_actor_loop()
        return actor.actor_ref

    @staticmethod
    def _create_actor_inbox() -> ActorInbox:
        return PoolInbox()  # type: ignore[return-value]  # get() says None, never blocks

    def _start_actor_loop(self) -> None:
        """An actor that can never run must not stay registered: stop_all would wait on it."""
        inbox = self.actor_inbox
        assert isinstance(inbox, PoolInbox)
        try:
            inbox.attach(self, self.edge or shared_edge())
        except BaseException:  # the turn machinery's edge: never left registered
            ActorRegistry.unregister(self.actor_ref)
            raise

    def tell_later(self, delay: float, message: Any, to: Address | None = None
                   ) -> asyncio.TimerHandle:
        """Tell `to` (this actor by default) `message` after `delay`; in a turn only (only the
        loop may cancel the handle)."""
        edge = self.edge or shared_edge()
        assert edge.on_loop(), "tell_later outside a turn"
        return edge.loop.call_later(delay, tell_quietly, to or self.actor_ref, message)

    def _turn(self) -> None:
        """pykka's actor loop cut into turns."""
        inbox = self.actor_inbox
        assert isinstance(inbox, PoolInbox)
        if not self._started:
            self._started = True
            self._actor_loop_setup()
        for _ in range(self.throughput):
            envelope = None if self.actor_stopped.is_set() else inbox.get()
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
        except Exception:  # the turn's edge (as pykka's): a crash fails the actor, not the loop
            if envelope.reply_to is not None:
                envelope.reply_to.set_exception()
                return
            self._handle_failure(*sys.exc_info())
            try:
                self.on_failure(*sys.exc_info())
            except Exception:  # the same edge, in failure handling
                self._handle_failure(*sys.exc_info())
        except BaseException:  # the same edge: an exit stops every actor
            self._stop()
            ActorRegistry.stop_all(block=False)  # never block the loop on pooled actors' stops
