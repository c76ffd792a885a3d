"""WatcherActor: the answer-file wire (C7-C10, C15, W21, X6, X7).

It owns the questions directory: it keeps it in being (0700, made again when
it is deleted or moved away), notices files (inotify, plus a slow rescan as a
safety net for missed events), reads them within a size bound, and removes
them. It does not know which questions are open; the router does, so every
file with a well-formed name goes to the router, which answers with a verdict
when the file is not an answer to an open question.

Per name it remembers when the file was first seen (C10's grace runs from
then) and which version it last handed on, so that a rescan re-reads only what
changed or what waited long enough, not every file still there. A file whose
qid a sibling bridge owns (X6) is left alone and looked at again only when it
is due, like any file handed on. A plain rescan does not even stat a file handed on and not
yet due: inotify reports every new version of it (a write closed, a rename or
a creation over it; a version made otherwise is looked at again when it is
due, after `reoffer_s`), and only when inotify overflowed (events lost) does
the next rescan look at every file. Both memories are
bounded.

Paths are plain strings (the directory's path plus a name), not `Path`s: with
thousands of answers at once, pathlib's joining was a tenth of the daemon's time.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pykka
from inotify_simple import INotify, flags

from ..messages.commands import (
    Address,
    AnswerFileSeen,
    DisposeAnswerFile,
    FilesChanged,
    FileSignature,
    LogEvent,
    OfferAgain,
    RemoveAnswerFile,
    Rescan,
    SendText,
    UnknownMessage,
    WatchEnded,
    WatchLost,
)
from ..messages.contract import (
    ANSWER_FILE_LIMIT,
    UNREADABLE_REASONS,
    OwnedElsewhere,
    Rejected,
    grace_ms,
    log_record,
    qid_of_name,
    unreadable_note,
)
from ..messages.model import Event, RejectReason
from .base import Episode, PooledService, report, utc_now
from .edge import Edge, Timer, shared_edge
from .files import private_dir

_WATCH_MASK = flags.CREATE | flags.CLOSE_WRITE | flags.MOVED_TO | flags.MOVE_SELF
_READ_ATTEMPTS = 3
# A file handed on and not yet disposed of is offered again after this long, in
# case the question it went to crashed with it (at-least-once, not every rescan).
DEFAULT_REOFFER_S = 30.0
# Bounds: names remembered, names looked at per rescan, notes remembered.
TRACK_LIMIT = 10_000
SCAN_LIMIT = 10_000
NOTE_INTERVAL_S = 60.0  # X7: at most one unreadable-answer note per question per minute
NOTE_MEMORY = 1_000
HEAL_REPORT_INTERVAL_S = 10.0


class _Kind:
    """What `_read` or `_kind` found at a name when it is not an answer to read."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return f"<{self.what}>"


_ASIDE = itertools.count(1)  # names for versions being removed (not answer names)
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
_GONE = _Kind("gone")
_DIRECTORY = _Kind("directory")
_NOT_A_FILE = _Kind("not a regular file")
_FILE = _Kind("regular file")


