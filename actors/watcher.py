"""WatcherActor: the answer-file wire (C7-C10, C15, W21).

It owns the questions directory: it notices files (inotify, plus a slow
rescan as a safety net for missed events), reads them, and removes them. It
does not know which questions are open; the Supervisor does, so every file
with a well-formed name goes to the router, which answers with a verdict
when the file is not an answer to an open question.

The grace table (first sighting per name) lives here because only the owner
of the directory can tell "still being written" from "broken" (C10, W21).
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from inotify_simple import INotify, flags

from coms_hermes_bridge.actors.base import Child, report, utc_now
from coms_hermes_bridge.messages.commands import (
    Address,
    AnswerFileSeen,
    DisposeAnswerFile,
    FilesChanged,
    FileSignature,
    LogEvent,
    RemoveAnswerFile,
    Rescan,
    SendText,
    UnknownMessage,
    WatchLost,
)
from coms_hermes_bridge.messages.contract import (
    Late,
    Rejected,
    grace_ms,
    late_note,
    log_record,
    qid_of_name,
)
from coms_hermes_bridge.messages.model import Event

_WATCH_MASK = flags.CREATE | flags.CLOSE_WRITE | flags.MOVED_TO | flags.MOVE_SELF
# The helper blocks in read() at most this long, so release() is never slow.
_READ_TIMEOUT_MS = 100
_READ_ATTEMPTS = 3



def _signature(st: os.stat_result) -> FileSignature:
    return FileSignature(st.st_ino, st.st_size, st.st_mtime_ns)


class WatcherActor(Child):
    """Turns files in the questions directory into AnswerFileSeen, and disposes of them."""

    def __init__(
        self,
        *,
        supervisor: Address,
        router: Address,
        logger: Address,
        delivery: Address,
        questions_dir: Path,
        poll_ms: float,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = utc_now,
        name: str = "watcher",
    ) -> None:
        super().__init__(name, supervisor)
        self.router = router
        self.logger = logger
        self.delivery = delivery
        self.questions_dir = questions_dir
        self.poll_ms = poll_ms
        self.clock = clock
        self.now = now
        self._first_seen: dict[str, float] = {}
        self._inotify: INotify | None = None
        self._halt = threading.Event()
        self._rescan_queued = threading.Event()
        self._helper: threading.Thread | None = None

    # -- life cycle -----------------------------------------------------------

    def begin(self) -> None:
        self.questions_dir.mkdir(parents=True, exist_ok=True)
        self._inotify = INotify()
        self._inotify.add_watch(str(self.questions_dir), _WATCH_MASK)
        self._helper = threading.Thread(
            target=self._watch, args=(self._inotify,), name=f"{self.child_name}-inotify",
            daemon=True,
        )
        self._helper.start()
        # Files written while no watcher ran raise no event: look at them now.
        self._rescan()

    def release(self) -> None:
        self._halt.set()
        helper = self._helper
        if helper is not None and helper is not threading.current_thread():
            helper.join(timeout=1.0)
        # Closed only after the helper left read(), so its fd is never reused under it.
        if self._inotify is not None:
            try:
                self._inotify.close()
            except OSError:
                pass
            self._inotify = None

    def _watch(self, inotify: INotify) -> None:
        """Helper thread: inotify events and the rescan beat, as messages to the actor."""
        interval = self.poll_ms / 1000
        next_rescan = time.monotonic() + interval
        try:
            while not self._halt.is_set():
                left_ms = max(0.0, (next_rescan - time.monotonic()) * 1000)
                events = inotify.read(timeout=int(min(_READ_TIMEOUT_MS, left_ms)))
                if self._halt.is_set():
                    return
                names = tuple(dict.fromkeys(e.name for e in events if e.name))
                if names:
                    self.actor_ref.tell(FilesChanged(names))
                overflowed = any(e.mask & flags.Q_OVERFLOW for e in events)
                if overflowed or time.monotonic() >= next_rescan:
                    next_rescan = time.monotonic() + interval
                    # One queued Rescan is enough: a slow actor must not drown in them.
                    if not self._rescan_queued.is_set():
                        self._rescan_queued.set()
                        self.actor_ref.tell(Rescan())
                if any(e.mask & (flags.IGNORED | flags.MOVE_SELF) for e in events):
                    raise OSError("the questions directory was removed or moved")
        except Exception as exc:
            if not self._halt.is_set():
                # Without this thread no answer would ever be noticed again: make
                # the actor fail, so the supervisor restarts the watcher whole.
                with contextlib.suppress(Exception):
                    self.actor_ref.tell(WatchLost(f"{type(exc).__name__}: {exc}"))

    # -- messages -------------------------------------------------------------

    def on_receive(self, message: Any) -> None:
        match message:
            case FilesChanged(names=names):
                for name in dict.fromkeys(names):
                    self._examine(name)
            case Rescan():
                self._rescan_queued.clear()
                self._rescan()
            case DisposeAnswerFile(name=name, signature=signature, verdict=verdict):
                self._dispose(name, signature, verdict)
            case WatchLost(error=error):
                raise RuntimeError(f"inotify watch lost: {error}")
            case RemoveAnswerFile(name=name, signature=signature):
                current = self._current(name)
                if current == signature:
                    self._remove(name)
                elif current is None:
                    self._first_seen.pop(name, None)
                # else: a newer answer replaced it; its own events bring it here.
            case _:
                raise UnknownMessage(self.child_name, message)

    # -- examining files ------------------------------------------------------

    def _rescan(self) -> None:
        try:
            names = sorted(os.listdir(self.questions_dir))
        except FileNotFoundError as exc:  # deleted under us: a restart makes it again
            raise RuntimeError(f"questions directory is gone: {exc}") from exc
        except OSError as exc:
            report(f"{self.child_name}: cannot list {self.questions_dir}: {exc}")
            return
        for gone in self._first_seen.keys() - set(names):
            del self._first_seen[gone]
        for name in names:
            self._examine(name)

    def _grace_over(self, name: str) -> bool:
        """C10: has the file had its grace window since it was first seen?"""
        first = self._first_seen.setdefault(name, self.clock())
        return (self.clock() - first) * 1000 >= grace_ms(self.poll_ms)

    def _examine(self, name: str) -> None:
        path = self.questions_dir / name
        try:
            st = os.lstat(path)
        except OSError:
            self._first_seen.pop(name, None)
            return
        if stat.S_ISDIR(st.st_mode):
            return  # not ours to remove; nothing the gateway writes
        if not stat.S_ISREG(st.st_mode):
            # a symlink, FIFO or socket is never an answer (and is not followed)
            if self._grace_over(name):
                self._reject(name, "invalid_path", None)
            return
        qid = qid_of_name(name)
        if isinstance(qid, Rejected):
            # A writer's temporary name may be renamed to a good one any moment.
            if self._grace_over(name):
                self._reject(name, qid.reason, None)
            return
        self._first_seen.setdefault(name, self.clock())
        read = self._read(name)
        if read is not None:
            content, signature = read
            self.router.tell(AnswerFileSeen(name, content, signature))

    def _read(self, name: str) -> tuple[bytes, FileSignature] | None:
        """The file's bytes and the version they came from; None if gone or unsteady."""
        path = self.questions_dir / name
        for _ in range(_READ_ATTEMPTS):
            try:
                # O_NONBLOCK and O_NOFOLLOW: a FIFO or a symlink swapped in is not an answer.
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
            except OSError:
                return None
            try:
                before = os.fstat(fd)
                if not stat.S_ISREG(before.st_mode):
                    return None
                with os.fdopen(fd, "rb", closefd=False) as file:
                    content = file.read()
                after = os.fstat(fd)
            except OSError:
                return None
            finally:
                os.close(fd)
            if _signature(before) == _signature(after):
                return content, _signature(after)
        return None  # still being written; its close event or a rescan brings it back

    def _current(self, name: str) -> FileSignature | None:
        try:
            st = os.lstat(self.questions_dir / name)
        except OSError:
            return None
        return _signature(st) if stat.S_ISREG(st.st_mode) else None

    # -- verdicts -------------------------------------------------------------

    def _dispose(self, name: str, signature: FileSignature, verdict: Rejected | Late) -> None:
        current = self._current(name)
        if current is None:
            self._first_seen.pop(name, None)
            return
        if current != signature:
            # The verdict was about an older version; judge the new one instead.
            self._examine(name)
            return
        match verdict:
            case Late(qid=qid, state=state):
                self._remove(name)
                self._log(qid, "late_answer", {"state": state})
                self.delivery.tell(SendText(qid, late_note(qid), "late_note"))  # C15
            case Rejected(reason="invalid_json") if not self._grace_over(name):
                pass  # C10: maybe half written; a later event or rescan sends it again
            case Rejected(reason=reason, qid=qid):
                self._reject(name, reason, qid)

    def _reject(self, name: str, reason: str, qid: str | None) -> None:
        """C9: a rejected file is removed and logged as answer_rejected."""
        self._remove(name)
        self._log(qid, "answer_rejected", {"reason": reason, "file": name})

    def _remove(self, name: str) -> None:
        self._first_seen.pop(name, None)
        try:
            os.remove(self.questions_dir / name)
        except FileNotFoundError:
            pass
        except OSError as exc:
            report(f"{self.child_name}: cannot remove {name}: {exc}")

    def _log(self, qid: str | None, event: Event, detail: dict[str, str]) -> None:
        self.logger.tell(LogEvent(log_record(self.now(), qid, event, detail)))
