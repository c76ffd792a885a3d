"""LoggerActor: the only writer of log.ndjson (C20), so lines never interleave and a
broken log (full disk, permissions) is one place that complains."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Any

from ..messages.commands import Address, LogEvent, UnknownMessage
from .files import FILE_MODE, bridge_dir, open_private, tighten_mode
from .loop import Episode, report
from .supervision import PooledChild


class LoggerActor(PooledChild):
    """Appends one JSON line per LogEvent, and never lets a write failure escape. The file
    stays open; a stat per line lets logrotate and chmod take effect at the next line."""

    def __init__(self, *, log_path: Path, project: str, supervisor: Address,
                 name: str = "logger") -> None:
        super().__init__(name, supervisor)
        self.log_path, self.project = log_path, project  # every record names it (X16)
        self._fd: int | None = None
        self._file: tuple[int, int] | None = None  # (st_dev, st_ino) of the open file
        self._failing = Episode()  # lines cannot be written (a full disk, say)
        self._torn: tuple[int, int] | None = None  # the file a line was cut short in

    def on_receive(self, message: Any) -> None:
        match message:
            case LogEvent(record=record):
                self._write(record.to_line(self.project).encode("utf-8"))
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
        self._close()

    def _write(self, data: bytes) -> None:
        sent = 0
        try:
            fd = self._file_for_append()
            if self._torn == self._file:  # the last line stopped short in this file
                data = b"\n" + data
            while sent < len(data):  # a short write is not an error; the rest follows
                sent += os.write(fd, data[sent:])
        except (OSError, ValueError) as exc:
            # C20 is a record of what happened, not a precondition for doing it
            if sent:  # the file now ends where this write stopped: mid-line or not
                self._torn = self._file if data[sent - 1] != 0x0A else None
            self._close()
            if self._failing.happened(cause=getattr(exc, "errno", None)):
                report(f"cannot write {self.log_path}: {exc}")
            return
        self._torn = None
        if lost := self._failing.over():
            report(f"writing {self.log_path} works again ({lost} line(s) lost)")

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
        if not (directory := self.log_path.parent).is_dir():
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
