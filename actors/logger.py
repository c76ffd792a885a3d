"""LoggerActor: the only writer of log.ndjson (C20).

One actor owns the file so that lines from many actors never interleave
mid-line, and so that a broken log (full disk, wrong permissions) is one
place that complains instead of every actor crashing on its own.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from coms_hermes_bridge.actors.base import Child, report
from coms_hermes_bridge.actors.files import FILE_MODE, bridge_dir, open_private, tighten_mode
from coms_hermes_bridge.messages.commands import Address, LogEvent, UnknownMessage


class LoggerActor(Child):
    """Appends one JSON line per LogEvent, and never lets a write failure escape."""

    def __init__(self, *, supervisor: Address, log_path: Path, name: str = "logger") -> None:
        super().__init__(name, supervisor)
        self.log_path = log_path

    def on_receive(self, message: Any) -> None:
        match message:
            case LogEvent(record=record):
                self._append(record.to_line())
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

    def _append(self, line: str) -> None:
        # Opened per record, so that logrotate moving the file away takes
        # effect at the next line without any signal to the daemon.
        try:
            directory = self.log_path.parent
            if not directory.is_dir():
                bridge_dir(directory)
                report(f"{directory} was gone; made it again (0700)", "warning")
            fd = open_private(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            with open(fd, "w", encoding="utf-8") as log:
                log.write(line)
                log.flush()
        except (OSError, ValueError) as exc:
            # A lost log line must not take the bridge down with it (C20 is
            # a record of what happened, not a precondition for doing it).
            report(f"cannot write {self.log_path}: {exc}")
