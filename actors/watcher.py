"""The WatcherActor: answer files in (C7-C10, C15, W21, X6, X7).

The Watcher does not know which questions are open; the Router does, so every file
with a well-formed name goes there, and a verdict comes back for one that is no answer.
"""

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
# A file handed on and not disposed of is offered again after this long, in case the
# question it went to crashed with it, or it is a sibling's (X6).
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
    """What the watcher knows of one name: since when (C10's grace runs from then),
    and which version it handed on (or judged), not to be looked at before `resend_at`."""

    first_seen: float
    handed: FileSignature | None = None
    resend_at: float = 0.0


class WatcherActor(PooledChild):
    """The one owner of "which answer file is being handled" (`_Tracked`, per name), so a
    rescan re-reads only what changed or waited long enough. Paths are plain strings, as
    joining pathlib's is dear with thousands of answers at once.
    """

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
        # 0700 before the first look (another local user who could write here could
        # forge answers); a directory that cannot be made at start is a setup fault
        self._watch()
        self._rescan()  # files written while no watcher ran raise no event

    def release(self) -> None:
        # (a beat still set tells this stopped actor nothing: tell_quietly drops it)
        inotify, self._inotify, self._wd = self._inotify, None, None
        if inotify is not None:  # closed on the loop once it stopped reading it
            shared_edge().call(self._unlisten, inotify)

    # -- on the loop: only `tell` ---------------------------------------------

    @staticmethod
    def _unlisten(inotify: INotify) -> None:
        with contextlib.suppress(OSError, ValueError):
            shared_edge().loop.remove_reader(inotify.fileno())
            inotify.close()

    @staticmethod
    def _events(inotify: INotify, me: Address) -> None:
        """What the kernel said, told to the watcher; a static method, so it cannot
        touch the watcher's state."""
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

    # -- messages -----------------------------------------------------------

    def on_receive(self, message: Any) -> None:
        match message:
            case FilesChanged(names=names):  # (each name once: _events made them so)
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

    # -- the directory ------------------------------------------------------

    def _watch(self) -> None:
        """Make the directory (0700) and watch it. Adding a watch its inode already has
        gives back the same descriptor, so a new one means the directory was deleted,
        moved or replaced, or the kernel ended its watch: the old one is dropped."""
        inotify = self._inotify
        assert inotify is not None  # None only after release(), when no message is handled
        private_dir(self.questions_dir)  # NotADirectoryError if something else is there
        # Watch first, list after (the caller rescans): a file written in between is in
        # the listing or raises an event, never neither. ONLYDIR: something else put in
        # its place meanwhile is refused (ENOTDIR), not watched.
        wd = inotify.add_watch(str(self.questions_dir), _WATCH_MASK)
        if self._wd is not None and wd != self._wd:
            with contextlib.suppress(OSError):
                inotify.rm_watch(self._wd)
        self._wd = wd
        # (again at every rescan: a failed read stopped the loop reading it)
        edge = shared_edge()
        edge.call(edge.loop.add_reader, inotify.fileno(), self._events, inotify, self.actor_ref)

    def _heal(self) -> None:
        """The directory exists, is 0700 and is watched, or it cannot be, for now. A
        failure while running is said once per cause and retried at every beat: the
        watcher lives on (no restart loop), polling if it must."""
        before = self._wd
        try:
            self._watch()
        except OSError as exc:
            if self._heal_failing.happened(cause=exc.errno):  # (the errno picks the type)
                report(f"{self.child_name}: cannot make or watch {self.questions_dir}: {exc}; "
                       f"retrying every {js_string(self.poll_ms)}ms")
            return
        if self._heal_failing.over():
            report(f"{self.child_name}: watching {self.questions_dir} again")
        elif self._wd != before:
            report(f"{self.child_name}: {self.questions_dir} was deleted, moved or no longer "
                   "watched; watching it anew (0700)")

    # -- examining files ----------------------------------------------------

    def _rescan(self) -> None:
        """The safety net, at start, every `poll_ms`, and when the watch ended or events
        were lost: every name is looked at (one lstat for a version already handed on)."""
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
            return  # handed on (or judged) already and not due: no re-read, no re-parse
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
        """The bytes (None over the limit: not read) and the version they came from; None
        when it is no regular file or cannot be read whole now."""
        path = self._prefix + name
        for _ in range(_READ_ATTEMPTS):
            try:
                # O_NONBLOCK, O_NOFOLLOW: a FIFO or a symlink swapped in is no answer;
                # O_NOCTTY: nor is a terminal, which must not become ours
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

    # -- verdicts -----------------------------------------------------------

    def _hold(self, name: str, signature: FileSignature, until: float) -> None:
        """Leave this version be until `until`; a new version is examined at once."""
        tracked = self._track(name)
        tracked.handed, tracked.resend_at = signature, until

    def _reject(self, name: str, signature: FileSignature, rejected: Rejected) -> None:
        """C9: removed and logged as answer_rejected, by the remover alone: bridges that
        share the directory may reject the same file, and it is logged once."""
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
        """X7: the human is told their answer was refused, at most once per question per
        NOTE_INTERVAL_S; the question stays open."""
        now = self.clock()
        while self._noted and (len(self._noted) >= NOTE_MEMORY
                               or now - next(iter(self._noted.values())) >= NOTE_INTERVAL_S):
            self._noted.popitem(last=False)
        if qid in self._noted:
            return
        self._noted[qid] = now
        self.delivery.tell(SendText(qid, unreadable_note(qid, reason), "unreadable_note"))

    def _remove(self, name: str, signature: FileSignature) -> bool:
        """Remove that version of the file; True if this call removed it.

        A newer one renamed over it since it was judged (a second answer, a moment after
        the first) stays, to be judged on its own. Linux cannot unlink "this inode only",
        so the name is looked at, then unlinked: a version renamed over it in the
        microseconds between the two goes unjudged. That race is accepted.

        A version that cannot go now is judged all the same: it is never offered again
        in this run (a second note would be a second judgement); the next start looks.
        """
        path = self._prefix + name
        try:
            if _signature(os.lstat(path)) != signature:
                return False  # a newer version: its own event brings it
            os.unlink(path)
        except FileNotFoundError:  # gone meanwhile (another bridge sharing the directory)
            self._tracked.pop(name, None)
            return False
        except OSError as exc:
            # said once per cause: a read-only directory of many answers is one line
            if self._remove_failing.happened(cause=exc.errno):
                report(f"{self.child_name}: cannot remove {name}: {exc}")
            self._hold(name, signature, float("inf"))
            return False
        self._tracked.pop(name, None)
        if failed := self._remove_failing.over():
            report(f"{self.child_name}: removing files from {self.questions_dir} works again "
                   f"({failed} failed attempt(s))")
        return True
