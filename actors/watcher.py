"""The WatcherActor: answer files in (C7-C10, C15, W21, X6, X7).

The Watcher does not know which questions are open; the Router does, so every file
with a well-formed name goes there, and a verdict comes back for one that is no answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import secrets
import stat
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inotify_simple import INotify, flags

from ..messages.commands import (
    Address,
    AnswerFileSeen,
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
    ANSWER_SUFFIX,
    UNREADABLE_REASONS,
    Rejected,
    grace_ms,
    js_string,
    log_record,
    qid_of_name,
    unreadable_note,
)
from ..messages.wire import RejectReason, is_valid_qid
from .config import DEFAULT_REOFFER_MS
from .files import link_new, private_dir, read_at_most
from .loop import Episode, report, shared_edge, tell_quietly
from .supervision import PooledChild

if TYPE_CHECKING:
    from .supervisor import Wiring



_WATCH_MASK = flags.CREATE | flags.CLOSE_WRITE | flags.MOVED_TO | flags.MOVE_SELF
_READ_ATTEMPTS = 3
# A file handed on and not disposed of is offered again after this long, in case the
# question it went to crashed with it (at least once, not at every rescan).
DEFAULT_REOFFER_S = DEFAULT_REOFFER_MS / 1000
TRACK_LIMIT = 10_000  # names remembered
SCAN_LIMIT = 10_000  # names looked at per rescan
NOTE_INTERVAL_S = 60.0  # X7: at most one unreadable-answer note per question per minute
NOTE_MEMORY = 1_000
HEAL_REPORT_INTERVAL_S = 10.0
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
_ASIDE = itertools.count(1)  # names for versions being removed (never answer names)
# `.removing-<pid>-<run><n>`, and `-<qid>` for an answer's file: a version left aside by
# a bridge killed mid-removal then knows its name, and goes back to be judged (`_recover`).
# A pid is reused (the next start in a container, other pid namespaces): without the run
# (10 digits, drawn once per process) a leftover would pass for one's own, or be renamed
# over. Digits only, so the bridges of the older form read this one too.
_RUN = f"{secrets.randbelow(10**10):010d}"
_LEFT_ASIDE = re.compile(r"\.removing-\d+-\d+-(?P<qid>.+)")


def _signature(st: os.stat_result) -> FileSignature:
    return FileSignature(st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass
class _Tracked:
    """What the watcher knows of one name: since when (C10's grace runs from then),
    and which version it handed on, not to be sent again before `resend_at`."""

    first_seen: float
    handed: FileSignature | None = None
    resend_at: float = 0.0
    # `handed` was judged (RemoveAnswerFile) and could not be removed: never offered
    # again, only its removal tried again when due
    doomed: bool = False


class WatcherActor(PooledChild):
    """The one owner of "which answer file is being handled" (`_Tracked`, per name), so a
    rescan re-reads only what changed or waited long enough. Paths are plain strings:
    with thousands of answers at once, pathlib's joining was a tenth of the daemon's time.
    """

    def __init__(self, wiring: Wiring, *, supervisor: Address, name: str = "watcher",
                 reoffer_s: float = DEFAULT_REOFFER_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(name, supervisor)
        self.w = wiring
        self.questions_dir = wiring.config.questions_dir
        self._prefix = os.path.join(self.questions_dir, "")
        self._aside = f".removing-{os.getpid()}-{_RUN}"  # + a count: where this process removes
        self.poll_ms = wiring.config.poll_ms
        self.reoffer_s = reoffer_s
        self.clock = clock
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
        self._put_back_failing = Episode()  # versions left aside cannot go back
        self._beat: asyncio.TimerHandle | None = None
        self._deep_queued = False  # one deep rescan queued at a time

    def begin(self) -> None:
        inotify = self._inotify = INotify()
        # 0700 before the first look (another local user who could write here could
        # forge answers); a directory that cannot be made at start is a setup fault
        self._make_and_watch()
        edge = shared_edge()
        edge.call(edge.loop.add_reader, inotify.fileno(), self._events, inotify)
        self._rescan(deep=True)  # files written while no watcher ran raise no event
        self._next_beat()

    def release(self) -> None:
        # (a beat still set tells this stopped actor nothing: tell_quietly drops it)
        inotify, self._inotify, self._wd = self._inotify, None, None
        if inotify is not None:  # closed on the loop once it stopped reading it
            shared_edge().call(self._unlisten, inotify)

    def _next_beat(self) -> None:
        """The safety-net rescan, `poll_ms` after the last one: one beat pending at a time."""
        if self._beat is not None:
            self._beat.cancel()
        self._beat = self.tell_later(self.poll_ms / 1000, Rescan())

    # -- on the loop --------------------------------------------------------

    def _unlisten(self, inotify: INotify) -> None:
        with contextlib.suppress(OSError, ValueError):
            shared_edge().loop.remove_reader(inotify.fileno())
            inotify.close()

    def _events(self, inotify: INotify) -> None:
        me = self.actor_ref
        try:
            events = inotify.read(timeout=0)
        except Exception as exc:  # no answer would be noticed again: restart the watcher
            self._unlisten(inotify)
            tell_quietly(me, WatchLost(f"{type(exc).__name__}: {exc}"))
            return
        # not the names of this process's own removals: gone by the time they are read
        # (one lstat each, a tenth of a removal); a rescan finds any left behind
        names = tuple(dict.fromkeys(
            e.name for e in events if e.name and not e.name.startswith(self._aside)))
        if names:
            tell_quietly(me, FilesChanged(names))
        for wd in dict.fromkeys(e.wd for e in events if e.mask & (flags.IGNORED | flags.MOVE_SELF)):
            tell_quietly(me, WatchEnded(wd))  # deleted or moved away: made again
        if any(e.mask & flags.Q_OVERFLOW for e in events) and not self._deep_queued:
            self._deep_queued = True  # events were lost: every file must be looked at
            tell_quietly(me, Rescan(deep=True))

    # -- messages -----------------------------------------------------------

    def on_receive(self, message: Any) -> None:
        match message:
            case FilesChanged(names=names):  # (each name once: _events made them so)
                for name in names:
                    self._examine(name)
            case Rescan(deep=True):
                self._deep_queued = False
                self._rescan(deep=True)
            case Rescan():
                self._rescan()
                self._next_beat()
            case RemoveAnswerFile(name=name, signature=signature, verdict=None):
                self._remove_judged(name, signature)
            case RemoveAnswerFile(name=name, signature=signature, verdict=Rejected() as verdict):
                self._dispose(name, signature, verdict)
            case OfferAgain(name=name):
                tracked = self._tracked.get(name)
                if tracked is not None:  # forget it was handed on; its grace clock stays
                    tracked.handed, tracked.doomed = None, False
                self._examine(name)
            case WatchEnded(wd=wd):
                if wd == self._wd:
                    self._ensure_watch(force=True)
                    self._rescan(deep=True)  # what was written while there was no watch
            case WatchLost(error=error):
                raise RuntimeError(f"inotify watch lost: {error}")
            case _:
                raise UnknownMessage(self.child_name, message)

    # -- the directory ------------------------------------------------------

    def _ensure_watch(self, *, force: bool = False) -> None:
        """The directory exists, is 0700 and is watched, or it cannot be, for now. A
        failure while running is said once and retried at every beat: the watcher lives
        on (no restart loop), polling if it must."""
        try:
            st: os.stat_result | None = os.stat(self.questions_dir)
        except OSError:
            st = None
        watched = st is not None and self._watched == (st.st_dev, st.st_ino)
        if watched and self._wd is not None and not force:
            return
        try:
            self._make_and_watch()
        except OSError as exc:
            if self._heal_failing.happened(cause=exc.errno):  # (the errno picks the type)
                report(f"{self.child_name}: cannot make or watch {self.questions_dir}: {exc}; "
                       f"retrying every {js_string(self.poll_ms)}ms")
            return
        if self._heal_failing.over():
            report(f"{self.child_name}: watching {self.questions_dir} again")
        elif st is None:
            self._report_heal("was gone; made it again (0700)")
        else:
            self._report_heal("was no longer watched; watching it again" if watched
                              else "was replaced; watching the new one")

    def _make_and_watch(self) -> None:
        inotify = self._inotify
        assert inotify is not None  # None only after release(), when no message is handled
        if self._wd is not None:  # deleted, moved or replaced: stop following the old one
            with contextlib.suppress(OSError):
                inotify.rm_watch(self._wd)
            self._wd = None
        private_dir(self.questions_dir)  # NotADirectoryError if something else is there
        # Watch first, list after (the caller rescans): a file written in between is in
        # the listing or raises an event, never neither. ONLYDIR: something else put in
        # its place meanwhile is refused (ENOTDIR), not watched.
        wd = inotify.add_watch(str(self.questions_dir), _WATCH_MASK | flags.ONLYDIR)
        st = os.stat(self.questions_dir)
        self._wd, self._watched = wd, (st.st_dev, st.st_ino)

    def _report_heal(self, what: str) -> None:
        """One line per heal, at most one per HEAL_REPORT_INTERVAL_S (with a count)."""
        self._heals_unreported += 1
        now = self.clock()
        if now - self._last_heal_report < HEAL_REPORT_INTERVAL_S:
            return
        more = self._heals_unreported - 1
        extra = f" ({more} more time(s) since the last report)" if more else ""
        report(f"{self.child_name}: {self.questions_dir} {what}{extra}")
        self._heals_unreported = 0
        self._last_heal_report = now

    # -- examining files ----------------------------------------------------

    def _rescan(self, *, deep: bool = False) -> None:
        self._ensure_watch()
        if not self.questions_dir.is_dir():
            return  # said once by _ensure_watch; tried again at the next beat
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
            while len(self._tracked) > TRACK_LIMIT:  # forgetting costs a re-read, a new grace
                self._tracked.popitem(last=False)
        return tracked

    def _grace_over(self, name: str) -> bool:
        """C10: has the file had its grace window since it was first seen?"""
        return self.clock() - self._track(name).first_seen >= grace_ms(self.poll_ms) / 1000

    def _examine(self, name: str) -> None:
        qid = qid_of_name(name)
        tracked = self._tracked.get(name)
        if tracked is not None and tracked.handed is not None \
                and self._current(name) == tracked.handed:
            if self.clock() < tracked.resend_at:
                return  # handed on already and not due again: no re-read, no re-parse
            if tracked.doomed:
                self._remove_judged(name, tracked.handed)  # judged once: never offered again
                return
        if not isinstance(qid, Rejected):  # a bad name's file is never read
            tracked = self._track(name)  # C10's grace runs from the first sighting
            read = self._read(name)
            if read is not None:
                content, signature = read
                tracked.handed, tracked.resend_at = signature, self.clock() + self.reoffer_s
                self.w.router.tell(AnswerFileSeen(name, content, signature))
                return
        # not read: what is there decides, and the version rejected is the one looked at
        # (never an answer renamed over it meanwhile)
        try:
            st = os.lstat(self._prefix + name)
        except OSError:  # gone (or unreachable): forgotten; a later event brings it back
            self._tracked.pop(name, None)
            return
        if stat.S_ISREG(st.st_mode):
            # a writer's temporary name may be renamed any moment; a good name's file is
            # unsteady or unreadable for now: its next event or a rescan brings it back
            if isinstance(qid, Rejected) and self._grace_over(name):
                # (never one of this process's own: it is left only when its removal
                # failed, and is tried again as a bad name, said once per cause)
                left = _LEFT_ASIDE.fullmatch(name)
                if left and is_valid_qid(left["qid"]) and not name.startswith(self._aside):
                    self._recover(name, left["qid"] + ANSWER_SUFFIX)
                else:
                    self._reject(name, qid.reason, None, _signature(st))
        elif not stat.S_ISDIR(st.st_mode) and self._grace_over(name):
            # a symlink, FIFO or socket is never an answer (and is not followed); a
            # directory is not ours to remove (nothing the gateway writes)
            self._reject(name, "invalid_path", None, _signature(st))

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

    def _current(self, name: str) -> FileSignature | None:
        try:
            return _signature(os.lstat(self._prefix + name))
        except OSError:
            return None

    # -- verdicts -----------------------------------------------------------

    def _dispose(self, name: str, signature: FileSignature, verdict: Rejected) -> None:
        current = self._current(name)
        if current is None:
            self._tracked.pop(name, None)
            return
        if current != signature:  # the verdict was on an older version: judge the new one
            self._examine(name)
            return
        match verdict:
            case Rejected(reason="invalid_json"):  # C10: perhaps half written
                if self._grace_over(name):
                    self._reject(name, verdict.reason, verdict.qid, signature)
                else:  # given afresh once the window is over (the qid may be known by then)
                    window_s = grace_ms(self.poll_ms) / 1000
                    self._hold(name, signature, self._track(name).first_seen + window_s)
            case Rejected(reason=reason, qid=qid, error=error):
                self._reject(name, reason, qid, signature, error)

    def _remove_judged(self, name: str, signature: FileSignature) -> None:
        """A version judged (used, or answered with a note) goes; one that cannot go now is
        kept from the Router (a second note would be a second judgement) and its removal
        is tried again after `reoffer_s`."""
        current = self._current(name)
        if current is None:
            self._tracked.pop(name, None)
        elif (current == signature and not self._remove(name, signature)
              and self._current(name) == signature):  # still there: not gone, nor replaced
            self._hold(name, signature, self.clock() + self.reoffer_s)
            self._track(name).doomed = True
        # else: a newer answer replaced it; its own events bring it here

    def _hold(self, name: str, signature: FileSignature, until: float) -> None:
        """Leave this version be until `until`; a new version is examined at once."""
        tracked = self._track(name)
        tracked.handed, tracked.resend_at = signature, until

    def _reject(self, name: str, reason: RejectReason, qid: str | None,
                signature: FileSignature, error: str | None = None) -> None:
        """C9: removed and logged as answer_rejected, by the remover alone: bridges that
        share the directory may reject the same file, and it is logged once."""
        if not self._remove(name, signature):
            return
        detail: dict[str, Any] = {"reason": reason, "file": name}
        if signature.size > ANSWER_FILE_LIMIT:
            detail.update(size=signature.size, limit=ANSWER_FILE_LIMIT)  # never read
        if error is not None:
            detail["error"] = error
        self.w.logger.tell(LogEvent(log_record(self.w.now(), qid, "answer_rejected", detail)))
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
        self.w.delivery.tell(SendText(qid, unreadable_note(qid, reason), "unreadable_note"))

    def _remove(self, name: str, signature: FileSignature) -> bool:
        """Remove that version of the file; True if this call removed it.

        A newer one renamed over it since it was judged (a second answer, a moment after
        the first) must never go with it. Linux cannot unlink "this inode only", so the
        file is renamed aside (atomic), looked at, and put back without clobbering
        anything if it is not the one.
        """
        self._tracked.pop(name, None)
        path = self._prefix + name
        # aside under a name no other bridge sharing the directory can pick
        qid = qid_of_name(name)
        aside = f"{self._prefix}{self._aside}{next(_ASIDE)}" + (
            "" if isinstance(qid, Rejected) else f"-{qid}")
        try:
            os.rename(path, aside)
            if _signature(os.lstat(aside)) != signature:
                self._put_back(aside, path)
                return False
            os.remove(aside)
        except FileNotFoundError:
            return False
        except OSError as exc:
            # said once per cause: a read-only directory of many answers is one line
            if self._remove_failing.happened(cause=exc.errno):
                report(f"{self.child_name}: cannot remove {name}: {exc}")
            return False
        if failed := self._remove_failing.over():
            report(f"{self.child_name}: removing files from {self.questions_dir} works again "
                   f"({failed} failed attempt(s))")
        return True

    @staticmethod
    def _put_back(aside: str, path: str) -> bool:
        """A version not judged yet goes back, unless a newer one is there by now (then
        this one is superseded); its events bring it to be judged. True if it went back."""
        back = link_new(aside, path)
        with contextlib.suppress(FileNotFoundError):  # gone if renamed back (no hard links)
            os.remove(aside)
        return back

    def _recover(self, aside: str, name: str) -> None:
        """A removal cut short (its bridge killed between renaming a version aside and
        removing it) left that version here. It goes back under its name, unless a file
        has it by now, and is judged as any other: the version that answered its question
        is removed quietly (the store remembers it), a newer one is an answer, never lost;
        one that was answered with a note gets it again (at least once)."""
        try:
            back = self._put_back(self._prefix + aside, self._prefix + name)
        except FileNotFoundError:  # another bridge sharing the directory took it back
            return
        except OSError as exc:  # left as it is: tried again at the next rescan
            if self._put_back_failing.happened(cause=exc.errno):
                report(f"{self.child_name}: cannot put back {aside}: {exc}")
            return
        self._put_back_failing.over()  # the line below says it works
        report(f"{self.child_name}: {aside} was left by a removal cut short; "
               + (f"put it back as {name}" if back else f"dropped it ({name} is there)"),
               "warning")

