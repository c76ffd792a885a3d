"""Actor turns on the loop: a pykka actor whose mailbox asks the loop for a turn when mail
comes. Every private pykka name the daemon relies on (pinned in setup.cfg) is in this file."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, cast

import pykka
from pykka import ActorRegistry

from .loop import Edge, StopFlag, report, shared_edge, tell_quietly

if TYPE_CHECKING:
    from pykka._actor import ActorInbox
    from pykka._envelope import Envelope


class PoolInbox:
    """Asks its edge for a turn when mail comes, as Akka's dispatchers do: one turn at most
    queued or running. Slots, and a queue only while mail waits (RSS at --max-open)."""

    __slots__ = ("__weakref__", "_actor", "_edge", "_lock", "_queue", "_scheduled")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: deque[Envelope[Any]] | None = None
        self._actor: PooledActor | None = None
        self._edge: Edge | None = None
        self._scheduled = False

    def attach(self, actor: PooledActor, edge: Edge) -> None:
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

    def get(self) -> Envelope[Any] | None:  # never blocks: None when empty
        with self._lock:
            queue = self._queue
            if not queue:
                return None
            if len(queue) == 1:
                self._queue = None
            return queue.popleft()

    def empty(self) -> bool:
        with self._lock:
            return not self._queue

    def run_turn(self) -> None:
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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.actor_stopped = self._actor_ref.actor_stopped = StopFlag()  # type: ignore[assignment]
        self._pool = cast(PoolInbox, self.actor_inbox)

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
        try:
            self._pool.attach(self, self.edge or shared_edge())
        except BaseException:  # never left registered if it can never run: stop_all would wait
            ActorRegistry.unregister(self.actor_ref)
            raise

    def tell_later(self, delay: float, message: Any) -> asyncio.TimerHandle:
        edge = self.edge or shared_edge()
        assert edge.on_loop(), "tell_later outside a turn"
        return edge.loop.call_later(delay, tell_quietly, self.actor_ref, message)

    def _turn(self) -> None:
        """pykka's actor loop cut into turns."""
        if not self._started:
            self._started = True
            self._actor_loop_setup()
        for _ in range(self.throughput):
            envelope = None if self.actor_stopped.is_set() else self._pool.get()
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
