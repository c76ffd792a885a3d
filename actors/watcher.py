"""The WatcherActor: answer files in (C7-C10, C15, W21, X6, X7). Only the Router knows
which questions are open: every well-named file goes there, and a verdict comes back."""

from __future__ import annotations

import contextlib
import itertools
import os
import stat
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inotify_simple import INotify, flags

from ..messages.commands import (
    Address,
    AnswerFileSeen,
    DisposeAnswerFile,
    FilesChanged,
    FileSignature,
    LogEvent,
    RejectAnswerFile,
    Rescan,
    SendText,
    UnknownMessage,
)
from ..messages.contract import (
    ANSWER_FILE_LIMIT,
    UNREADABLE_REASONS,
    Rejected,
    grace_ms,
    js_string,
    log_record,
    qid_of_name,
    unreadable_note,
)
from ..messages.wire import RejectReason
from .config import DEFAULT_REOFFER_MS
from .files import private_dir, read_at_most
from .loop import Episode, report, shared_edge, tell_quietly, utc_now
from .supervision import PooledChild

if TYPE_CHECKING:
    import asyncio


_WATCH_MASK = flags.CREATE | flags.CLOSE_WRITE | flags.MOVED_TO | flags.MOVE_SELF | flags.ONLYDIR
# the watch ended (the directory deleted or moved away) or events were lost: look at all
_LOST = flags.IGNORED | flags.MOVE_SELF | flags.Q_OVERFLOW
_READ_ATTEMPTS = 3
# a file handed on and not disposed of is offered again (its question crashed, or X6)
DEFAULT_REOFFER_S = DEFAULT_REOFFER_MS / 1000
TRACK_LIMIT = 10_000  # names remembered
SCAN_LIMIT = 10_000  # names looked at per rescan
NOTE_INTERVAL_S = 60.0  # X7: at most one unreadable-answer note per question per minute
NOTE_MEMORY = 1_000
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC


