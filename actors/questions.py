"""The Router, which owns the table of open questions and supervises them (simple_one_for_one:
the open set is held once), and one QuestionActor per open qid (docs/architecture.md)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pykka
from ulid import ULID

from ..messages.commands import (
    Address,
    AnswerArrived,
    AnswerFileSeen,
    CancelQuestion,
    ChildFailed,
    DisposeAnswerFile,
    FileSignature,
    HermesRan,
    LogEvent,
    NewQuestion,
    QuestionClosed,
    QuestionSpec,
    QueueDepthQuery,
    RejectAnswerFile,
    RemindDue,
    SendResponse,
    SendText,
    TextPurpose,
    TimedOut,
    UnknownMessage,
)
from ..messages.contract import (
    _OPEN,
    INVALID_QID_ERROR,
    NOT_ADMITTED,
    Accepted,
    Rejected,
    admission,
    cancel_outcome,
    cancel_refused_record,
    duplicate_error,
    duplicate_refused_record,
    effective_timeout_ms,
    late_note,
    log_record,
    map_answer,
    may_cancel,
    over_asker_limit,
    over_capacity,
    parse_prompt,
    remind_after_s,
    remind_note,
    resumed_deadline,
    timeout_error,
    timeout_note,
    transition,
    undelivered_note,
    validate_answer,
)
from ..messages.wire import Event, PromptEnvelope, State, is_valid_qid
from .delivery import question_send
from .listener import RESTARTING
from .loop import report, utc_now
from .state_view import sibling_of
from .store import remind_note_id
from .supervision import GiveUp, PooledChild, RestartPolicy, Slot

if TYPE_CHECKING:
    from .config import BridgeConfig
    from .store import Store

_ERROR_LIMIT = 500  # characters of a poison question's error, as its asker reads it
NOTED_MEMORY = 1_000  # answer file versions remembered as noted (late, undelivered)

# (spec, child name) -> the question's ref
QuestionFactory = Callable[[QuestionSpec, str], pykka.ActorRef[Any]]


def failed_error(error: str) -> str:
    """The error response a poison question's asker gets."""
    if len(error) > _ERROR_LIMIT:
        error = error[: _ERROR_LIMIT - 1] + "…"
    return f"bridge failed on this question: {error}"


@dataclass(slots=True)
class OpenQuestion:
    """Where to reach one open question, and whose it is (X2). `cancelled` and `routed` (the
    newest answer file version: older ones are gone from disk) are told again to an actor
    that resumes it; a routed one it could not take is judged when it ends."""

    qid: str
    child: str
    slot: Slot
    prompt: PromptEnvelope
    routed: AnswerArrived | None = None
    cancelled: CancelQuestion | None = None