def _signature(st: os.stat_result) -> FileSignature:
    return FileSignature(st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass
class _Tracked:
    """What the watcher knows of one name in the directory."""

    first_seen: float
    handed: FileSignature | None = None  # the version last sent to the router
    resend_at: float = 0.0  # that version is not sent again before this
    # `handed` was judged (RemoveAnswerFile) but could not be removed: it is never
    # offered again, only its removal tried again when due
    doomed: bool = False


class WatcherActor(PooledService):
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
        reoffer_s: float = DEFAULT_REOFFER_S,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = utc_now,
        name: str = "watcher",
        edge: Edge | None = None,
    ) -> None:
        super().__init__(name, supervisor)
        self.router = router
        self.logger = logger
        self.delivery = delivery
        self.questions_dir = questions_dir
        self._prefix = os.path.join(questions_dir, "")  # the directory's path, then a name
        self.poll_ms = poll_ms
        self.reoffer_s = reoffer_s
        self.clock = clock
        self.now = now
        self._tracked: OrderedDict[str, _Tracked] = OrderedDict()
        self._noted: OrderedDict[str, float] = OrderedDict()
        self._inotify: INotify | None = None
        self._wd: int | None = None
        self._watched: tuple[int, int] | None = None  # (st_dev, st_ino) of the watched dir
        self._heal_failing = Episode()  # the directory cannot be made or watched
        self._heals_unreported = 0
        self._last_heal_report = float("-inf")
        self._scan_cut = Episode()  # more entries than one rescan looks at
        self._remove_failing = Episode()  # files cannot be removed (read-only, immutable)
        self.edge = edge or shared_edge()
        self._beat: Timer | None = None
        self._deep_queued = threading.Event()  # one deep rescan queued at a time

    # -- life cycle -----------------------------------------------------------

    def begin(self) -> None:
        inotify = self._inotify = INotify()
        # Made (or tightened to) 0700 before the first look: another local user
        # who could write here could forge answers. A directory that cannot be
        # made at start is a setup fault: fail, and let supervision decide.
        self._make_and_watch()
        self.edge.call(self._listen, inotify)
        # Files written while no watcher ran raise no event: look at them now.
        self._rescan(deep=True)
        self._next_beat()

    def release(self) -> None:
        if self._beat is not None:
            self._beat.cancel()
            self._beat = None
        inotify, self._inotify, self._wd = self._inotify, None, None
        if inotify is not None:
            # Closed on the loop, after it stopped reading: its fd is never reused under it.
            self.edge.call(self._unlisten, inotify)

    def _next_beat(self) -> None:
        """The safety-net rescan, `poll_ms` after the last one: one beat pending at a time."""
        if self._beat is not None:
            self._beat.cancel()
        me = self.actor_ref
        self._beat = self.edge.after(self.poll_ms / 1000, lambda: _tell(me, Rescan()))

    # -- on the edge ----------------------------------------------------------

    def _listen(self, inotify: INotify) -> None:
        self.edge.loop.add_reader(inotify.fileno(), self._events, inotify)

    def _unlisten(self, inotify: INotify) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.edge.loop.remove_reader(inotify.fileno())
            inotify.close()

    def _events(self, inotify: INotify) -> None:
        """inotify has events: the names, the end of the watch, lost events, as messages."""
        me = self.actor_ref
        try:
            events = inotify.read(timeout=0)
        except Exception as exc:
            # Without this no answer would ever be noticed again: make the
            # actor fail, so the supervisor restarts the watcher whole.
            self._unlisten(inotify)
            _tell(me, WatchLost(f"{type(exc).__name__}: {exc}"))
            return
        names = tuple(dict.fromkeys(e.name for e in events if e.name))
        if names:
            _tell(me, FilesChanged(names))
        for wd in dict.fromkeys(e.wd for e in events if e.mask & (flags.IGNORED | flags.MOVE_SELF)):
            _tell(me, WatchEnded(wd))  # the directory was deleted or moved away: make it again
        if any(e.mask & flags.Q_OVERFLOW for e in events) and not self._deep_queued.is_set():
            self._deep_queued.set()  # events were lost: every file must be looked at
            _tell(me, Rescan(deep=True))

    # -- messages -------------------------------------------------------------

    def on_receive(self, message: Any) -> None:
        match message:
            case FilesChanged(names=names):
                for name in dict.fromkeys(names):
                    self._examine(name)
            case Rescan(deep=True):
                self._deep_queued.clear()
                self._rescan(deep=True)
            case Rescan():
                self._rescan()
                self._next_beat()
            case DisposeAnswerFile(name=name, signature=signature, verdict=verdict):
                self._dispose(name, signature, verdict)
            case RemoveAnswerFile(name=name, signature=signature):
                self._remove_judged(name, signature)
            case OfferAgain(name=name):
                tracked = self._tracked.get(name)
                if tracked is not None:  # forget it was handed on; its grace clock stays
                    tracked.handed, tracked.doomed = None, False
                self._examine(name)
            case WatchEnded(wd=wd):
                if wd == self._wd:
                    self._ensure_watch(force=True)
                    self._rescan(deep=True)  # finds what was written while there was no watch
            case WatchLost(error=error):
                raise RuntimeError(f"inotify watch lost: {error}")
            case _:
                raise UnknownMessage(self.child_name, message)

    # -- the directory ----------------------------------------------------------

    def _ensure_watch(self, *, force: bool = False) -> bool:
        """The directory exists, is 0700 and is watched; False when it cannot be, for now.

        A failure while running is reported once and retried at every rescan
        beat: the watcher lives on (no restart loop), polling if it must.
        """
        try:
            st: os.stat_result | None = os.stat(self.questions_dir)
        except OSError:
            st = None
        watched = st is not None and self._watched == (st.st_dev, st.st_ino)
        if watched and self._wd is not None and not force:
            return True
        try:
            self._make_and_watch()
        except OSError as exc:
            if self._heal_failing.happened(cause=exc.errno):  # (the errno picks the type)
                report(f"{self.child_name}: cannot make or watch {self.questions_dir}: {exc}; "
                       f"retrying every {self.poll_ms:g}ms")
            return False
        if self._heal_failing.over():
            report(f"{self.child_name}: watching {self.questions_dir} again")
        elif st is None:
            self._report_heal("was gone; made it again (0700)")
        else:
            self._report_heal("was no longer watched; watching it again" if watched
                              else "was replaced; watching the new one")
        return True

    def _make_and_watch(self) -> None:
        """Make the directory (0700, or tighten it) and watch it, dropping any old watch."""
        inotify = self._inotify
        if inotify is None:
            raise OSError("the watcher is stopping")
        if self._wd is not None:  # deleted, moved away or replaced: stop following the old one
            with contextlib.suppress(OSError):
                inotify.rm_watch(self._wd)
            self._wd = None
        private_dir(self.questions_dir)  # NotADirectoryError if something else is there
        # Watch first, list after (the caller rescans): a file written in
        # between raises an event or is in the listing, never neither. ONLYDIR:
        # something else put in its place meanwhile is refused (ENOTDIR), not watched.
        wd = inotify.add_watch(str(self.questions_dir), _WATCH_MASK | flags.ONLYDIR)
        st = os.stat(self.questions_dir)
        self._wd, self._watched = wd, (st.st_dev, st.st_ino)

    def _report_heal(self, what: str) -> None:
        """One stderr line per heal, at most one per HEAL_REPORT_INTERVAL_S (with a count)."""
        self._heals_unreported += 1
        now = self.clock()
        if now - self._last_heal_report < HEAL_REPORT_INTERVAL_S:
            return
        more = self._heals_unreported - 1
        extra = f" ({more} more time(s) since the last report)" if more else ""
        report(f"{self.child_name}: {self.questions_dir} {what}{extra}")
        self._heals_unreported = 0
        self._last_heal_report = now

    # -- examining files ------------------------------------------------------

    def _rescan(self, *, deep: bool = False) -> None:
        if not self._ensure_watch() and not self.questions_dir.is_dir():
            return  # reported once by _ensure_watch; tried again at the next beat
        names: list[str] = []
        complete = True
        try:
            with os.scandir(self.questions_dir) as entries:
                for entry in entries:
                    if len(names) >= SCAN_LIMIT:
                        complete = False
                        break
                    names.append(entry.name)
        except OSError as exc:
            report(f"{self.child_name}: cannot list {self.questions_dir}: {exc}")
            return
        if not complete and self._scan_cut.happened():
            report(f"{self.child_name}: {self.questions_dir} holds more than {SCAN_LIMIT} "
                   f"entries; each rescan looks at {SCAN_LIMIT} of them")
        if complete:
            for gone in self._tracked.keys() - set(names):
                del self._tracked[gone]
        now = self.clock()
        for name in sorted(names):
            if not deep:
                tracked = self._tracked.get(name)
                if tracked is not None and tracked.handed is not None and now < tracked.resend_at:
                    continue  # handed on and not due: inotify tells of any change to it
            self._examine(name)

    def _track(self, name: str) -> _Tracked:
        tracked = self._tracked.get(name)
        if tracked is None:
            tracked = self._tracked[name] = _Tracked(first_seen=self.clock())
            while len(self._tracked) > TRACK_LIMIT:
                # Forgetting costs at most a re-read and a fresh grace: never a crash.
                self._tracked.popitem(last=False)
        return tracked

    def _waited(self, name: str, window_s: float) -> bool:
        """Has the file been here `window_s` since it was first seen?"""
        return self.clock() - self._track(name).first_seen >= window_s

    def _grace_over(self, name: str) -> bool:
        """C10: has the file had its grace window since it was first seen?"""
        return self._waited(name, grace_ms(self.poll_ms) / 1000)

    def _examine(self, name: str) -> None:
        qid = qid_of_name(name)
        tracked = self._tracked.get(name)
        if (
            tracked is not None
            and tracked.handed is not None
            and self._current(name) == tracked.handed
        ):
            if self.clock() < tracked.resend_at:
                return  # handed on already and not due again: no re-read, no re-parse
            if tracked.doomed:
                self._remove_judged(name, tracked.handed)  # judged once: never offered again
                return
        # The answer is opened straight away (one open, two fstats): the kind of
        # file is learnt from the open itself, not from a stat before it.
        if isinstance(qid, Rejected):
            read: tuple[bytes | None, FileSignature] | _Kind | None = self._kind(name)
        else:
            self._track(name)  # C10's grace runs from the first sighting
            read = self._read(name)
        if read is _GONE:
            self._tracked.pop(name, None)
        elif read is _DIRECTORY:
            return  # not ours to remove; nothing the gateway writes
        elif read is _NOT_A_FILE:
            # a symlink, FIFO or socket is never an answer (and is not followed); only
            # that very one goes, never an answer renamed over it meanwhile
            if self._grace_over(name):
                try:
                    version = _signature(os.lstat(self._prefix + name))
                except OSError:
                    return
                self._reject(name, "invalid_path", None, version)
        elif isinstance(qid, Rejected):
            # A writer's temporary name may be renamed to a good one any moment.
            if self._grace_over(name):
                self._reject(name, qid.reason, None)
        elif isinstance(read, tuple):
            content, signature = read
            tracked = self._track(name)  # (forgotten meanwhile only past TRACK_LIMIT)
            tracked.handed, tracked.resend_at = signature, self.clock() + self.reoffer_s
            self.router.tell(AnswerFileSeen(name, content, signature))
        # else: unsteady or unreadable for now; its next event or a rescan brings it back

    def _kind(self, name: str) -> _Kind:
        """What is at `name`, by lstat (a bad name's file is never read)."""
        try:
            st = os.lstat(self._prefix + name)
        except OSError:
            return _GONE  # or unreachable: forgotten, as if gone; a later event brings it back
        if stat.S_ISDIR(st.st_mode):
            return _DIRECTORY
        return _FILE if stat.S_ISREG(st.st_mode) else _NOT_A_FILE

    def _read(self, name: str) -> tuple[bytes | None, FileSignature] | _Kind | None:
        """The file's bytes (None if over the limit: not read) and the version they
        came from; or what is there when it is not a regular file (or nothing);
        None (or `_FILE`, a file it could not open) if it cannot be read now."""
        path = self._prefix + name
        for _ in range(_READ_ATTEMPTS):
            try:
                # O_NONBLOCK and O_NOFOLLOW: a FIFO or a symlink swapped in is not an
                # answer; O_NOCTTY: nor is a terminal, which must not become ours.
                fd = os.open(path, _OPEN_FLAGS)
            except FileNotFoundError:
                return _GONE
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENXIO):  # a symlink; a socket
                    return _NOT_A_FILE
                # Not openable (no permission, a device on a nodev mount, ...):
                # what is it? A regular file is tried again later (as one unsteady);
                # anything else is not an answer, whatever its name.
                return self._kind(name)
            try:
                before = os.fstat(fd)
                if not stat.S_ISREG(before.st_mode):
                    return _DIRECTORY if stat.S_ISDIR(before.st_mode) else _NOT_A_FILE
                content: bytes | None = None
                if before.st_size <= ANSWER_FILE_LIMIT:
                    content = _read_at_most(fd, ANSWER_FILE_LIMIT)
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
            st = os.lstat(self._prefix + name)
        except OSError:
            return None
        return _signature(st) if stat.S_ISREG(st.st_mode) else None

    # -- verdicts -------------------------------------------------------------

    def _dispose(
        self, name: str, signature: FileSignature, verdict: Rejected | OwnedElsewhere
    ) -> None:
        current = self._current(name)
        if current is None:
            self._tracked.pop(name, None)
            return
        if current != signature:
            # The verdict was about an older version; judge the new one instead.
            self._examine(name)
            return
        match verdict:
            case OwnedElsewhere():
                # X6: a sibling's, however long it is down; judged again when due.
                self._hold(name, signature, self.clock() + self.reoffer_s)
            case Rejected(reason="invalid_json"):
                self._hold_or_reject(name, signature, verdict, grace_ms(self.poll_ms) / 1000)
            case Rejected(reason=reason, qid=qid, error=error):
                self._reject(name, reason, qid, signature, error)

    def _remove_judged(self, name: str, signature: FileSignature) -> None:
        """A version judged (used, or answered with a note) goes; if it cannot go now,
        it is kept from the router (a second note for it would be a second judgement)
        and removal is tried again after `reoffer_s`."""
        current = self._current(name)
        if current is None:
            self._tracked.pop(name, None)
        elif (current == signature and not self._remove(name, signature)
              and self._current(name) == signature):  # still there: not gone, nor replaced
            self._hold(name, signature, self.clock() + self.reoffer_s)
            self._track(name).doomed = True
        # else: a newer answer replaced it; its own events bring it here.

    def _hold_or_reject(
        self, name: str, signature: FileSignature, verdict: Rejected, window_s: float
    ) -> None:
        """Leave the file until `window_s` after its first sighting, then reject it.

        While held, this version is not sent again; once the window is over it
        is, so the verdict is given afresh (the qid may have become known).
        """
        if self._waited(name, window_s):
            self._reject(name, verdict.reason, verdict.qid, signature)
            return
        self._hold(name, signature, self._track(name).first_seen + window_s)

    def _hold(self, name: str, signature: FileSignature, until: float) -> None:
        """Leave this version be until `until`; a new version is examined at once."""
        tracked = self._track(name)
        tracked.handed = signature
        tracked.resend_at = until

    def _reject(
        self,
        name: str,
        reason: RejectReason,
        qid: str | None,
        signature: FileSignature | None = None,
        error: str | None = None,
    ) -> None:
        """C9: a rejected file is removed and logged as answer_rejected.

        Only the remover logs: bridges sharing the directory may reject the
        same file, and it must be logged once.
        """
        if not self._remove(name, signature):
            return
        detail: dict[str, Any] = {"reason": reason, "file": name}
        if signature is not None and signature.size > ANSWER_FILE_LIMIT:
            detail.update(size=signature.size, limit=ANSWER_FILE_LIMIT)  # never read
        if error is not None:
            detail["error"] = error
        self._log(qid, "answer_rejected", detail)
        report(f"rejected answer file {name}: {reason}" + (f" ({error})" if error else ""),
               "warning")
        if qid is not None and reason in UNREADABLE_REASONS:
            self._note_unreadable(qid, reason)

    def _note_unreadable(self, qid: str, reason: RejectReason) -> None:
        """X7: tell the human their answer to an open question was refused, at most
        once per question per NOTE_INTERVAL_S; the question stays open."""
        now = self.clock()
        while self._noted and (
            len(self._noted) >= NOTE_MEMORY
            or now - next(iter(self._noted.values())) >= NOTE_INTERVAL_S
        ):
            self._noted.popitem(last=False)
        if qid in self._noted:
            return
        self._noted[qid] = now
        self.delivery.tell(SendText(qid, unreadable_note(qid, reason), "unreadable_note"))

    def _remove(self, name: str, signature: FileSignature | None = None) -> bool:
        """Remove the file; True if this call removed it.

        With `signature`, only that version: a newer one renamed over it since it
        was judged (a human's second answer, a moment after the first) must never
        go with it. Linux cannot unlink "this inode only", so the file is first
        renamed aside (atomic), looked at, and put back without clobbering
        anything if it is not the version judged.
        """
        self._tracked.pop(name, None)
        path = self._prefix + name
        # aside under a name no other bridge sharing the directory can pick
        target = (path if signature is None
                  else f"{self._prefix}.removing-{os.getpid()}-{next(_ASIDE)}")
        try:
            if signature is not None:
                os.rename(path, target)
                if _signature(os.lstat(target)) != signature:
                    self._put_back(target, path)
                    return False
            os.remove(target)
        except FileNotFoundError:
            return False
        except OSError as exc:
            # said once per cause, not at each retry: a read-only directory of many
            # answers is one line, and one more when removing works again
            if self._remove_failing.happened(cause=exc.errno):
                report(f"{self.child_name}: cannot remove {name}: {exc}")
            return False
        if failed := self._remove_failing.over():
            report(f"{self.child_name}: removing files from {self.questions_dir} works again "
                   f"({failed} failed attempt(s))")
        return True

    def _put_back(self, aside: str, path: str) -> None:
        """A version not judged yet goes back where it was, unless a newer one is there
        by now (then this one is superseded); its events bring it to be judged."""
        try:
            os.link(aside, path)  # never over a file that arrived meanwhile
        except FileExistsError:
            pass
        except OSError:  # a filesystem without hard links
            if not os.path.lexists(path):
                os.rename(aside, path)
                return
        os.remove(aside)

    def _log(self, qid: str | None, event: Event, detail: dict[str, Any]) -> None:
        self.logger.tell(LogEvent(log_record(self.now(), qid, event, detail)))


def _read_at_most(fd: int, limit: int) -> bytes | None:
    """Up to `limit` bytes from `fd`; None if there are more (the file grew past it)."""
    chunks: list[bytes] = []
    got = 0
    while got <= limit:
        chunk = os.read(fd, limit + 1 - got)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        got += len(chunk)
    return None


def _tell(ref: Any, message: Any) -> None:
    """From the edge: a watcher that stopped meanwhile needs to hear nothing more."""
    with contextlib.suppress(pykka.ActorDeadError):
        ref.tell(message)
