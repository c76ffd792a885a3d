"""DeliveryActor: the only caller of `hermes send` (W20, C18).

Sends run one at a time, in the order they were asked for, so that a note
never overtakes the question it follows in the human's chat. The blocking
subprocess wait lives in a worker thread owned by the actor: the actor's own
mailbox stays responsive (stop in particular), and a wedged hermes costs at
most one send timeout, after which its whole process group is killed.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import datetime
from typing import Any

from ..messages.commands import (
    Address,
    Delivered,
    DeliveryFailed,
    LogEvent,
    SendText,
    UnknownMessage,
)
from ..messages.contract import delivery_error, format_ms, log_record
from .base import Child, report, utc_now

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


OUTPUT_TAIL = 4096
"""Bytes of each of hermes' streams kept for the error text: the end says why it failed."""

_READ_CHUNK = 65536
_POLL_S = 0.05  # how often the exit is checked where pidfd_open is missing


class _Outputs:
    """hermes' stdout and stderr, read as they come and kept to their last OUTPUT_TAIL bytes."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc
        self._tails: dict[int, bytearray] = {}
        self._selector = selectors.DefaultSelector()
        self._pidfd: int | None = None
        self._fds: dict[int, int] = {}
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                fd = pipe.fileno()
                self._fds[id(pipe)] = fd
                os.set_blocking(fd, False)
                self._tails[fd] = bytearray()
                self._selector.register(fd, selectors.EVENT_READ)
        try:
            self._pidfd = os.pidfd_open(proc.pid)
            self._selector.register(self._pidfd, selectors.EVENT_READ)
        except (AttributeError, OSError):
            self._pidfd = None

    def collect(self, timeout: float) -> bool:
        """Read until hermes exits (True) or `timeout` passes (False)."""
        deadline = time.monotonic() + timeout
        while self._proc.poll() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            wait = left if self._pidfd is not None else min(left, _POLL_S)
            for key, _ in self._selector.select(wait):
                if key.fd != self._pidfd:
                    self._read(key.fd)
        # Exited: take what is already in the pipes, never wait for more.
        for fd in list(self._tails):
            self._read(fd, until_empty=True)
        return True

    def _read(self, fd: int, until_empty: bool = False) -> None:
        for _ in range(64 if until_empty else 1):
            try:
                chunk = os.read(fd, _READ_CHUNK)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(fd)
                return
            tail = self._tails[fd]
            tail += chunk
            del tail[:-OUTPUT_TAIL]

    def text(self) -> tuple[str, str]:
        """(stdout, stderr) tails as text."""
        streams = (self._proc.stdout, self._proc.stderr)
        out, err = (self._tails.get(self._fds.get(id(pipe), -1), b"") for pipe in streams)
        return out.decode("utf-8", "replace"), err.decode("utf-8", "replace")

    def close(self) -> None:
        """Let go of the pipes whoever still holds their other ends."""
        self._selector.close()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        for pipe in (self._proc.stdout, self._proc.stderr):
            if pipe is not None:
                pipe.close()


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
        note_owed: Callable[[str], bool] | None = None,
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
        self.note_owed = note_owed
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
                if self._withdrawn(job):
                    with self._lock:
                        self._current = None
                    continue
                error = self._run(job.text)
            except Exception as exc:  # the worker must outlive any one bad send
                error = delivery_error(None, f"{type(exc).__name__}: {exc}")
            if self._stopped():
                return  # killed by release(): the job goes to the successor (taken())
            self._settle(job, error)
            with self._lock:
                self._current = None

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

    def _stopped(self) -> bool:
        with self._lock:
            return self._stopping

    def _run(self, text: str) -> str | None:
        """Run one send; None when hermes said it sent, else C18's error text.

        hermes' exit decides: once it has exited, pipes its children still
        hold open are not waited on. Only the last OUTPUT_TAIL bytes of each
        stream are kept, so a chatty hermes costs no memory.
        """
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
        exited = False
        try:
            outputs = _Outputs(proc)
            try:
                exited = outputs.collect(self.send_timeout_ms / 1000)
            finally:
                if not exited:
                    _kill_group(proc)
                self._reap(proc)
                outputs.close()
        finally:
            with self._lock:
                self._running = None
        if not exited:
            return delivery_error(None, f"timed out after {format_ms(self.send_timeout_ms)}ms")
        if proc.returncode == 0:
            return None
        out, err = outputs.text()
        return delivery_error(proc.returncode, err, out)

    @staticmethod
    def _reap(proc: subprocess.Popen[bytes]) -> None:
        # Collect the exit status (hermes' group was killed if it overran);
        # a grandchild that left the group may hold the pipes open for as long
        # as it likes, so they are closed, never drained.
        proc.wait()

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