def _signature(st: os.stat_result) -> FileSignature:
    return FileSignature(st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass
class _Tracked:
    """One name: first seen (C10's grace runs from then), and the version handed on (or
    judged), not looked at again before `resend_at`."""

    first_seen: float
    handed: FileSignature | None = None
    resend_at: float = 0.0


class WatcherActor(PooledChild):
    """The one owner of "which answer file is being handled" (`_Tracked`, per name), so a
    rescan re-reads only what changed or waited long enough."""

    def __init__(self, *, questions_dir: Path, poll_ms: float, router: Address,
                 delivery: Address, logger: Address, supervisor: Address,
                 name: str = "watcher", reoffer_s: float = DEFAULT_REOFFER_S,
                 now: Callable[[], datetime] = utc_now,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(name, supervisor)
        self.router, self.delivery, self.logger, self.now = router, delivery, logger, now
        self.questions_dir = questions_dir
        self._prefix = os.path.join(self.questions_dir, "")
        self.poll_ms = poll_ms
        self.reoffer_s = reoffer_s
        self.clock = clock
        self._tracked: OrderedDict[str, _Tracked] = OrderedDict()
        self._noted: OrderedDict[str, float] = OrderedDict()
        self._inotify: INotify | None = None
        self._wd: int | None = None
        self._heal_failing = Episode()  # the directory cannot be made or watched
        self._scan_cut = Episode()  # more entries than one rescan looks at
        self._remove_failing = Episode()  # files cannot be removed (read-only, immutable)
        self._beat: asyncio.TimerHandle | None = None

    def begin(self) -> None:
        self._inotify = INotify()
        self._watch()  # 0700 before the first look: another user could forge answers
        self._rescan()  # files written while no watcher ran raise no event

    def release(self) -> None:
        inotify, self._inotify, self._wd = self._inotify, None, None
        if inotify is not None:  # closed on the loop once it stopped reading it
            shared_edge().call(self._unlisten, inotify)

    @staticmethod
    def _unlisten(inotify: INotify) -> None:
        with contextlib.suppress(OSError, ValueError):
            shared_edge().loop.remove_reader(inotify.fileno())
            inotify.close()

    @staticmethod
    def _events(inotify: INotify, me: Address) -> None:
        """On the loop: only tells (static, so it cannot touch the watcher)."""
        try:
            events = inotify.read(timeout=0)
        except Exception:  # the loop's edge: not read again before the next rescan listens
            shared_edge().loop.remove_reader(inotify.fileno())
            raise  # one line, from the loop's fault handler
        names = tuple(dict.fromkeys(e.name for e in events if e.name))
        if names:
            tell_quietly(me, FilesChanged(names))
        if any(e.mask & _LOST for e in events):
            tell_quietly(me, Rescan())

    def on_receive(self, message: Any) -> None:
        match message:
            case FilesChanged(names=names):
                for name in names:
                    self._examine(name)
            case Rescan():
                self._rescan()
            case DisposeAnswerFile(name=name, signature=signature):
                self._remove(name, signature)
            case RejectAnswerFile(name=name, signature=signature, rejected=rejected):
                if rejected.reason == "invalid_json" and not self._grace_over(name):
                    # C10: perhaps half written; given afresh once the window is over
                    window_s = grace_ms(self.poll_ms) / 1000
                    self._hold(name, signature, self._track(name).first_seen + window_s)
                else:
                    self._reject(name, signature, rejected)
            case _:
                raise UnknownMessage(self.child_name, message)

    def _watch(self) -> None:
        """Make the directory (0700) and watch it; a new descriptor means the directory was
        replaced or its watch ended: the old one is dropped."""
        inotify = self._inotify
        assert inotify is not None  # None only after release(), when no message is handled
        private_dir(self.questions_dir)  # NotADirectoryError if something else is there
        # watch first, list after (the caller rescans): a file written between is in one
        wd = inotify.add_watch(str(self.questions_dir), _WATCH_MASK)
        if self._wd is not None and wd != self._wd:
            with contextlib.suppress(OSError):
                inotify.rm_watch(self._wd)
        self._wd = wd
        # (again at every rescan: a failed read stopped the loop reading it)
        edge = shared_edge()
        edge.call(edge.loop.add_reader, inotify.fileno(), self._events, inotify, self.actor_ref)

    def _heal(self) -> None:
        """Watched, or said once per cause and retried at every beat (no restart loop)."""
        before = self._wd
        try:
            self._watch()
        except OSError as exc:
            if self._heal_failing.happened(cause=exc.errno):
                report(f"{self.child_name}: cannot make or watch {self.questions_dir}: {exc}; "
                       f"retrying every {js_string(self.poll_ms)}ms")
            return
        if self._heal_failing.over():
            report(f"{self.child_name}: watching {self.questions_dir} again")
        elif self._wd != before:
            report(f"{self.child_name}: {self.questions_dir} was deleted, moved or no longer "
                   "watched; watching it anew (0700)")

    def _rescan(self) -> None:
        """The safety net: at start, every `poll_ms`, and when events were lost."""
        if self._beat is not None:
            self._beat.cancel()
        self._beat = self.tell_later(self.poll_ms / 1000, Rescan())
        self._heal()
        if not self.questions_dir.is_dir():
            return  # said by _heal; tried again at the next beat
        try:
            with os.scandir(self.questions_dir) as entries:
                names = [entry.name for entry in itertools.islice(entries, SCAN_LIMIT + 1)]
        except OSError as exc:
            report(f"{self.child_name}: cannot list {self.questions_dir}: {exc}")
            return
        complete = len(names) <= SCAN_LIMIT
        del names[SCAN_LIMIT:]
        if not complete and self._scan_cut.happened():
            report(f"{self.child_name}: {self.questions_dir} holds more than {SCAN_LIMIT} "
                   f"entries; each rescan looks at {SCAN_LIMIT} of them")
        if complete:
            for gone in self._tracked.keys() - set(names):
                del self._tracked[gone]
        for name in sorted(names):
            self._examine(name)

    def _track(self, name: str) -> _Tracked:
        tracked = self._tracked.get(name)
        if tracked is None:
            tracked = self._tracked[name] = _Tracked(first_seen=self.clock())
            while len(self._tracked) > TRACK_LIMIT:  # forgetting costs a re-read, a new grace
                self._tracked.popitem(last=False)
        return tracked

    def _grace_over(self, name: str) -> bool:
        """C10: has the file had its grace window since it was first seen?"""
        return self.clock() - self._track(name).first_seen >= grace_ms(self.poll_ms) / 1000

    def _examine(self, name: str) -> None:
        try:
            st = os.lstat(self._prefix + name)
        except OSError:  # gone (or unreachable): forgotten; a later event brings it back
            self._tracked.pop(name, None)
            return
        tracked = self._tracked.get(name)
        if tracked is not None and tracked.handed == _signature(st) \
                and self.clock() < tracked.resend_at:
            return  # handed on (or judged) already and not due
        qid = qid_of_name(name)
        if stat.S_ISREG(st.st_mode) and isinstance(qid, Rejected):
            # a writer's temporary name may be renamed any moment: only after the grace
            if self._grace_over(name):
                self._reject(name, _signature(st), qid)
        elif stat.S_ISREG(st.st_mode):
            self._track(name)  # C10's grace runs from the first sighting
            read = self._read(name)
            if read is not None:
                content, signature = read
                self._hold(name, signature, self.clock() + self.reoffer_s)
                self.router.tell(AnswerFileSeen(name, content, signature))
            # else unsteady or unreadable for now: its next event or a rescan brings it back
        elif not stat.S_ISDIR(st.st_mode) and self._grace_over(name):
            # a symlink, FIFO or socket is never an answer (and is not followed); a
            # directory is not ours to remove (nothing the gateway writes)
            self._reject(name, _signature(st), Rejected("invalid_path"))

    def _read(self, name: str) -> tuple[bytes | None, FileSignature] | None:
        """The bytes (None over the limit) and their version; None when it is no regular
        file or cannot be read whole now."""
        path = self._prefix + name
        for _ in range(_READ_ATTEMPTS):
            try:
                fd = os.open(path, _OPEN_FLAGS)
            except OSError:
                return None
            try:
                before = os.fstat(fd)
                if not stat.S_ISREG(before.st_mode):
                    return None
                content: bytes | None = None
                if before.st_size <= ANSWER_FILE_LIMIT:
                    content = read_at_most(fd, ANSWER_FILE_LIMIT)
                after = os.fstat(fd)
            except OSError:
                return None
            finally:
                os.close(fd)
            if _signature(before) == _signature(after):
                return content, _signature(after)
        return None  # still being written; its close event or a rescan brings it back

    def _hold(self, name: str, signature: FileSignature, until: float) -> None:
        """Leave this version be until `until`; a new version is examined at once."""
        tracked = self._track(name)
        tracked.handed, tracked.resend_at = signature, until

    def _reject(self, name: str, signature: FileSignature, rejected: Rejected) -> None:
        """C9: logged by the remover alone, so bridges sharing the directory log it once."""
        if not self._remove(name, signature):
            return
        reason, qid, error = rejected.reason, rejected.qid, rejected.error
        detail: dict[str, Any] = {"reason": reason, "file": name}
        if signature.size > ANSWER_FILE_LIMIT:
            detail.update(size=signature.size, limit=ANSWER_FILE_LIMIT)  # never read
        if error is not None:
            detail["error"] = error
        self.logger.tell(LogEvent(log_record(self.now(), qid, "answer_rejected", detail)))
        report(f"rejected answer file {name}: {reason}" + (f" ({error})" if error else ""),
               "warning")
        if qid is not None and reason in UNREADABLE_REASONS:
            self._note_unreadable(qid, reason)

    def _note_unreadable(self, qid: str, reason: RejectReason) -> None:
        """X7: at most once per question per NOTE_INTERVAL_S; the question stays open."""
        now = self.clock()
        while self._noted and (len(self._noted) >= NOTE_MEMORY
                               or now - next(iter(self._noted.values())) >= NOTE_INTERVAL_S):
            self._noted.popitem(last=False)
        if qid in self._noted:
            return
        self._noted[qid] = now
        self.delivery.tell(SendText(qid, unreadable_note(qid, reason), "unreadable_note"))

    def _remove(self, name: str, signature: FileSignature) -> bool:
        """Remove that version; True if this call removed it. A newer one stays, to be judged;
        one renamed over it between the lstat and the unlink goes unjudged (accepted:
        Linux cannot unlink one inode). One that cannot go is not offered again this run."""
        path = self._prefix + name
        try:
            if _signature(os.lstat(path)) != signature:
                return False  # a newer version: its own event brings it
            os.unlink(path)
        except FileNotFoundError:  # gone meanwhile (another bridge sharing the directory)
            self._tracked.pop(name, None)
            return False
        except OSError as exc:
            if self._remove_failing.happened(cause=exc.errno):
                report(f"{self.child_name}: cannot remove {name}: {exc}")
            self._hold(name, signature, float("inf"))
            return False
        self._tracked.pop(name, None)
        if failed := self._remove_failing.over():
            report(f"{self.child_name}: removing files from {self.questions_dir} works again "
                   f"({failed} failed attempt(s))")
        return True
