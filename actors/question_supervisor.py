"""QuestionSupervisor: runs the QuestionActors, one per open qid, as transient children.

A dynamic supervisor (OTP's simple_one_for_one): the Router tells it which
questions to run; it starts each behind the Slot the Router reaches it by,
and restarts one that crashes from the question's store row (the only record
of its state), replaying what it had not read yet. A question that ends
normally tells it so and is forgotten; nothing restarts it.

Its intensity is per question: a question that crashes more than
`max_restarts` times within `window_s` seconds is poison. It is closed in the
store with an error response owed to its asker (`bridge failed on this
question: <error>`), logged as `question_failed`, and not restored on the
next start; the daemon and every other question live on. A crash caused by a
resource shortage is retried with backoff instead and not counted.
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
    ChildFailed,
    LogEvent,
    QuestionClosed,
    QuestionRestarted,
    QuestionSpec,
    ResetQuestions,
    RestartChild,
    RestoreQuestions,
    SendResponse,
    StartQuestion,
    UnknownMessage,
)
from ..messages.contract import log_record
from ..messages.wire import PromptEnvelope
from .base import (
    PooledService,
    Slot,
    is_resource_shortage,
    report,
    utc_now,
)
from .store import Store
from .supervisor import GiveUp, RestartPolicy, Schedule, timer_schedule

FAILED_PREFIX = "bridge failed on this question"
# A question's error, as the asker reads it, is kept to a readable size.
_ERROR_LIMIT = 500

# (spec, child name, its slot, this supervisor's address) -> the question's ref
QuestionFactory = Callable[[QuestionSpec, str, Slot, Address], pykka.ActorRef[Any]]


def failed_error(error: str) -> str:
    """The error response a poison question's asker gets."""
    if len(error) > _ERROR_LIMIT:
        error = error[: _ERROR_LIMIT - 1] + "…"
    return f"{FAILED_PREFIX}: {error}"


@dataclass(frozen=True, slots=True)
class Running:
    """One question this supervisor watches over: who asked what, and its Slot.

    Not its state: that is in the question's row (read again at each restart)
    and in the question actor itself.
    """

    qid: str
    prompt: PromptEnvelope  # for the error response a poison question's asker gets
    slot: Slot


class QuestionSupervisor(PooledService):
    """Starts, restarts and, past its bound, gives up on single questions."""

    def __init__(
        self,
        *,
        supervisor: Address,
        router: Address,
        peer: Address,
        logger: Address,
        store: Store,
        start_question: QuestionFactory,
        me: Address | None = None,
        first_start: bool = True,
        max_restarts: int,
        window_s: float,
        clock: Callable[[], float] = time.monotonic,
        schedule: Schedule = timer_schedule,
        now: Callable[[], datetime] = utc_now,
        name: str = "questions",
    ) -> None:
        super().__init__(name, supervisor)
        self.router = router
        self.peer = peer
        self.logger = logger
        self.store = store
        self.start_question = start_question
        self.me: Address = me if me is not None else self.actor_ref
        self.first_start = first_start
        self.now = now
        self.policy = RestartPolicy(max_restarts, window_s, clock, schedule, per_child=True)
        self.running: dict[str, Running] = {}

    # -- life ---------------------------------------------------------------

    def begin(self) -> None:
        if not self.first_start:
            # the questions died with the last incarnation: the Router starts them again
            self.router.tell(RestoreQuestions())

    def release(self) -> None:
        self.policy.cancel_all()
        for child in list(self.running):
            self._stop_question(child)

    def _stop_question(self, child: str) -> None:
        running = self.running.pop(child)
        ref = running.slot.ref
        running.slot.retire()
        if ref is not None:
            try:
                ref.stop(block=False)
            except pykka.ActorDeadError:
                pass

    # -- messages -----------------------------------------------------------

    def on_receive(self, message: Any) -> None:
        match message:
            case StartQuestion(spec=spec, child=child, slot=slot):
                self.running[child] = Running(spec.qid, spec.prompt, slot)
                self._spawn(child, spec, ())
            case QuestionClosed(child=child):
                self.running.pop(child, None)
                self.policy.forget(child)
            case ResetQuestions():
                self.policy.cancel_all()
                for child in list(self.running):
                    self._stop_question(child)
            case ChildFailed(child=child, error=error, unread=unread, shortage=shortage):
                self._failed(child, error, unread, shortage)
            case RestartChild(child=child, unread=unread):
                self.policy.restarting(child)
                self._restart(child, unread)
            case _:
                raise UnknownMessage(self.child_name, message)

    def _spawn(self, child: str, spec: QuestionSpec, unread: tuple[Any, ...]) -> None:
        running = self.running[child]
        try:
            ref = self.start_question(spec, child, running.slot, self.me)
        except Exception as exc:  # no thread for it, say: as if it had crashed at once
            self._failed(child, f"{type(exc).__name__}: {exc}", unread, is_resource_shortage(exc))
            return
        running.slot.bind(ref, unread)

    def _failed(self, child: str, error: str, unread: tuple[Any, ...], shortage: bool) -> None:
        running = self.running.get(child)
        if running is None:
            return  # closed or replaced meanwhile: nothing to restart
        verdict = self.policy.crashed(child, error, unread, shortage, self.me,
                                      who=f"question {running.qid}")
        if isinstance(verdict, GiveUp):
            self._give_up(child, running, verdict.verdict, error)
        elif verdict == "now":
            self._restart(child, unread)

    def _restart(self, child: str, unread: tuple[Any, ...]) -> None:
        running = self.running.get(child)
        if running is None:
            return
        # The row is the question's state; a question without one has ended
        # (or was replaced by a repeated qid), and there is nothing to resume.
        spec = self.store.open_spec(running.qid, child)
        if spec is None:
            self._stop_question(child)
            self.router.tell(QuestionClosed(running.qid, None, child))
            return
        self.router.tell(QuestionRestarted(spec.qid, child))
        self._spawn(child, spec, unread)

    def _give_up(self, child: str, running: Running, verdict: str, error: str) -> None:
        """A poison question: closed with an error for its asker, never restored."""
        qid = running.qid
        self._stop_question(child)
        owed = SendResponse(running.prompt, None, failed_error(error), child)
        try:
            owned = self.store.close(qid, None, owner=child, response=owed)
        except Exception as exc:  # the asker is still told; the next start may retry it
            report(f"could not record question {qid} as failed: {exc!r}")
            owned = True
        report(f"{verdict}; closed it with an error ({error})", "error")
        self.router.tell(QuestionClosed(qid, None, child))
        if not owned:
            return  # replaced meanwhile: its successor answers for the qid
        record = log_record(self.now(), qid, "question_failed", {"error": error})
        self.logger.tell(LogEvent(record))
        self.peer.tell(owed)
