"""DeliveryActor: the only caller of `hermes send` (W20, C18).

Sends run one at a time, in the order they were asked for, so that a note
never overtakes the question it follows in the human's chat. The blocking
subprocess wait lives in a worker thread owned by the actor: the actor's own
mailbox stays responsive (stop in particular), and a wedged hermes costs at
most one send timeout, after which its whole process group is killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections import deque
from collections.abc import Callable
from datetime import datetime
from typing import Any

from coms_hermes_bridge.actors.base import Child, report, utc_now
from coms_hermes_bridge.messages.commands import (
    Address,
    Delivered,
    DeliveryFailed,
    LogEvent,
    SendText,
    UnknownMessage,
)
from coms_hermes_bridge.messages.contract import delivery_error, format_ms, log_record

# How long release() waits for the worker to notice; the daemon has 2 s to exit.
_RELEASE_JOIN_S = 0.4



def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill hermes and anything it spawned: it runs as leader of its own session."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class DeliveryActor(Child):
    """Queues SendText jobs for a worker thread that runs hermes for each in turn."""

    def __init__(
        self,
        *,
        supervisor: Address,
        logger: Address,
        target: str,
        profile: str | None,
        send_timeout_ms: float,
        hermes: str = "hermes",
        now: Callable[[], datetime] = utc_now,
        note_sent: Callable[[str], None] | None = None,
        name: str = "delivery",
    ) -> None:
        super().__init__(name, supervisor)
        self.logger = logger
        self.target = target
        self.profile = profile
        self.send_timeout_ms = send_timeout_ms
        self.hermes = hermes
        self.now = now
        self.note_sent = note_sent
        # The jobs and the one being run, under one lock with the stop flag, so
        # that a crash can hand every unfinished job over (see taken()).
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._jobs: deque[SendText] = deque()
        self._current: SendText | None = None
        self._stopping = False
        self._running: subprocess.Popen[bytes] | None = None
        self._worker = threading.Thread(
            target=self._work, name=f"{name}-worker", daemon=True
        )
        self._worker.start()

    def on_receive(self, message: Any) -> None:
        match message:
            case SendText():
                with self._wake:
                    self._jobs.append(message)
                    self._wake.notify()
            case _:
                raise UnknownMessage(self.child_name, message)

    def release(self) -> None:
        with self._wake:
            self._stopping = True
            running = self._running
            self._wake.notify_all()
        if running is not None:
            _kill_group(running)
        if threading.current_thread() is not self._worker:
            self._worker.join(timeout=_RELEASE_JOIN_S)

    def taken(self) -> tuple[SendText, ...]:
        """On a crash: the send that was cut short, then the queue, for the successor.

        The cut-short send may have reached the chat already; it is sent again
        (at least once) rather than risk that a question never does.
        """
        with self._lock:
            jobs = ([self._current] if self._current is not None else []) + list(self._jobs)
            self._current = None
            self._jobs.clear()
        return tuple(jobs)

    def argv(self, text: str) -> list[str]:
        """W20: hermes [--profile P] send --to <target> <text>, never through a shell."""
        profile = ["--profile", self.profile] if self.profile else []
        return [self.hermes, *profile, "send", "--to", self.target, text]

    # -- the worker thread --------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._wake:
                while not self._jobs and not self._stopping:
                    self._wake.wait()
                if self._stopping:
                    return
                job = self._current = self._jobs.popleft()
            try:
                error = self._run(job.text)
            except Exception as exc:  # the worker must outlive any one bad send
                error = delivery_error(None, f"{type(exc).__name__}: {exc}")
            if self._stopped():
                return  # killed by release(): the job goes to the successor (taken())
            self._settle(job, error)
            with self._lock:
                self._current = None

    def _stopped(self) -> bool:
        with self._lock:
            return self._stopping

    def _run(self, text: str) -> str | None:
        """Run one send; None when hermes said it sent, else C18's error text."""
        with self._lock:
            if self._stopping:
                return None
            try:
                proc = subprocess.Popen(
                    self.argv(text),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                )
            except (OSError, ValueError) as exc:
                return delivery_error(None, str(exc))
            self._running = proc
        try:
            try:
                out, err = proc.communicate(timeout=self.send_timeout_ms / 1000)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                self._reap(proc)
                return delivery_error(
                    None, f"timed out after {format_ms(self.send_timeout_ms)}ms"
                )
        finally:
            with self._lock:
                self._running = None
        if proc.returncode == 0:
            return None
        return delivery_error(
            proc.returncode,
            err.decode("utf-8", "replace"),
            out.decode("utf-8", "replace"),
        )

    @staticmethod
    def _reap(proc: subprocess.Popen[bytes]) -> None:
        # A grandchild that left the group may still hold the pipes open, so
        # drain them only briefly; the exit status is what must be collected.
        try:
            proc.communicate(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
        proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()

    def _settle(self, job: SendText, error: str | None) -> None:
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
            # hermes ran it (sent, or failed and logged above): no longer owed (9.7)
            try:
                self.note_sent(job.note_id)
            except Exception as exc:
                report(f"could not record the {job.purpose} for {job.qid} as sent: {exc!r}")
