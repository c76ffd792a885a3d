"""DeliveryActor: the only caller of `hermes send` (W20, C18).

Sends run one at a time, in the order they were asked for, so that a note
never overtakes the question it follows in the human's chat. The process is
run by the I/O edge (`run_process`), which tells this actor `HermesRan` when
it is over: the actor's turns never wait, and a wedged hermes costs at most
one send timeout, after which its whole process group is killed.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
from collections import deque
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pykka

from ..messages.commands import (
    Address,
    Delivered,
    DeliveryFailed,
    HermesRan,
    LogEvent,
    SendText,
    UnknownMessage,
)
from ..messages.contract import delivery_error, format_ms, log_record
from .base import PooledService, report, utc_now
from .edge import OUTPUT_TAIL, Edge, ProcessResult, run_process, shared_edge

__all__ = ["OUTPUT_TAIL", "DeliveryActor"]


class DeliveryActor(PooledService):
    """Queues SendText jobs and has the edge run hermes for each in turn."""

    def __init__(
        self,
        *,
        supervisor: Address,
        logger: Address,
        target: str,
        profile: str | None,
        send_timeout_ms: float,
        hermes: str,
        now: Callable[[], datetime] = utc_now,
        note_sent: Callable[[str], None] | None = None,
        note_owed: Callable[[str], bool] | None = None,
        name: str = "delivery",
        edge: Edge | None = None,
    ) -> None:
        super().__init__(name, supervisor)
        self.logger = logger
        self.target = target
        self.profile = profile
        self.send_timeout_ms = send_timeout_ms
        self.hermes = hermes
        self.now = now
        self.note_sent = note_sent
        self.note_owed = note_owed
        self.edge = edge or shared_edge()
        self._jobs: deque[SendText] = deque()
        self._current: SendText | None = None
        self._running: concurrent.futures.Future[ProcessResult] | None = None

    def on_receive(self, message: Any) -> None:
        match message:
            case SendText():
                self._jobs.append(message)
                self._next()
            case HermesRan(job=job, error=error):  # of the current job: only it runs
                self._current = self._running = None
                self._settle(job, error)
                self._next()
            case _:
                raise UnknownMessage(self.child_name, message)

    def release(self) -> None:
        running, self._running = self._running, None
        if running is not None:
            running.cancel()  # the edge kills hermes' group; the job goes on in taken()

    def taken(self) -> tuple[SendText, ...]:
        """On a crash: the send that was cut short, then the queue, for the successor.

        The cut-short send may have reached the chat already; it is sent again
        (at least once) rather than risk that a question never does.
        """
        return (*([self._current] if self._current is not None else []), *self._jobs)

    def argv(self, text: str) -> list[str]:
        """W20: hermes [--profile P] send --to <target> <text>, never through a shell."""
        profile = ["--profile", self.profile] if self.profile else []
        return [self.hermes, *profile, "send", "--to", self.target, text]

    # -- one send at a time ---------------------------------------------------

    def _next(self) -> None:
        """Start the next job unless one is running; a withdrawn reminder is skipped."""
        while self._current is None and self._jobs:
            job = self._jobs.popleft()
            if self._withdrawn(job):
                continue
            self._current = job
            self._running = self.edge.spawn(
                run_process(self.argv(job.text), self.send_timeout_ms / 1000))
            self._running.add_done_callback(functools.partial(self._ran, job))

    def _ran(self, job: SendText, done: concurrent.futures.Future[ProcessResult]) -> None:
        """On the edge: hand the outcome to the actor, unless it has stopped meanwhile."""
        if not done.cancelled():
            with contextlib.suppress(pykka.ActorDeadError):
                self.actor_ref.tell(HermesRan(job, self._judge(done)))

    def _judge(self, done: concurrent.futures.Future[ProcessResult]) -> str | None:
        """None when hermes said it sent, else C18's error text."""
        exc = done.exception()
        if isinstance(exc, OSError | ValueError):
            return delivery_error(None, str(exc))
        if exc is not None:
            return delivery_error(None, f"{type(exc).__name__}: {exc}")
        result = done.result()
        if result.returncode is None:
            return delivery_error(None, f"timed out after {format_ms(self.send_timeout_ms)}ms")
        if result.returncode == 0:
            return None
        return delivery_error(result.returncode, result.stderr, result.stdout)

    def _withdrawn(self, job: SendText) -> bool:
        """X9: a reminder whose question closed while it waited is no longer owed: the
        human is not reminded of a question that is over (checked just before hermes runs)."""
        if job.purpose != "remind_note" or job.note_id is None or self.note_owed is None:
            return False
        try:
            return not self.note_owed(job.note_id)
        except Exception as exc:  # the store cannot say: send it (at least once, like every note)
            report(f"{self.child_name}: cannot tell whether {job.note_id} is owed: {exc!r}")
            return False

    def _settle(self, job: SendText, error: str | None) -> None:
        if error is not None:
            report(f"{job.purpose} for {job.qid} not delivered: {error}", "error")
        try:
            if job.reply_to is not None:
                result = Delivered(job.qid) if error is None else DeliveryFailed(job.qid, error)
                job.reply_to.tell(result)
            elif error is not None:
                # A note has nobody waiting on it, so its failure is only recorded (C18, C20).
                detail = {"phase": job.purpose, "error": error}
                record = log_record(self.now(), job.qid, "delivery_error", detail)
                self.logger.tell(LogEvent(record))
        except Exception as exc:  # e.g. the question stopped meanwhile
            report(f"{self.child_name}: result of {job.purpose} for {job.qid} undeliverable: {exc}")
        if job.note_id is not None and self.note_sent is not None:
            # hermes ran it (sent, or failed and logged above): no longer owed
            try:
                self.note_sent(job.note_id)
            except Exception as exc:
                report(f"could not record the {job.purpose} for {job.qid} as sent: {exc!r}")
