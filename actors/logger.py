"""LoggerActor: the only writer of log.ndjson (C20).

One actor owns the file so that lines from many actors never interleave
mid-line, and so that a broken log (full disk, wrong permissions) is one
place that complains instead of every actor crashing on its own.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from pathlib import Path
from typing import Any

from ..messages.commands import Address, LogEvent, UnknownMessage
from .files import FILE_MODE, bridge_dir, open_private, tighten_mode
from .loop import Episode, report
from .supervision import PooledChild

# A batch is written once the mailbox is empty, or at these bounds (the size in
# characters, which bounds the bytes to four times as many).
BATCH_LINES = 256
BATCH_CHARS = 256 * 1024
BATCH_AGE_S = 0.2


class LoggerActor(PooledChild):
    """Appends one JSON line per LogEvent, and never lets a write failure escape.

    Batched (written when the mailbox is empty, or at the BATCH_* bounds) so a burst
    of thousands of events costs a few writes while a lone event is written at once.
    The file stays open; one stat per batch lets logrotate and chmod take effect at the
    next line.
    """

    def __init__(self, *, log_path: Path, project: str, supervisor: Address,
                 name: str = "logger") -> None:
        super().__init__(name, supervisor)
        self.log_path, self.project = log_path, project  # every record names it (X16)
        self._batch: list[str] = []
        self._batch_size = 0
        self._batch_since = 0.0  # when its first line came
        self._fd: int | None = None
        self._file: tuple[int, int] | None = None  # (st_dev, st_ino) of the open file
        self._failing = Episode()  # batches cannot be written (a full disk, say)
        self._torn: tuple[int, int] | None = None  # the file a batch was cut short in

    def on_receive(self, message: Any) -> None:
        match message:
            case LogEvent(record=record):
                line = record.to_line(self.project)
                if not self._batch:
                    self._batch_since = time.monotonic()
                self._batch.append(line)
                self._batch_size += len(line)
                if (
                    self._batch_size >= BATCH_CHARS
                    or len(self._batch) >= BATCH_LINES
                    or self.actor_inbox.empty()
                    or time.monotonic() - self._batch_since >= BATCH_AGE_S
                ):
                    self._flush()
            case _:
                raise UnknownMessage(self.child_name, message)

    def begin(self) -> None:
        """Private from the start: the log holds the conversation (0700 dir, 0600 file)."""
        try:
            bridge_dir(self.log_path.parent)
            if self.log_path.is_file():  # created at the first record, 0600
                tighten_mode(self.log_path, FILE_MODE)
        except OSError as exc:
            report(f"cannot prepare {self.log_path}: {exc}")

    def release(self) -> None:
        """Write what is batched (a stop or a crash loses no line), then close the file."""
        if self._batch:
            self._flush()
        self._close()

    def _flush(self) -> None:
        data = "".join(self._batch).encode("utf-8")
        self._batch.clear()
        self._batch_size = 0
        sent = 0
        try:
            fd = self._file_for_append()
            if self._torn == self._file:  # the last batch stopped mid-line in this file
                data = b"\n" + data
            view = memoryview(data)
            while sent < len(data):
                sent += os.write(fd, view[sent:])
        except (OSError, ValueError) as exc:
            # A lost log line must not take the bridge down with it (C20 is
            # a record of what happened, not a precondition for doing it).
            if sent and data[sent - 1] != 0x0A:  # cut mid-line (a full disk, say)
                self._torn = self._file
            self._close()
            if self._failing.happened(cause=getattr(exc, "errno", None)):
                report(f"cannot write {self.log_path}: {exc}")
            return
        self._torn = None
        if lost := self._failing.over():
            report(f"writing {self.log_path} works again ({lost} batch(es) lost)")

    def _file_for_append(self) -> int:
        """The open log file, opened again when the path no longer names it."""
        try:
            st: os.stat_result | None = os.stat(self.log_path)
        except FileNotFoundError:
            st = None
        if (self._fd is not None and st is not None and (st.st_dev, st.st_ino) == self._file
                and not stat.S_IMODE(st.st_mode) & 0o077):  # loosened: opened (so tightened) again
            return self._fd
        self._close()
        directory = self.log_path.parent
        if not directory.is_dir():
            bridge_dir(directory)
            report(f"{directory} was gone; made it again (0700)", "warning")
        fd = open_private(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        opened = os.fstat(fd)
        self._fd, self._file = fd, (opened.st_dev, opened.st_ino)
        return fd

    def _close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = self._file = None
