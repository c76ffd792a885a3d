"""One QuestionActor per open question: its state machine and its timer (C13-C19).

The actor is the only place a question's state changes. Each transition goes
through the pure `transition` table, is written to the question's store row
(the one record of its state: a restarted question resumes from that row), and
is logged. A terminal question tells the Router (which keeps the table of open
questions) and its QuestionSupervisor, and stops itself.

Questions are many and mostly idle, so they hold no thread: each runs its
turns on the shared dispatcher (actors/dispatch.py) and its deadline is one
timer on the I/O edge (actors/edge.py).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from ..messages.commands import (
    Address,
    AnswerArrived,
    AnswerFileSeen,
    CancelRequested,
    Delivered,
    DeliveryFailed,
    FileSignature,
    LogEvent,
    QuestionClosed,
    QuestionSpec,
    RemindDue,
    RemoveAnswerFile,
    SendResponse,
    SendText,
    TextPurpose,
    TimedOut,
    UnknownMessage,
)
from ..messages.contract import (
    cancel_note,
    log_record,
    map_answer,
    remind_after_s,
    remind_note,
    timeout_error,
    timeout_note,
    transition,
)
from ..messages.model import Event, State
from .base import PooledChild, utc_now
from .edge import Edge, Timer, shared_edge
from .store import Store, remind_note_id


class QuestionActor(PooledChild):
    """Owns one qid's state and timer; everything else it asks of others by message."""

    def __init__(
        self,
        *,
        spec: QuestionSpec,
        supervisor: Address,
        router: Address,
        me: Address,
        peer: Address,
        delivery: Address,
        logger: Address,
        watcher: Address,
        target: str,
        name: str,
        store: Store | None = None,
        now: Callable[[], datetime] = utc_now,
        clock: Callable[[], float] = time.time,
        edge: Edge | None = None,
        remind_before_ms: float | None = None,
    ) -> None:
        super().__init__(name, supervisor)
        self.remind_before_ms = remind_before_ms
        self.spec = spec
        self.qid = spec.qid
        self.state: State | None = spec.state
        self.me = me
        self.router = router
        self.peer = peer
        self.delivery = delivery
        self.logger = logger
        self.watcher = watcher
        self.target = target
        self.store = store
        self.now = now
        self.clock = clock
        self.edge = edge or shared_edge()
        self._timer: Timer | None = None
        self._reminder: Timer | None = None

    # -- life ---------------------------------------------------------------

    def begin(self) -> None:
        # The Router requests the question's delivery itself, in arrival
        # order; the questions' first turns come in no promised order.
        if self.state is None:
            if not self._move("question_received", {"from": self.spec.prompt.sender_name}):
                return
        elif not self._is_open():
            # crashed after reaching its end but before reporting it: finish the job
            self._close()
            return
        self._arm_timer()

    def release(self) -> None:
        for timer in (self._timer, self._reminder):
            if timer is not None:
                timer.cancel()
        self._timer = self._reminder = None

    def _arm_timer(self) -> None:
        """Fire at the question's absolute deadline, so a restart keeps the clock running;
        and its reminder (X9) at its own absolute moment, unless it was decided already
        (a moment passed while the daemon was down fires at once)."""
        me = self.me
        self._timer = self.edge.at(self.spec.deadline, lambda: me.tell(TimedOut()))
        after = remind_after_s(self.spec.timeout_ms, self.remind_before_ms)
        if self._reminds() and after is not None:
            asked = self.spec.deadline - self.spec.timeout_ms / 1000
            self._reminder = self.edge.at(asked + after, lambda: me.tell(RemindDue()))

    # -- messages -----------------------------------------------------------

    def on_receive(self, message: Any) -> None:
        match message:
            case Delivered():
                if self.state == "pending":
                    self._move("delivered", {"to": self.target})
            case DeliveryFailed(error=error):
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
                    if self._move(
                        "answered",
                        {"answered_by": answer.answered_by},
                        owed=owed,
                        answer_file=(name, signature),
                    ):
                        self._close()
                        self.peer.tell(owed)
                        self.watcher.tell(RemoveAnswerFile(name, signature))
                else:
                    # closed between the Router's look and ours: the Router judges it
                    # again, now that it knows (late, C15: one path, the note owed)
                    self.router.tell(AnswerFileSeen(name, None, signature))
            case CancelRequested():
                note = self._note(cancel_note(self.qid), "cancel_note")
                if self._is_open() and self._move(
                    "cancelled", {"reason": "cancel envelope"}, note=note
                ):
                    self._close()
                    self.delivery.tell(note)
            case RemindDue():
                if self._is_open() and self._reminds():
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

    # -- helpers ------------------------------------------------------------

    def _reminds(self) -> bool:
        """X9: a reminder is configured, useful for this question, not yet decided, and
        the question is not past its deadline (a restart after both moments passed: the
        timeout comes, not a reminder with nothing left)."""
        return (not self.spec.reminded
                and remind_after_s(self.spec.timeout_ms, self.remind_before_ms) is not None
                and self.clock() < self.spec.deadline)

    def _remind(self) -> None:
        """X9: decided once, stored as owed with the mark on the row, then sent."""
        left_s = max(0.0, self.spec.deadline - self.clock())
        text = remind_note(self.qid, left_s, self.spec.parsed.question)
        note = SendText(self.qid, text, "remind_note", note_id=remind_note_id(self.qid))
        if self.store is not None and not self.store.remind(note, self.child_name):
            return  # not this actor's row any more (see _move)
        self.spec = dataclasses.replace(self.spec, reminded=True)
        self.logger.tell(LogEvent(log_record(
            self.now(), self.qid, "reminded", {"left_ms": round(left_s * 1000)})))
        self.delivery.tell(note)

    def _is_open(self) -> bool:
        return self.state in ("pending", "delivered")

    def _move(
        self,
        event: Event,
        detail: dict[str, Any],
        *,
        owed: SendResponse | None = None,
        answer_file: tuple[str, FileSignature] | None = None,
        note: SendText | None = None,
        undelivered_at: float | None = None,
    ) -> bool:
        """Apply a C19 transition, make it durable and log it (C20).

        The store is written synchronously and first, so that an effect that
        follows is never done for a state a restart would not know about; a
        response the asker is `owed` and a `note` the human is owed are stored
        with the closing state, so a crash before they are handed over sends
        them at the next start instead of losing them.
        """
        state = transition(self.state, event)
        if self.store is not None:
            if state == "pending" or state == "delivered":
                owned = self.store.set_state(self.qid, state, owner=self.child_name)
            else:
                owned = self.store.close(
                    self.qid,
                    state,
                    owner=self.child_name,
                    response=owed,
                    answer_file=answer_file,
                    note=note,
                    undelivered_at=undelivered_at,
                )
            if not owned:
                # The row is another actor's now (the questions were restarted under
                # new names, or the question was closed for good): this one must do
                # nothing more in the qid's name. Its supervisor forgets it; the
                # Router knows it by name only and ignores it.
                self.release()
                self.supervisor.tell(QuestionClosed(self.qid, None, self.child_name))
                self.stop()
                return False
        self.state = state
        self.logger.tell(LogEvent(log_record(self.now(), self.qid, event, detail)))
        return True

    def _note(self, text: str, purpose: TextPurpose) -> SendText:
        """A note for the human, with the id under which the store keeps it until sent."""
        return SendText(self.qid, text, purpose, note_id=f"{self.child_name}:{purpose}")

    def _owed(self, response: Any, error: str | None) -> SendResponse:
        """The response the asker is owed, tagged with who owes it (for the outbox)."""
        return SendResponse(self.spec.prompt, response, error, self.child_name)

    def _close(self) -> None:
        """Report the end first, so the open count (ping, C21) is right before anyone
        hears of it; the effects follow in the same message, then the actor stops."""
        self.release()
        closed = QuestionClosed(self.qid, self.state, self.child_name)
        self.router.tell(closed)
        self.supervisor.tell(closed)  # so it stops watching over this question
        self.stop()
