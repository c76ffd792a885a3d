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

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pykka

from ..messages.commands import (
    Address,
    AdmissionRefused,
    NewQuestion,
    QuestionSpec,
    QueueDepthQuery,
)
from ..messages.wire import PromptEnvelope
from .base import Slot, report, utc_now
from .config import BridgeConfig
from .delivery import DeliveryActor
from .logger import LoggerActor
from .peer import PeerActor, PeerIdentity
from .question import QuestionActor
from .question_supervisor import QuestionSupervisor
from .router import QuestionRouter
from .store import Store
from .supervisor import ChildSpec, RootSupervisor
from .timers import TimerService, shared_timers
from .watcher import WatcherActor

ADMIT_TIMEOUT_S = 5.0
DEPTH_TIMEOUT_S = 2.0
RESTARTING = "bridge is restarting; try again"


@dataclass
class Tree:
    """The started root, the children's slots, and the two bounded asks non-actors may make."""

    root: pykka.ActorRef[RootSupervisor]
    slots: dict[str, Slot]

    def queue_depth(self, timeout: float = DEPTH_TIMEOUT_S) -> int:
        """How many questions are open (C21, W6, sd_notify); raises if the Router
        does not answer within `timeout`. Never call it from an actor."""
        ref = self.slots["router"].ref
        if ref is None:
            raise pykka.ActorDeadError("the router is restarting")
        return int(ref.ask(QueueDepthQuery(), block=True, timeout=timeout))

    def admit(self, envelope: PromptEnvelope) -> None:
        """For the Peer's socket threads: return once the question is stored, so the
        ack means "durable"; a refusal or a store error raises, and the asker is nacked."""
        ref = self.slots["router"].ref
        if ref is None:
            raise AdmissionRefused(RESTARTING)
        try:
            ref.ask(NewQuestion(envelope), block=True, timeout=ADMIT_TIMEOUT_S)
        except pykka.ActorDeadError:  # it died under the ask; its successor takes the next
            raise AdmissionRefused(RESTARTING) from None
        except pykka.Timeout:
            report(f"question {envelope.msg_id} is queued but was not stored within "
                   f"{ADMIT_TIMEOUT_S:g}s; acking it anyway")


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
    # every question's deadline on one heap and one thread, read on the questions' clock
    timers = shared_timers() if clock is time.time else TimerService(clock)

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
            timers=timers,
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
            queue_depth=tree.queue_depth,
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
