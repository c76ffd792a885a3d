"""The daemon's actor tree, wired: which children the root starts, in which order.

    RootSupervisor (one_for_one, one intensity over all)
      logger      LoggerActor          permanent
      delivery    DeliveryActor        permanent
      questions   QuestionSupervisor   permanent  -> QuestionActor per qid (transient)
      router      QuestionRouter       permanent
      watcher     WatcherActor         permanent
      peer        PeerActor            permanent

Started top to bottom and stopped bottom to top: the Peer goes first (no new
questions, the registry entry leaves, W8) and its registry entry, written
last, is the daemon's readiness (W7). Collaborators are handed each other's
slots before anything starts, so any order of start is safe: what is told to
a child that is not up yet waits in its slot.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pykka

from ..messages.commands import Address, NewQuestion, QuestionSpec, QueueDepthQuery
from ..messages.wire import PromptEnvelope
from .base import Slot, utc_now
from .config import BridgeConfig
from .delivery import DeliveryActor
from .logger import LoggerActor
from .peer import PeerActor, PeerIdentity
from .question import QuestionActor
from .question_supervisor import QuestionSupervisor
from .router import QuestionRouter
from .store import Store
from .supervisor import ChildSpec, RootSupervisor
from .watcher import WatcherActor

DEPTH_TIMEOUT_S = 2.0
RESTARTING = "bridge is restarting; try again"


@dataclass
class Tree:
    """The started root, the children's slots, and the two bounded asks non-actors may make."""

    root: pykka.ActorRef[RootSupervisor]
    slots: dict[str, Slot]

    def queue_depth(self, timeout: float = DEPTH_TIMEOUT_S) -> int:
        """How many questions are open (C21, sd_notify's watchdog); raises TimeoutError
        if the Router does not answer within `timeout`. Never call it from an actor."""
        if self.slots["router"].ref is None:
            raise TimeoutError("the router is restarting")
        answer = concurrent.futures.Future[int]()
        self.slots["router"].tell(QueueDepthQuery(answer.set_result))
        return answer.result(timeout)

    def admit(self, envelope: PromptEnvelope, reply: Callable[[str | None], None]) -> None:
        """For the Peer's listener: the Router stores the question, then `reply(None)`
        (the ack means "durable"), or replies the nack's error; while it restarts the
        asker is told to try again at once."""
        if self.slots["router"].ref is None:
            reply(RESTARTING)
        else:
            self.slots["router"].tell(NewQuestion(envelope, reply))


def start_tree(
    *,
    config: BridgeConfig,
    identity: PeerIdentity,
    store: Store,
    on_fatal: Callable[[str], None],
    max_restarts: int = 5,
    window_s: float = 10.0,
    question_restarts: int = 3,
    now: Callable[[], datetime] = utc_now,
    clock: Callable[[], float] = time.time,
    monotonic: Callable[[], float] = time.monotonic,
) -> Tree:
    """Build the child specs and start the root; returns at once (children start in it)."""
    slots = {name: Slot(name) for name in ("logger", "delivery", "questions", "router",
                                             "watcher", "peer")}
    tree = Tree(root=None, slots=slots)  # type: ignore[arg-type]  # set below
    c = config
    run_tag = identity.session_id[-8:]

    def logger(sup: Address, n: int) -> pykka.ActorRef[Any]:
        return LoggerActor.start(supervisor=sup, log_path=c.log_path)

    def delivery(sup: Address, n: int) -> pykka.ActorRef[Any]:
        return DeliveryActor.start(
            supervisor=sup,
            logger=slots["logger"],
            target=c.target,
            profile=c.hermes_profile,
            send_timeout_ms=c.send_timeout_ms,
            hermes=c.hermes,
            now=now,
            note_sent=store.note_sent,
            note_owed=store.note_owed,
        )

    def question(spec: QuestionSpec, child: str, slot: Slot, sup: Address) -> pykka.ActorRef[Any]:
        return QuestionActor.start(
            spec=spec,
            supervisor=sup,
            router=slots["router"],
            me=slot,
            peer=slots["peer"],
            delivery=slots["delivery"],
            logger=slots["logger"],
            watcher=slots["watcher"],
            target=c.target,
            name=child,
            store=store,
            now=now,
            clock=clock,
            remind_before_ms=c.remind_before_ms,
        )

    def questions(sup: Address, n: int) -> pykka.ActorRef[Any]:
        return QuestionSupervisor.start(
            supervisor=sup,
            router=slots["router"],
            peer=slots["peer"],
            logger=slots["logger"],
            store=store,
            start_question=question,
            me=slots["questions"],
            first_start=n == 0,
            max_restarts=question_restarts,
            window_s=window_s,
            clock=monotonic,
            now=now,
        )

    def router(sup: Address, n: int) -> pykka.ActorRef[Any]:
        return QuestionRouter.start(
            supervisor=sup,
            questions=slots["questions"],
            peer=slots["peer"],
            delivery=slots["delivery"],
            watcher=slots["watcher"],
            logger=slots["logger"],
            store=store,
            timeout_ms=c.timeout_ms,
            project=c.project,
            run_tag=f"{run_tag}.{n}",
            max_open=c.max_open,
            max_open_per_asker=c.max_open_per_asker,
            resume_owed=n == 0,
            now=now,
            clock=clock,
        )

    def watcher(sup: Address, n: int) -> pykka.ActorRef[Any]:
        return WatcherActor.start(
            supervisor=sup,
            router=slots["router"],
            logger=slots["logger"],
            delivery=slots["delivery"],
            questions_dir=c.questions_dir,
            poll_ms=c.poll_ms,
            now=now,
        )

    def peer(sup: Address, n: int) -> pykka.ActorRef[Any]:
        return PeerActor.start(
            supervisor=sup,
            identity=identity,
            questions=slots["router"],
            admit=tree.admit,
            settle=store.settle,
            logger=slots["logger"],
            heartbeat_s=c.heartbeat_ms / 1000,
        )

    factories = {"logger": logger, "delivery": delivery, "questions": questions,
                 "router": router, "watcher": watcher, "peer": peer}
    specs = [ChildSpec(slots[name], factories[name]) for name in slots]
    tree.root = RootSupervisor.start(
        specs=specs, on_fatal=on_fatal, max_restarts=max_restarts, window_s=window_s,
        clock=monotonic,
    )
    return tree