class QuestionRouter(PooledChild):

    def __init__(self, *, config: BridgeConfig, store: Store, router: Address, peer: Address,
                 delivery: Address, watcher: Address, logger: Address, supervisor: Address,
                 run_tag: str, question_restarts: int, window_s: float, incarnation: int = 0,
                 name: str = "router", now: Callable[[], datetime] = utc_now,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 start_question: QuestionFactory | None = None,
                 sibling: Callable[[str], str | None] | None = None) -> None:
        """`router`: our own stable address, for the questions. `sibling(qid)`: the other
        project on this host owning `qid` (X6). `run_tag` makes question names unique
        across runs (the owner guard keys on them)."""
        super().__init__(name, supervisor)
        self.config, self.store, self.router = config, store, router
        self.peer, self.delivery, self.watcher, self.logger = peer, delivery, watcher, logger
        self.now, self.clock = now, clock
        self.incarnation = incarnation
        self.start_question = start_question or self._start_question
        self.sibling = sibling or (lambda qid: sibling_of(store.path, qid, clock()))
        self.policy = RestartPolicy(question_restarts, window_s, monotonic, per_child=True)
        self.open: dict[str, OpenQuestion] = {}
        # versions noted already: a restarted Watcher hands every file on again
        self._noted_files: OrderedDict[tuple[str, FileSignature], None] = OrderedDict()
        self._run_tag = f"{run_tag}.{incarnation}"
        self._serial = itertools.count(1)

    def begin(self) -> None:
        """The table from the store before the first message: no prompt is admitted, no
        answer judged, against a half-built table."""
        specs, closed = self.store.load()
        first = self.incarnation == 0
        for spec in specs:
            self._start(spec, claim=True)
        if first and (specs or closed):
            report(f"restored {len(specs)} open and {len(closed)} closed question(s)", "info")

    def release(self) -> None:  # its questions die with it; a successor starts them again
        for question in self.open.values():
            self._halt(question)

    def lost(self, message: Any) -> None:
        """Who waits on what this Router will not read is answered: the asker is nacked
        (and tries again), the count is the one it had."""
        match message:
            case NewQuestion(verdict=verdict):
                if verdict.set_running_or_notify_cancel():
                    verdict.set_result(RESTARTING)
            case QueueDepthQuery(reply=reply):
                reply(len(self.open))

    @staticmethod
    def _halt(question: OpenQuestion) -> None:
        ref = question.slot.ref
        question.slot.retire()
        if ref is not None:  # pykka's stop of a dead actor fails its future, never raises
            ref.stop(block=False)

    def on_receive(self, message: Any) -> Any:
        match message:
            case NewQuestion(envelope=envelope, verdict=verdict):
                if verdict.set_running_or_notify_cancel():  # else its asker was nacked
                    verdict.set_result(self._admit(envelope))
            case CancelQuestion(envelope=envelope):
                question = self.open.get(envelope.ref_msg_id)  # C14: else acked, ignored
                if question is not None:
                    if may_cancel(envelope, question.prompt):
                        question.cancelled = message
                        question.slot.tell(message)
                    else:  # X2: only the asker cancels; acked all the same (C12)
                        self._log(cancel_refused_record(self.now(), envelope))
            case QueueDepthQuery(reply=reply):
                reply(len(self.open))
            case AnswerFileSeen(name=name, content=content, signature=signature):
                self._route_answer(name, content, signature)
            case HermesRan(job=job):
                question = self.open.get(job.qid)
                if question is not None:
                    question.slot.tell(message)
            case QuestionClosed(child=child, answer_file=answer_file):
                question = self._question(child)  # its close is in the store: the one memory
                if question is not None:
                    self._ended(question, answer_file)
            case ChildFailed(child=child, error=error):
                self._crashed(child, error)
            case _:
                raise UnknownMessage(self.child_name, message)
        return None

    def _log(self, record: Any) -> None:
        self.logger.tell(LogEvent(record))

    def _admit(self, envelope: PromptEnvelope) -> str | None:
        """None to ack (once stored), else the nack's error."""
        try:
            return self._new_question(envelope)
        except sqlite3.Error as exc:  # the state file's edge; anything else is a bug: a crash
            report(f"could not take question {envelope.msg_id!r}: {exc!r}", "error")
            return NOT_ADMITTED

    def _new_question(self, envelope: PromptEnvelope) -> str | None:
        """Full, over its asker's share (X10), or not its qid (X2): the nack's error."""
        qid = envelope.msg_id
        if not is_valid_qid(qid):  # C3: never reaches Telegram
            self.peer.tell(SendResponse(envelope, None, INVALID_QID_ERROR))
            return None
        current = self.open.get(qid)
        verdict = admission(envelope, current.prompt if current else None,
                            current is None and self.store.closed(qid) is not None)
        if verdict == "retry":  # its asker retrying: ack, nothing more
            return None
        if verdict != "admit":
            self._log(duplicate_refused_record(self.now(), qid, envelope, verdict))
            return duplicate_error(qid)
        config = self.config
        refusal = over_asker_limit(envelope.sender_name, self._open_of(envelope.sender_name),
                                   config.max_open_per_asker) or over_capacity(
                                       len(self.open), config.max_open)
        if refusal is not None:
            return refusal
        timeout_ms = effective_timeout_ms(envelope, config.timeout_ms)  # X5
        spec = QuestionSpec(qid=qid, prompt=envelope, parsed=parse_prompt(envelope),
                            timeout_ms=timeout_ms, deadline=self.clock() + timeout_ms / 1000)
        self._start(spec, claim=False)
        return None

    def _open_of(self, asker: str) -> int:
        """X10: counted from the table, and only when the limit is set."""
        if self.config.max_open_per_asker is None:
            return 0
        return sum(1 for question in self.open.values() if question.prompt.sender_name == asker)

    def _start(self, spec: QuestionSpec, *, claim: bool) -> None:
        """The name is unique across runs and restarts: the owner guard and outbox key on it."""
        child = f"question:{spec.qid}:{self._run_tag}.{next(self._serial)}"
        if claim:
            if not self.store.claim(spec.qid, child):
                return
        else:
            self.store.put_open(spec, owner=child)  # before the ack, before delivery
        question = self.open[spec.qid] = OpenQuestion(spec.qid, child, Slot(child), spec.prompt)
        self._spawn(question, spec)
        self._deliver(spec)

    def _deliver(self, spec: QuestionSpec) -> None:  # here, so the chat gets arrival order
        if spec.state in (None, "pending"):
            self.delivery.tell(question_send(spec, self.config))

    def _question(self, child: str) -> OpenQuestion | None:
        """The open question run as `child` (its name carries its qid), if it still is."""
        parts = child.split(":")
        question = self.open.get(parts[1]) if len(parts) > 2 else None
        return question if question is not None and question.child == child else None

    def _spawn(self, question: OpenQuestion, spec: QuestionSpec) -> None:
        try:
            ref = self.start_question(spec, question.child)
        except Exception as exc:  # a supervisor's start of a child: a failed start is a crash
            self._crashed(question.child, f"{type(exc).__name__}: {exc}")
            return
        question.slot.bind(ref)

    def _start_question(self, spec: QuestionSpec, child: str) -> pykka.ActorRef[Any]:
        return QuestionActor.start(
            spec, child, store=self.store, router=self.router, delivery=self.delivery,
            peer=self.peer, watcher=self.watcher, logger=self.logger,
            target=self.config.target, remind_before_ms=self.config.remind_before_ms,
            now=self.now, clock=self.clock)

    def _crashed(self, child: str, error: str) -> None:
        question = self._question(child)
        if question is None:
            return  # closed or replaced meanwhile: nothing to restart
        verdict = self.policy.crashed(child, error, who=f"question {question.qid}")
        if isinstance(verdict, GiveUp):
            self._give_up(question, verdict.verdict, error)
        else:
            self._restart(question)

    def _restart(self, question: OpenQuestion) -> None:
        """Again from its row; what mattered in its lost mailbox is told again (its send,
        newest answer, cancel); what it had acted on is dropped by its row's state."""
        spec = self.store.open_spec(question.qid, question.child)
        if spec is None:
            self._ended(question, None)
            return
        self._spawn(question, spec)
        self._deliver(spec)
        if question.routed is not None:
            question.slot.tell(question.routed)
        if question.cancelled is not None:
            question.slot.tell(question.cancelled)

    def _give_up(self, question: OpenQuestion, verdict: str, error: str) -> None:
        qid, child = question.qid, question.child
        self._forget(question)
        owed = SendResponse(question.prompt, None, failed_error(error), child)
        try:
            owned = self.store.close(qid, None, owner=child, response=owed)
        except sqlite3.Error as exc:  # the state file's edge: the asker is still told
            report(f"could not record question {qid} as failed: {exc!r}")
            owned = True
        report(f"{verdict}; closed it with an error ({error})", "error")
        if owned:  # else replaced meanwhile: its successor answers for the qid
            self._log(log_record(self.now(), qid, "question_failed", {"error": error}))
            self.peer.tell(owed)
            self._judge_routed(question, None)

    def _ended(self, question: OpenQuestion, answer_file: tuple[str, FileSignature] | None
               ) -> None:
        self._forget(question)
        self._judge_routed(question, answer_file)

    def _judge_routed(self, question: OpenQuestion,
                      answer_file: tuple[str, FileSignature] | None) -> None:
        """The version last routed to an ended question, unless it answered it, is judged now
        as any file of a closed qid (C15), not at the Watcher's `reoffer_s`."""
        routed = question.routed
        if routed is not None and (routed.name, routed.signature) != answer_file:
            self._not_open(routed.name, routed.signature, question.qid)

    def _forget(self, question: OpenQuestion) -> None:
        """Its actor has stopped, or has its own stop queued: no stop from here."""
        del self.open[question.qid]
        self.policy.forget(question.child)
        question.slot.retire()

    def _route_answer(self, name: str, content: bytes | None, signature: FileSignature) -> None:
        """C9: the name decides before a byte is parsed; only an open question's file is."""
        verdict = validate_answer(name, content, self.open)
        match verdict:
            case Accepted(qid=qid, answer=answer):
                question = self.open[qid]
                question.routed = AnswerArrived(answer, name, signature)
                question.slot.tell(question.routed)
            case Rejected(reason="foreign_qid", qid=str(qid)):
                self._not_open(name, signature, qid)
            case Rejected():
                self.watcher.tell(RejectAnswerFile(name, signature, verdict))

    def _not_open(self, name: str, signature: FileSignature, qid: str) -> None:
        """Closed here (late, C15), ours undelivered (X11), a sibling's (X6), or foreign."""
        closed = self.store.closed(qid)
        if closed is not None:
            state, answered_by = closed
            if answered_by == (name, signature):
                # the very file that answered it, offered again before its removal
                self.watcher.tell(DisposeAnswerFile(name, signature))
            else:
                note = SendText(qid, late_note(qid), "late_note", note_id=f"late:{qid}:{ULID()}")
                self._noted(name, signature, note, "late_answer", {"state": state})
            return
        # our own failed delivery first; siblings' files only when our memory does not decide
        if self.store.undelivered(qid, self.clock()):
            note = SendText(qid, undelivered_note(qid), "undelivered_note",
                            note_id=f"undelivered:{qid}:{ULID()}")
            self._noted(name, signature, note, "answer_rejected",
                        {"reason": "foreign_qid", "file": name, "delivery_failed": True})
        elif self.sibling(qid) is None:  # no bridge on this host knows it: at once
            self.watcher.tell(RejectAnswerFile(name, signature, Rejected("foreign_qid", qid)))
        # else a sibling's (X6): left for its owner; offered again after `reoffer_s`

    def _noted(self, name: str, signature: FileSignature, note: SendText, event: Event,
               detail: dict[str, Any]) -> None:
        """C15, X11: the note is owed (stored) once decided, and the file removed; a version
        noted already (a restarted Watcher's) is only removed."""
        fresh = (name, signature) not in self._noted_files
        if fresh:
            self.store.owe_note(note)
        self.watcher.tell(DisposeAnswerFile(name, signature))
        if not fresh:
            return
        self._noted_files[name, signature] = None
        if len(self._noted_files) > NOTED_MEMORY:
            self._noted_files.popitem(last=False)
        self._log(log_record(self.now(), note.qid, event, detail))
        self.delivery.tell(note)


