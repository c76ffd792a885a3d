"""QuestionRouter: the table of open questions, and every decision that needs it.

It owns the qid -> question table, the memory of recently closed qids and of
the answer files they used, admission (a prompt is stored before its ack, and
refused past `--max-open` or when the qid is not the prompt's to use), answer
routing and cancel routing (only the asker cancels), and it answers the queue
depth. It runs no question itself: the QuestionSupervisor does, and
the Router reaches each question through the question's Slot, so an answer
file takes two hops (Watcher -> Router -> Question).

The decisions are pure functions in `messages.contract` (`triage_answer`,
`validate_answer`, `admission`, `over_capacity`, `cancel_target`, `may_cancel`,
`effective_timeout_ms`); this actor applies them
to its table and does what they say.

Its table is rebuilt from the store whenever it starts: on the daemon's start
(restore) and after a crash of its own or of the QuestionSupervisor (the
questions are then started afresh from their rows, under new names, so the
owner guard in the store keeps any leftover actor from writing).
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ulid import ULID

from ..messages.commands import (
    Address,
    AdmissionRefused,
    AnswerArrived,
    AnswerFileSeen,
    CancelQuestion,
    CancelRequested,
    DisposeAnswerFile,
    FileSignature,
    LogEvent,
    NewQuestion,
    OfferAgain,
    QuestionClosed,
    QuestionRestarted,
    QuestionSpec,
    QueueDepthQuery,
    RemoveAnswerFile,
    ResetQuestions,
    RestoreQuestions,
    SendResponse,
    SendText,
    StartQuestion,
    UnknownMessage,
)
from ..messages.contract import (
    INVALID_QID_ERROR,
    NOT_ADMITTED,
    Accepted,
    AlreadyOpen,
    Answering,
    Late,
    OwnedElsewhere,
    Refused,
    Rejected,
    ToValidate,
    Undelivered,
    admission,
    answer_name,
    cancel_refused_record,
    cancel_target,
    duplicate_refused_record,
    effective_timeout_ms,
    foreign_verdict,
    format_question,
    late_note,
    log_record,
    may_cancel,
    over_asker_limit,
    over_capacity,
    parse_prompt,
    qid_of,
    triage_answer,
    undelivered_note,
    validate_answer,
)
from ..messages.model import Event, State
from ..messages.wire import PromptEnvelope
from .base import PooledService, Slot, report, utc_now
from .config import DEFAULT_MAX_OPEN, DEFAULT_PROJECT
from .store import CLOSED_MEMORY, Store, sibling_of


@dataclass(slots=True)
class OpenQuestion:
    """The Router's view of one open question: where to reach it, whose it is
    (the prompt that opened it, X2), and if it is answering (which file it handles
    needs no field: an answer to a qid has one name, and the Watcher holds its
    version)."""

    qid: str
    child: str
    slot: Slot
    prompt: PromptEnvelope
    answering: bool = False


class _Answering(Mapping[str, bool]):
    """Which open questions are handling an answer: a view of the table, not a copy,
    so that routing one answer costs the same with 10 or 10,000 questions open."""

    def __init__(self, table: dict[str, OpenQuestion]) -> None:
        self._table = table

    def __getitem__(self, qid: str) -> bool:
        return self._table[qid].answering

    def __iter__(self) -> Iterator[str]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)


class QuestionRouter(PooledService):
    """Owns the question table; told by the Peer, the Watcher and the questions."""

    def __init__(
        self,
        *,
        supervisor: Address,
        questions: Address,
        peer: Address,
        delivery: Address,
        watcher: Address,
        logger: Address,
        store: Store,
        timeout_ms: float,
        run_tag: str,
        resume_owed: bool,
        project: str = DEFAULT_PROJECT,
        max_open: int = DEFAULT_MAX_OPEN,
        max_open_per_asker: int | None = None,
        now: Callable[[], datetime] = utc_now,
        clock: Callable[[], float] = time.time,
        sibling: Callable[[str], str | None] | None = None,
        name: str = "router",
    ) -> None:
        """`sibling(qid)` names the other project on this host whose bridge owns
        `qid` (X6); by default it reads their state files beside ours."""
        super().__init__(name, supervisor)
        self.sibling = sibling or (lambda qid: sibling_of(store.path, qid, self.clock()))
        self.questions = questions
        self.peer = peer
        self.delivery = delivery
        self.watcher = watcher
        self.logger = logger
        self.store = store
        self.timeout_ms = timeout_ms
        self.project = project
        self.run_tag = run_tag
        self.max_open = max_open
        self.max_open_per_asker = max_open_per_asker
        self.resume_owed = resume_owed
        self.now = now
        self.clock = clock
        self.open: dict[str, OpenQuestion] = {}
        self.closed: OrderedDict[str, State] = OrderedDict()
        self._serial = itertools.count(1)

    # -- life ---------------------------------------------------------------

    def begin(self) -> None:
        """Rebuild the table from the store before the first message is read.

        The Watcher's files and the Peer's prompts queue in this actor's
        mailbox meanwhile, so answers written while the daemon was down find
        their questions, and no prompt is admitted against a half-built table.
        """
        open_specs, closed = self.store.load()
        for qid, state in closed:
            self._remember_closed(qid, state)
        if self.resume_owed:  # decided by the last run, never handed over
            for owed in self.store.outbox():
                self.peer.tell(owed)
            for note in self.store.owed_notes():
                self.delivery.tell(note)
        self._restart_all(open_specs)
        if not self.resume_owed:
            # A restart of the Router itself: an answer the old questions were handling
            # may have died with them, and this table does not know which; each open
            # question's file (if any) is looked at again now, not after 30 s.
            for spec in open_specs:
                self.watcher.tell(OfferAgain(answer_name(spec.qid)))
        if self.resume_owed and (open_specs or closed):
            report(f"restored {len(open_specs)} open and {len(closed)} closed question(s)", "info")

    def _restart_all(self, specs: list[QuestionSpec]) -> None:
        """Start every open question afresh from its row (start, or after a crash).

        An answer a retired question was handling may have died with it: its file
        is offered again at once, not after the watcher's 30 s safety net (if the
        old question did finish with it, it is then the file that answered).
        """
        handling = [answer_name(q.qid) for q in self.open.values() if q.answering]
        for old in self.open.values():
            old.slot.retire()
        self.open.clear()
        self.questions.tell(ResetQuestions())
        for spec in specs:
            started = self._start(spec, claim=True)
            # A question that never got past `pending` may or may not have reached
            # Telegram: send it again (at least once). A fresh one (no state yet)
            # logs question_received as it starts.
            if started is not None and spec.state in (None, "pending"):
                self._deliver(spec, started)
        for name in handling:
            self.watcher.tell(OfferAgain(name))

    # -- messages -----------------------------------------------------------

    def on_receive(self, message: Any) -> Any:
        match message:
            case NewQuestion(envelope=envelope, reply=reply):
                reply(self._admit(envelope))
            case CancelQuestion(envelope=envelope):
                qid = cancel_target(envelope.ref_msg_id, self.open)
                if qid is not None:
                    if may_cancel(envelope, self.open[qid].prompt):
                        self.open[qid].slot.tell(CancelRequested())
                    else:  # X2: only the asker cancels; acked all the same (C12)
                        self.logger.tell(LogEvent(cancel_refused_record(self.now(), envelope)))
            case QueueDepthQuery(reply=reply):
                reply(len(self.open))
            case AnswerFileSeen(name=name, content=content, signature=signature):
                self._route_answer(name, content, signature)
            case QuestionClosed(qid=qid, state=state, child=child):
                self._closed(qid, state, child)
            case QuestionRestarted(qid=qid, child=child):
                question = self.open.get(qid)
                if question is not None and question.child == child:
                    # the answer it was handling may have died with it: take it again
                    if question.answering:
                        self.watcher.tell(OfferAgain(answer_name(qid)))
                    question.answering = False
            case RestoreQuestions():
                self._restart_all(self.store.load()[0])
            case _:
                raise UnknownMessage(self.child_name, message)
        return None

    def _admit(self, envelope: PromptEnvelope) -> str | None:
        """Admission's answer for the asker: None to ack, else the nack's error.

        An unforeseen fault (the store could not take it) is our words to the
        asker and the cause on stderr, never a crash: the Router's table is fine.
        """
        try:
            self._new_question(envelope)
        except AdmissionRefused as exc:  # full, its asker's share, not its qid (X2): as is
            return str(exc)
        except Exception as exc:
            report(f"could not take question {envelope.msg_id!r}: {exc!r}", "error")
            return NOT_ADMITTED
        return None

    def _new_question(self, envelope: PromptEnvelope) -> None:
        """Returns once the question is stored, or at once for its own asker's identical
        resend (X2); raises AdmissionRefused when the qid is someone else's or closed
        too recently (X2) or the bridge is full, and anything else when the store could
        not take it: the asker is nacked either way.
        """
        qid = qid_of(envelope)
        if qid is None:  # C3: never reaches Telegram
            self.peer.tell(SendResponse(envelope, None, INVALID_QID_ERROR))
            return
        current = self.open.get(qid)
        verdict = admission(
            qid, envelope, current.prompt if current else None, qid in self.closed
        )
        if isinstance(verdict, AlreadyOpen):  # its asker retrying: ack, nothing more
            return
        if isinstance(verdict, Refused):
            record = duplicate_refused_record(self.now(), qid, envelope, verdict)
            self.logger.tell(LogEvent(record))
            raise AdmissionRefused(verdict.error)
        refusal = over_asker_limit(
            envelope.sender_name, self._open_of(envelope.sender_name), self.max_open_per_asker
        ) or over_capacity(len(self.open), self.max_open)
        if refusal is not None:
            raise AdmissionRefused(refusal)
        timeout_ms = effective_timeout_ms(envelope, self.timeout_ms)  # X5
        spec = QuestionSpec(
            qid=qid,
            prompt=envelope,
            parsed=parse_prompt(envelope),
            timeout_ms=timeout_ms,
            deadline=self.clock() + timeout_ms / 1000,
        )
        question = self._start(spec, claim=False)
        if question is not None:
            self._deliver(spec, question)

    def _open_of(self, asker: str) -> int:
        """X10: the asker's open questions, counted from the table only when the limit is
        set (no second copy of the open set to keep in step)."""
        if self.max_open_per_asker is None:
            return 0
        return sum(1 for question in self.open.values() if question.prompt.sender_name == asker)

    def _start(self, spec: QuestionSpec, *, claim: bool) -> OpenQuestion | None:
        """Write (or claim) the row, then have the QuestionSupervisor run the question."""
        # The names are unique across runs and restarts: the store's owner guard
        # and the outbox key on them.
        child = f"question:{spec.qid}:{self.run_tag}.{next(self._serial)}"
        if claim:
            if not self.store.claim(spec.qid, child):
                return None
        else:
            self.store.put_open(spec, owner=child)  # before the ack, before delivery
        question = OpenQuestion(spec.qid, child, Slot(child), spec.prompt)
        self.open[spec.qid] = question
        self.questions.tell(StartQuestion(spec, child, question.slot))
        return question

    def _deliver(self, spec: QuestionSpec, question: OpenQuestion) -> None:
        # Requested here, in arrival order, so questions reach the chat in the
        # order they were asked.
        text = format_question(spec.qid, spec.parsed, project=self.project)
        self.delivery.tell(SendText(spec.qid, text, "question", reply_to=question.slot))

    def _route_answer(self, name: str, content: bytes | None, signature: FileSignature) -> None:
        verdict = triage_answer(name, _Answering(self.open), self.closed)
        match verdict:
            case Answering():
                return  # the same file seen twice is handled once
            case Late(qid=qid):
                if self.store.answered_by(qid) == (name, signature):
                    # The very file that answered it: offered again before the Watcher
                    # removed it, or left behind by a crash. Not late.
                    self.watcher.tell(RemoveAnswerFile(name, signature))
                else:
                    self._late(name, signature, verdict)
                return
            case Rejected(reason="foreign_qid", qid=str(qid)):
                self._foreign(name, signature, qid)
                return
            case Rejected():
                self.watcher.tell(DisposeAnswerFile(name, signature, verdict))
                return
            case ToValidate(qid=qid):
                checked = validate_answer(name, content, self.open)
                if isinstance(checked, Accepted):
                    question = self.open[qid]
                    question.answering = True
                    question.slot.tell(AnswerArrived(checked.answer, name, signature))
                else:
                    self.watcher.tell(DisposeAnswerFile(name, signature, checked))

    def _foreign(self, name: str, signature: FileSignature, qid: str) -> None:
        """Neither open nor closed here: ours undelivered (X11), a sibling's (X6), or foreign."""
        undelivered = self.store.undelivered(qid, self.clock())
        # siblings' files are read only when our own memory does not decide it
        verdict = foreign_verdict(qid, undelivered, None if undelivered else self.sibling(qid))
        match verdict:
            case Undelivered():
                note = SendText(qid, undelivered_note(qid), "undelivered_note",
                                note_id=f"undelivered:{qid}:{ULID()}")
                detail = {"reason": "foreign_qid", "file": name, "delivery_failed": True}
                self._noted_answer(name, signature, note, "answer_rejected", detail)
            case OwnedElsewhere() | Rejected():
                self.watcher.tell(DisposeAnswerFile(name, signature, verdict))

    def _late(self, name: str, signature: FileSignature, verdict: Late) -> None:
        """C15: decided here, so the note is owed (stored) the moment it is decided."""
        qid = verdict.qid
        note = SendText(qid, late_note(qid), "late_note", note_id=f"late:{qid}:{ULID()}")
        self._noted_answer(name, signature, note, "late_answer", {"state": verdict.state})

    def _noted_answer(
        self, name: str, signature: FileSignature, note: SendText, event: Event,
        detail: dict[str, Any],
    ) -> None:
        """An answer that is not passed on but gets the human a note (C15, X11): the
        note is owed (stored) the moment it is decided, the file removed. Once per
        version: the Watcher never offers a version again once told to remove it."""
        self.store.owe_note(note)
        self.watcher.tell(RemoveAnswerFile(name, signature))
        self.logger.tell(LogEvent(log_record(self.now(), note.qid, event, detail)))
        self.delivery.tell(note)

    def _closed(self, qid: str, state: State | None, child: str) -> None:
        question = self.open.get(qid)
        if question is None or question.child != child:
            return
        del self.open[qid]
        question.slot.retire()
        if state is not None:  # C18: a failed delivery leaves no trace of the qid
            self._remember_closed(qid, state)

    def _remember_closed(self, qid: str, state: State) -> None:
        self.closed[qid] = state
        self.closed.move_to_end(qid)
        while len(self.closed) > CLOSED_MEMORY:
            self.closed.popitem(last=False)
