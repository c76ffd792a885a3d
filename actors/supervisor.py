"""The Supervisor: the root of the actor tree and the owner of the question table.

It starts the four permanent children with their collaborators' slots, one
QuestionActor per open qid, and restarts whatever crashes: permanent children
always, a question from the state it last reported with its deadline intact.
Restarts are bounded as in OTP (at most `max_restarts` per child within
`restart_window_s`); past that the daemon gives up and exits 1 so that its
service manager starts it afresh.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import TracebackType
from typing import Any

import pykka

from coms_hermes_bridge.actors.base import Slot, report, utc_now
from coms_hermes_bridge.actors.config import BridgeConfig
from coms_hermes_bridge.actors.delivery import DeliveryActor
from coms_hermes_bridge.actors.logger import LoggerActor
from coms_hermes_bridge.actors.peer import PeerActor, PeerIdentity
from coms_hermes_bridge.actors.question import QuestionActor
from coms_hermes_bridge.actors.store import CLOSED_MEMORY, Store
from coms_hermes_bridge.actors.watcher import WatcherActor
from coms_hermes_bridge.messages.commands import (
    AnswerArrived,
    AnswerFileSeen,
    CancelQuestion,
    CancelRequested,
    ChildFailed,
    DisposeAnswerFile,
    FileSignature,
    NewQuestion,
    QuestionClosed,
    QuestionSpec,
    QueueDepthQuery,
    RemoveAnswerFile,
    SendResponse,
    SendText,
    StateReported,
    UnknownMessage,
)
from coms_hermes_bridge.messages.contract import (
    INVALID_QID_ERROR,
    Accepted,
    Late,
    classify_answer,
    format_question,
    parse_prompt,
    qid_of,
)
from coms_hermes_bridge.messages.model import State
from coms_hermes_bridge.messages.wire import PromptEnvelope

ADMIT_TIMEOUT_S = 5.0
PERMANENT = ("logger", "delivery", "watcher", "peer")



@dataclass
class ChildSpec:
    """How to (re)start one permanent child, and when it last had to be."""

    slot: Slot
    start: Callable[[], pykka.ActorRef[Any]]
    restarts: deque[float] = field(default_factory=deque)


@dataclass
class OpenQuestion:
    """The Supervisor's view of one open question."""

    spec: QuestionSpec
    slot: Slot
    child: str
    answering: bool = False
    restarts: deque[float] = field(default_factory=deque)