class QuestionActor(PooledChild):
    """One qid's state machine (C19) and its timers; its row is the record a restart
    resumes from (see _move)."""

    def __init__(self, spec: QuestionSpec, name: str, *, store: Store, router: Address,
                 delivery: Address, peer: Address, watcher: Address, logger: Address,
                 target: str, remind_before_ms: float | None,
                 now: Callable[[], datetime] = utc_now,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(name, router)  # the Router is its supervisor
        self.store, self.router, self.delivery = store, router, delivery
        self.peer, self.watcher, self.logger = peer, watcher, logger
        self.target, self.remind_before_ms, self.now, self.clock = (
            target, remind_before_ms, now, clock)
        self.spec = spec
        self.qid = spec.qid
        self.state: State | None = spec.state
        self._timer: asyncio.TimerHandle | None = None
        self._reminder: asyncio.TimerHandle | None = None

    def begin(self) -> None:
        deadline = resumed_deadline(self.spec.deadline, self.spec.timeout_ms, self.clock())
        if deadline < self.spec.deadline:
            self.store.set_deadline(self.qid, deadline, self.child_name)
            self.spec = dataclasses.replace(self.spec, deadline=deadline)
        if self.state is None:
            if not self._move("question_received", {"from": self.spec.prompt.sender_name}):
                return
        elif not self._is_open():
            self._close()  # crashed after reaching its end but before reporting it
            return
        # at absolute moments, so a restart keeps the clock running (a moment passed while
        # down fires at once); to this actor, not its slot: release() cancels them
        now = time.time()  # the loop's timers count real seconds, whatever clock is injected
        self._timer = self.tell_later(self.spec.deadline - now, TimedOut())
        after = self._remind_after()
        if after is not None:
            asked = self.spec.deadline - self.spec.timeout_ms / 1000
            self._reminder = self.tell_later(asked + after - now, RemindDue())

    def release(self) -> None:
        for timer in (self._timer, self._reminder):
            if timer is not None:
                timer.cancel()
        self._timer = self._reminder = None

    def on_receive(self, message: Any) -> None:
        match message:
            case HermesRan(error=None):
                if self.state == "pending":
                    self._move("delivered", {"to": self.target})
            case HermesRan(error=str(error)):
                if self.state == "pending":
                    owed = self._owed(None, error)
                    # remembered an hour: the human may have the question all the same (X11)
                    if self._move("delivery_error", {"error": error}, owed=owed,
                                  undelivered_at=self.clock()):
                        self._close()
                        self.peer.tell(owed)
            case AnswerArrived(answer=answer, name=name, signature=signature):
                if self._is_open():
                    mapped = map_answer(answer.answer, self.spec.parsed.options)
                    owed = self._owed(mapped.model_dump(mode="json"), None)
                    if self._move("answered", {"answered_by": answer.answered_by}, owed=owed,
                                  answer_file=(name, signature)):
                        self._close((name, signature))
                        self.peer.tell(owed)
                        self.watcher.tell(DisposeAnswerFile(name, signature))
                # else closed under it: the Router judges it late (C15) at the close
            case CancelQuestion(by_operator=by_operator):
                text, told, detail = cancel_outcome(self.qid, by_operator)
                note = self._note(text, "cancel_note")
                reply = None if told is None else self._owed(None, told)  # X15
                if self._is_open() and self._move("cancelled", detail, owed=reply, note=note):
                    self._close()
                    self.delivery.tell(note)
                    if reply is not None:
                        self.peer.tell(reply)
            case RemindDue():
                if self._is_open() and self._remind_after() is not None:
                    self._remind()
            case TimedOut():
                if self._is_open():
                    ms = self.spec.timeout_ms
                    owed = self._owed(None, timeout_error(ms))
                    note = self._note(timeout_note(self.qid, ms), "timeout_note")
                    if self._move("timeout", {"timeout_ms": ms}, owed=owed, note=note):
                        self._close()
                        self.delivery.tell(note)
                        self.peer.tell(owed)
            case _:
                raise UnknownMessage(self.child_name, message)

    def _remind_after(self) -> float | None:
        """X9: when to remind, from the asking; None if not configured, decided already, or
        past the deadline (then the timeout comes, not a reminder)."""
        if self.spec.reminded or self.clock() >= self.spec.deadline:
            return None
        return remind_after_s(self.spec.timeout_ms, self.remind_before_ms)

    def _remind(self) -> None:
        """X9: decided once, stored, then sent."""
        left_s = max(0.0, self.spec.deadline - self.clock())
        text = remind_note(self.qid, left_s, self.spec.parsed.question)
        note = SendText(self.qid, text, "remind_note", note_id=remind_note_id(self.qid))
        if not self.store.remind(note, self.child_name):
            return  # not this actor's row any more (see _move)
        self.spec = dataclasses.replace(self.spec, reminded=True)
        self._log("reminded", {"left_ms": round(left_s * 1000)})
        self.delivery.tell(note)

    def _is_open(self) -> bool:
        return self.state in _OPEN

    def _log(self, event: Event, detail: dict[str, Any]) -> None:
        self.logger.tell(LogEvent(log_record(self.now(), self.qid, event, detail)))

    def _move(self, event: Event, detail: dict[str, Any], *, owed: SendResponse | None = None,
              answer_file: tuple[str, FileSignature] | None = None,
              note: SendText | None = None, undelivered_at: float | None = None) -> bool:
        """C19's transition, stored before any effect (with what it owes), then logged."""
        state = transition(self.state, event)
        store = self.store
        if state == "pending" or state == "delivered":
            owned = store.set_state(self.qid, state, owner=self.child_name)
        else:
            owned = store.close(self.qid, state, owner=self.child_name, response=owed,
                                answer_file=answer_file, note=note, undelivered_at=undelivered_at)
        if not owned:  # the row is another actor's now, or closed: this one ends
            self.state = None
            self._close()
            return False
        self.state = state
        self._log(event, detail)
        return True

    def _note(self, text: str, purpose: TextPurpose) -> SendText:
        return SendText(self.qid, text, purpose, note_id=f"{self.child_name}:{purpose}")

    def _owed(self, response: Any, error: str | None) -> SendResponse:
        """Tagged with who owes it, the outbox's key."""
        return SendResponse(self.spec.prompt, response, error, self.child_name)

    def _close(self, answer_file: tuple[str, FileSignature] | None = None) -> None:
        """The end is told first, so the open count (C21) is right before anyone hears of it."""
        self.release()
        self.router.tell(QuestionClosed(self.qid, self.child_name, answer_file))
        self.stop()
