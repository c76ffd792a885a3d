"""LoggerActor: the only writer of log.ndjson (C20).

One actor owns the file so that lines from many actors never interleave
mid-line, and so that a broken log (full disk, wrong permissions) is one
place that complains instead of every actor crashing on its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from coms_hermes_bridge.actors.base import Child, report
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

    def _append(self, line: str) -> None:
        # Opened per record, so that logrotate moving the file away takes
        # effect at the next line without any signal to the daemon.
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("a", encoding="utf-8") as log:
                log.write(line)
                log.flush()
        except (OSError, ValueError) as exc:
            # A lost log line must not take the bridge down with it (C20 is
            # a record of what happened, not a precondition for doing it).
            report(f"cannot write {self.log_path}: {exc}")