class Supervisor(pykka.ThreadingActor):
    """Root of the tree; never asks a child anything, only tells."""

    use_daemon_thread = True

    def __init__(
        self,
        *,
        config: BridgeConfig,
        identity: PeerIdentity,
        on_fatal: Callable[[str], None],
        store: Store | None = None,
        max_restarts: int = 5,
        restart_window_s: float = 10.0,
        now: Callable[[], datetime] = utc_now,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.config = config
        self.identity = identity
        self.on_fatal = on_fatal
        self.store = store
        self.max_restarts = max_restarts
        self.restart_window_s = restart_window_s
        self.now = now
        self.clock = clock
        self.monotonic = monotonic
        self.open: dict[str, OpenQuestion] = {}
        self.consumed: dict[str, tuple[str, FileSignature]] = {}
        self.closed: OrderedDict[str, State] = OrderedDict()
        self.children: dict[str, ChildSpec] = {}
        self._serial = itertools.count(1)
        self._failed = False
        me = self.actor_ref
        self.logger = Slot("logger")
        self.delivery = Slot("delivery")
        self.watcher = Slot("watcher")
        self.peer = Slot("peer")
        c = config
        self._permanent(
            self.logger, lambda: LoggerActor.start(supervisor=me, log_path=c.log_path)
        )
        self._permanent(
            self.delivery,
            lambda: DeliveryActor.start(
                supervisor=me,
                logger=self.logger,
                target=c.target,
                profile=c.hermes_profile,
                send_timeout_ms=c.send_timeout_ms,
                hermes=c.hermes,
                now=now,
            ),
        )
        self._permanent(
            self.watcher,
            lambda: WatcherActor.start(
                supervisor=me,
                router=me,
                logger=self.logger,
                delivery=self.delivery,
                questions_dir=c.questions_dir,
                poll_ms=c.poll_ms,
                claim_s=c.claim_ms / 1000,
                now=now,
            ),
        )
        self._permanent(
            self.peer,
            lambda: PeerActor.start(
                supervisor=me,
                identity=identity,
                questions=me,
                queue_depth=self._ask_queue_depth,
                admit=self._admit,
                settled=store.sent if store is not None else None,
                logger=self.logger,
            ),
        )

    def _permanent(self, slot: Slot, start: Callable[[], pykka.ActorRef[Any]]) -> None:
        self.children[slot.name] = ChildSpec(slot, start)

    def _admit(self, envelope: PromptEnvelope) -> None:
        """For the Peer's socket threads: return once the question is stored, so the ack
        means "durable". An error storing it comes back here, and the asker gets a nack."""
        try:
            self.actor_ref.ask(NewQuestion(envelope), block=True, timeout=ADMIT_TIMEOUT_S)
        except pykka.Timeout:
            report(f"question {envelope.msg_id} is queued but was not stored within "
                   f"{ADMIT_TIMEOUT_S:g}s; acking it anyway")

    def _ask_queue_depth(self) -> int:
        """For the Peer's socket and heartbeat threads: a bounded ask, never from an actor."""
        return int(self.actor_ref.ask(QueueDepthQuery(), block=True, timeout=2.0))

    # -- life ---------------------------------------------------------------

    def on_start(self) -> None:
        # Restore before the watcher's first scan, so that answers written while
        # the daemon was down find their questions; the Peer goes last: its
        # registry entry is the daemon's readiness (W7).
        try:
            for name in PERMANENT:
                if name == "watcher":
                    self._restore()
                spec = self.children[name]
                spec.slot.bind(spec.start())
        except Exception as exc:  # pykka would stop us silently; the daemon must exit
            self._fatal(f"could not start: {exc!r}")
            raise

    def _restore(self) -> None:
        """Reopen what the last run left open, and remember what it closed."""
        if self.store is None:
            return
        open_specs, closed = self.store.load()
        for qid, state in closed:
            self._remember_closed(qid, state)
        self.consumed = self.store.consumed()
        for owed in self.store.outbox():  # decided before the crash, never handed over
            self.peer.tell(owed)
        for spec in open_specs:
            question = self._start_question(spec)
            # A question that never got past `pending` may or may not have reached
            # Telegram: send it again (at-least-once). A fresh one (no state yet)
            # logs question_received as it starts.
            if spec.state in (None, "pending"):
                text = format_question(spec.qid, spec.parsed)
                self.delivery.tell(SendText(spec.qid, text, "question", reply_to=question.slot))
        if open_specs or closed:
            report(f"restored {len(open_specs)} open and {len(closed)} closed question(s)")

    def on_stop(self) -> None:
        # The Peer goes first: no new questions while the rest winds down.
        for name in reversed(PERMANENT):
            self._stop_ref(self.children[name].slot)
        for question in list(self.open.values()):
            self._stop_ref(question.slot)

    def on_failure(
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._fatal(f"supervisor failed: {exception_value!r}")

    @staticmethod
    def _stop_ref(slot: Slot) -> None:
        ref = slot.ref
        slot.retire()
        if ref is not None:
            try:
                ref.stop(block=True, timeout=1.0)
            except (pykka.ActorDeadError, pykka.Timeout):
                pass

    # -- messages -----------------------------------------------------------

    def on_receive(self, message: Any) -> Any:
        match message:
            case NewQuestion(envelope=envelope):
                self._new_question(envelope)
            case CancelQuestion(envelope=envelope):
                # C14: anything but an open qid is acked and otherwise ignored
                question = self.open.get(envelope.ref_msg_id)
                if question is not None:
                    question.slot.tell(CancelRequested())
            case QueueDepthQuery():
                return len(self.open)
            case AnswerFileSeen(name=name, content=content, signature=signature):
                self._route_answer(name, content, signature)
            case StateReported(qid=qid, state=state, child=child):
                question = self.open.get(qid)
                if question is not None and question.child == child:
                    question.spec = replace(question.spec, state=state)
            case QuestionClosed(qid=qid, state=state, child=child):
                self._closed(qid, state, child)
            case ChildFailed(child=child, error=error, unread=unread):
                self._child_failed(child, error, unread)
            case _:
                raise UnknownMessage("supervisor", message)
        return None

    def _new_question(self, envelope: Any) -> None:
        qid = qid_of(envelope)
        if qid is None:  # C3: never reaches Telegram
            self.peer.tell(SendResponse(envelope, None, INVALID_QID_ERROR))
            return
        replaced = self.open.pop(qid, None)
        if replaced is not None:  # a repeated qid replaces the old question and its timer
            # Without waiting: its store rows are guarded by owner, so it cannot
            # touch its successor's, and its slot drops whatever is told to it now.
            ref = replaced.slot.ref
            replaced.slot.retire()
            if ref is not None:
                ref.stop(block=False)
        self.closed.pop(qid, None)
        spec = QuestionSpec(
            qid=qid,
            prompt=envelope,
            parsed=parse_prompt(envelope),
            timeout_ms=self.config.timeout_ms,
            deadline=self.clock() + self.config.timeout_ms / 1000,
        )
        question = self._start_question(spec)
        text = format_question(qid, spec.parsed)
        self.delivery.tell(SendText(qid, text, "question", reply_to=question.slot))

    def _start_question(self, spec: QuestionSpec) -> OpenQuestion:
        # The run tag keeps names unique across restarts too: the outbox still
        # holds responses owed by the previous run's question actors.
        child = f"question:{spec.qid}:{self.identity.session_id[-8:]}.{next(self._serial)}"
        question = OpenQuestion(spec, Slot(child), child)
        if self.store is not None:  # the row exists before delivery is requested
            self.store.put_open(spec, owner=child)
        try:
            question.slot.bind(self._spawn_question(question))
        except Exception:
            # no actor, no question: the asker is nacked, so nothing may linger
            if self.store is not None:
                self.store.close(spec.qid, None, owner=child)
            raise
        self.open[spec.qid] = question
        return question

    def _spawn_question(self, question: OpenQuestion) -> pykka.ActorRef[Any]:
        spec, slot, child = question.spec, question.slot, question.child
        return QuestionActor.start(
            spec=spec,
            supervisor=self.actor_ref,
            me=slot,
            peer=self.peer,
            delivery=self.delivery,
            logger=self.logger,
            watcher=self.watcher,
            target=self.config.target,
            name=child,
            store=self.store,
            now=self.now,
            clock=self.clock,
        )

    def _route_answer(self, name: str, content: bytes | None, signature: Any) -> None:
        verdict = classify_answer(name, content, self.open, self.closed)
        if isinstance(verdict, Accepted):
            question = self.open[verdict.qid]
            if not question.answering:  # the same file seen twice is handled once
                question.answering = True
                question.slot.tell(AnswerArrived(verdict.answer, name, signature))
        elif isinstance(verdict, Late) and self.consumed.get(verdict.qid) == (name, signature):
            # the very file that answered it, left behind by a crash: not a late answer
            del self.consumed[verdict.qid]
            self.watcher.tell(RemoveAnswerFile(name, signature))
        else:
            self.watcher.tell(DisposeAnswerFile(name, signature, verdict))

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

    # -- supervision --------------------------------------------------------

    def _within_bound(self, restarts: deque[float]) -> bool:
        now = self.monotonic()
        while restarts and now - restarts[0] > self.restart_window_s:
            restarts.popleft()
        restarts.append(now)
        return len(restarts) <= self.max_restarts

    def _child_failed(self, child: str, error: str, unread: tuple[Any, ...]) -> None:
        spec = self.children.get(child)
        if spec is not None:
            if not self._within_bound(spec.restarts):
                self._fatal(f"{child} crashed {self.max_restarts + 1} times within "
                            f"{self.restart_window_s:g}s; last error: {error}")
                return
            report(f"{child} crashed ({error}); restarting it")
            spec.slot.bind(spec.start(), unread)
            return
        for question in self.open.values():
            if question.child == child:
                break
        else:
            return  # a question that closed or was replaced meanwhile
        if not self._within_bound(question.restarts):
            self._fatal(f"question {question.spec.qid} crashed {self.max_restarts + 1} times "
                        f"within {self.restart_window_s:g}s; last error: {error}")
            return
        report(f"{child} crashed ({error}); restarting it")
        # Same slot, so replies already addressed to the question still reach it;
        # it resumes from its last reported state, and a pending answer file is
        # offered again by the watcher's next scan.
        question.answering = False
        question.slot.bind(self._spawn_question(question), unread)

    def _fatal(self, reason: str) -> None:
        if not self._failed:
            self._failed = True
            report(reason)
            self.on_fatal(reason)
