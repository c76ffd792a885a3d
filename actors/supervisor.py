"""The root supervisor and its tree (docs/architecture.md). Children start in CHILDREN's
order and stop in reverse: the Peer, started last, publishes readiness (W7) and stops
first (W8). What is told to a child not up yet is dropped: it rebuilds from the store.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any

import pykka

from ..messages.commands import Address, ChildFailed, QueueDepthQuery, UnknownMessage
from .config import BridgeConfig
from .delivery import DeliveryActor
from .listener import DEPTH_TIMEOUT_S
from .logger import LoggerActor
from .loop import report
from .loop import utc_now as _utc_now
from .peer import PeerActor
from .questions import QuestionRouter
from .store import Store
from .supervision import GiveUp, RestartPolicy, Slot
from .watcher import WatcherActor

CHILDREN = ("logger", "delivery", "router", "watcher", "peer")


@dataclass(frozen=True)
class ChildSpec:
    """`start(supervisor, incarnation)` returns the child's ref; incarnation 0 is its first."""

    slot: Slot
    start: Callable[[Address, int], pykka.ActorRef[Any]]
    shutdown_s: float = 1.0


class RootSupervisor(pykka.ThreadingActor):
    """one_for_one. A thread of its own: its stop waits for each child's, which on the loop
    would wait for turns queued behind its own."""

    use_daemon_thread = True

    def __init__(self, *, specs: Sequence[ChildSpec], on_fatal: Callable[[str], None],
                 max_restarts: int, window_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.specs = {spec.slot.name: spec for spec in specs}  # in start order
        self.on_fatal = on_fatal
        self.policy = RestartPolicy(max_restarts, window_s, clock, per_child=False)
        self.incarnations: dict[str, int] = {}
        self._failed = False

    def on_start(self) -> None:
        for child in self.specs:
            self._start(child)

    def on_stop(self) -> None:
        for spec in reversed(self.specs.values()):
            ref = spec.slot.ref
            spec.slot.retire()
            if ref is not None:
                try:
                    ref.stop(block=True, timeout=spec.shutdown_s)
                except (pykka.ActorDeadError, pykka.Timeout):
                    pass

    def on_failure(self, exception_type: type[BaseException] | None,
                   exception_value: BaseException | None,
                   traceback: TracebackType | None) -> None:
        self._fatal(f"supervisor failed: {exception_value!r}")

    def on_receive(self, message: Any) -> Any:
        match message:
            case ChildFailed(child=child, error=error):
                self._child_failed(child, error)
            case _:
                raise UnknownMessage("supervisor", message)
        return None

    def _child_failed(self, child: str, error: str) -> None:
        if child not in self.specs or self._failed:
            return
        verdict = self.policy.crashed(child, error)
        if isinstance(verdict, GiveUp):
            self._fatal(f"{verdict.verdict}; last error: {error}")
        else:
            self._start(child)

    def _start(self, child: str) -> None:
        spec = self.specs[child]
        incarnation = self.incarnations.get(child, 0)
        self.incarnations[child] = incarnation + 1
        try:
            ref = spec.start(self.actor_ref, incarnation)
        except Exception as exc:  # the start of a child (no thread for it): a crash at start
            self._child_failed(child, f"{type(exc).__name__}: {exc}")
            return
        spec.slot.bind(ref)

    def _fatal(self, reason: str) -> None:
        if not self._failed:
            self._failed = True
            report(reason, "error")
            self.on_fatal(reason)


@dataclass
class Tree:
    """The started root and the children's slots."""

    root: pykka.ActorRef[RootSupervisor]
    slots: dict[str, Slot]

    def queue_depth(self, timeout: float = DEPTH_TIMEOUT_S) -> int:
        """Open questions (C21; the watchdog's proof of life), or TimeoutError. Not for actors."""
        router = self.slots["router"]
        if not router.alive:
            raise TimeoutError("the router is restarting")
        answer = concurrent.futures.Future[int]()
        router.tell(QueueDepthQuery(answer.set_result))
        return answer.result(timeout)


def start_tree(*, config: BridgeConfig, identity: Any, store: Store,
               on_fatal: Callable[[str], None], max_restarts: int = 5, window_s: float = 10.0,
               question_restarts: int = 3, now: Callable[[], datetime] = _utc_now,
               clock: Callable[[], float] = time.time,
               monotonic: Callable[[], float] = time.monotonic) -> Tree:
    """Start the root; returns at once (the children start in it)."""
    slots = {name: Slot(name) for name in CHILDREN}
    logger, delivery, router, watcher, peer = (slots[name] for name in CHILDREN)
    starts: dict[str, Callable[[Address, int], pykka.ActorRef[Any]]] = {
        "logger": lambda sup, n: LoggerActor.start_bound(
            logger.bind, log_path=config.log_path, project=config.project, supervisor=sup),
        "delivery": lambda sup, n: DeliveryActor.start_bound(
            delivery.bind, config=config, store=store, router=router, logger=logger,
            now=now, supervisor=sup),
        "router": lambda sup, n: QuestionRouter.start_bound(
            router.bind, config=config, store=store, router=router, peer=peer,
            delivery=delivery, watcher=watcher, logger=logger, supervisor=sup,
            run_tag=identity.session_id[-8:], incarnation=n, now=now, clock=clock,
            question_restarts=question_restarts, window_s=window_s, monotonic=monotonic),
        "watcher": lambda sup, n: WatcherActor.start_bound(
            watcher.bind, questions_dir=config.questions_dir, poll_ms=config.poll_ms,
            router=router, delivery=delivery, logger=logger, now=now, supervisor=sup,
            reoffer_s=config.reoffer_ms / 1000),
        "peer": lambda sup, n: PeerActor.start_bound(
            peer.bind, identity=identity, store=store, router=router, logger=logger,
            heartbeat_s=config.heartbeat_ms / 1000, now=now, supervisor=sup),
    }
    root = RootSupervisor.start(
        specs=[ChildSpec(slots[name], starts[name]) for name in CHILDREN], on_fatal=on_fatal,
        max_restarts=max_restarts, window_s=window_s, clock=monotonic)
    return Tree(root, slots)
