"""Supervision plumbing shared by every actor.

`Slot` is a child's stable address: collaborators hold the slot, never the
actor ref, so a restarted child is reachable at once and nothing told to it
while it was down is lost. `Supervised` is the base of every supervised actor
(`PooledChild` and `PooledService`, whose turns run on the dispatcher):
when it dies of an exception it hands what was still in
its mailbox (and whatever work it had taken out of it) to its supervisor,
which restarts it and replays those messages in order.
"""

from __future__ import annotations

import errno
import os
import sys
import threading
import weakref
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Literal

import pykka

from ..messages.commands import Address, ChildFailed
from .dispatch import PooledActor

# Which slot feeds which mailbox, so that a dying child can close its own slot
# (see Supervised._hand_over). Keyed by the inbox, a public attribute of every ref.
_SLOT_OF_INBOX: weakref.WeakKeyDictionary[Any, Slot] = weakref.WeakKeyDictionary()
_SLOT_OF_INBOX_LOCK = threading.Lock()


class Slot:
    """A stable, thread-safe address for one supervised child.

    Every delivery through the slot happens under its lock, so a child that
    detaches its slot (under the same lock) before it drains its mailbox can
    be sure that no message told through the slot lands in a mailbox nobody
    will read: it is either in the mailbox already (and handed over) or held
    here for the successor.
    """

    __slots__ = ("_held", "_lock", "_ref", "_retired", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._ref: pykka.ActorRef[Any] | None = None
        self._held: list[Any] = []
        self._retired = False

    def tell(self, message: Any) -> None:
        """Deliver now, or hold until the child is (re)bound."""
        with self._lock:
            if self._retired:
                return
            if self._ref is not None:
                try:
                    self._ref.tell(message)
                    return
                except pykka.ActorDeadError:
                    self._ref = None
            self._held.append(message)

    def bind(self, ref: pykka.ActorRef[Any], unread: tuple[Any, ...] = ()) -> None:
        """Point the slot at a (new) actor: replay `unread`, then what was held.

        A child may die before it is bound (its start failed): then whatever
        could not be delivered stays held, in order, for the rebind that its
        ChildFailed brings; bind never raises for it.
        """
        with _SLOT_OF_INBOX_LOCK:
            _SLOT_OF_INBOX[ref.actor_inbox] = self
        with self._lock:
            if self._retired:
                return
            pending = [*unread, *self._held]
            self._held = []
            self._ref = ref
            for index, message in enumerate(pending):
                try:
                    ref.tell(message)
                except pykka.ActorDeadError:
                    self._ref = None
                    self._held = pending[index:]
                    return

    def detach(self, ref: pykka.ActorRef[Any]) -> None:
        """`ref` is dying: hold whatever is told from now on (if the slot still points at it)."""
        with self._lock:
            if self._ref is not None and self._ref.actor_urn == ref.actor_urn:
                self._ref = None

    def retire(self) -> None:
        """The child is gone for good: drop whatever is told to it from now on."""
        with self._lock:
            self._retired = True
            self._ref = None
            self._held.clear()

    @property
    def ref(self) -> pykka.ActorRef[Any] | None:
        with self._lock:
            return self._ref

    @property
    def held(self) -> tuple[Any, ...]:
        """What waits for the next bind (for tests and reports)."""
        with self._lock:
            return tuple(self._held)

    def __repr__(self) -> str:
        return f"Slot({self.name})"


def slot_of(ref: pykka.ActorRef[Any]) -> Slot | None:
    """The slot last bound to `ref`, if any."""
    with _SLOT_OF_INBOX_LOCK:
        return _SLOT_OF_INBOX.get(ref.actor_inbox)


def utc_now() -> datetime:
    """The wall clock, injected into actors so tests can pin it."""
    return datetime.now(UTC)


Level = Literal["error", "warning", "info"]
MAX_REPORT = 4000  # characters of one stderr line; hermes' stderr can be long

# syslog priorities, for the `<N>` prefix journald reads off a line (sd-daemon(3))
_PRIORITY: dict[str, int] = {"error": 3, "warning": 4, "info": 6}


def _stderr_is_journal() -> bool:
    """Whether stderr is journald's stream (systemd sets JOURNAL_STREAM to its dev:inode)."""
    stream = os.environ.get("JOURNAL_STREAM")
    if not stream:
        return False
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return stream == f"{st.st_dev}:{st.st_ino}"


_REPORT_LOCK = threading.Lock()


def report(message: str, level: Level | None = None) -> None:
    """One operator-facing line on stderr; never raises.

    With a level, the line carries the level word (`coms-hermes-bridge: error: ...`),
    so `grep` and journald filters can pick out what needs a look; when stderr
    is the journal, the line also starts with the syslog priority journald
    understands, so `journalctl -p warning` shows exactly those. Without one,
    the line is as it always was (usage errors read like any command's).
    """
    try:
        line = " ".join(message.splitlines())
        if len(line) > MAX_REPORT:
            line = line[: MAX_REPORT - 1] + "…"
        prefix = ""
        if level is not None:
            line = f"{level}: {line}"
            if _stderr_is_journal():
                prefix = f"<{_PRIORITY[level]}>"
        # One write of the whole line under a lock: print() writes the text and
        # the newline separately, so two threads reporting at once (actors start
        # side by side) could run their lines together.
        with _REPORT_LOCK:
            sys.stderr.write(f"{prefix}coms-hermes-bridge: {line}\n")
            sys.stderr.flush()
    except (OSError, ValueError):
        pass


class Episode:
    """A fault that may recur many times in a row: said when it begins, and when it ends
    with how often it happened, so that a fault on every beat is two lines, not a flood."""

    __slots__ = ("cause", "count")

    def __init__(self) -> None:
        self.count = 0
        self.cause: object = None

    def happened(self, cause: object = None) -> bool:
        """Count one more occurrence; True for the first of the episode, or when its
        cause changed (a new reason is news to the operator: say it too)."""
        self.count += 1
        first, self.cause = self.count == 1 or cause != self.cause, cause
        return first

    def over(self) -> int:
        """End the episode: how many times it happened (0 when none was going on)."""
        count, self.count = self.count, 0
        return count


_SHORTAGE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOSPC})


def is_resource_shortage(exc: BaseException | None) -> bool:
    """Did this crash come from the machine running short (fds, memory, disk, threads)?

    Such a crash is no bug of the child's: restarting at once would fail the same
    way, so it is retried with backoff and not counted as a crash loop. The cause
    chain is followed, since wrappers (e.g. "cannot create ...: [Errno 24]") are common.
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, MemoryError):
            return True
        if isinstance(exc, OSError) and exc.errno in _SHORTAGE_ERRNOS:
            return True
        if isinstance(exc, RuntimeError) and "can't start new thread" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class Supervised(pykka.Actor):
    """A supervised actor: on a crash it tells its supervisor and hands over its work.

    The runtime (a thread of its own, or turns on a shared pool) comes from the
    concrete class: `PooledChild` for the daemon's actors (a test may give one a
    thread of its own).
    """

    def __init__(self, name: str, supervisor: Address) -> None:
        super().__init__()
        self.child_name = name
        self.supervisor = supervisor

    def begin(self) -> None:
        """Take over this actor's resources; runs in the actor's first turn, before any message."""

    def on_start(self) -> None:
        # pykka stops an actor whose on_start raises without calling
        # on_failure; report it here so the supervisor can retry or give up.
        try:
            self.begin()
        except Exception as exc:
            # Dead first (as pykka does before on_failure), so nothing told from
            # now on is accepted into a mailbox that is about to be dropped.
            pykka.ActorRegistry.unregister(self.actor_ref)
            self.actor_stopped.set()
            try:
                self.release()
            finally:
                self._hand_over(exc)
            raise

    def release(self) -> None:
        """Free what this actor owns (threads, sockets, processes).

        Called on orderly stop and after a crash, so a restarted successor can
        take the same resources over. Subclasses extend it; it must not raise.
        """

    def taken(self) -> tuple[Any, ...]:
        """Work this actor took out of its mailbox but had not finished when it crashed.

        Called after `release()`; handed over ahead of the unread mailbox, so
        the successor does it first, in the order it was asked for.
        """
        return ()

    def on_stop(self) -> None:
        self.release()

    def on_failure(
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            self.release()
        finally:
            self._hand_over(exception_value)

    def _hand_over(self, exc: BaseException | None) -> None:
        """Give the supervisor what this actor had not done yet, so its successor does it."""
        error = f"{type(exc).__name__}: {exc}"
        slot = slot_of(self.actor_ref)
        if slot is not None:  # from here on, what is told through the slot is held
            slot.detach(self.actor_ref)
        try:
            unread: list[Any] = list(self.taken())
        except Exception:  # must not keep the mailbox from being handed over
            unread = []
        while not self.actor_inbox.empty():
            envelope = self.actor_inbox.get()
            if envelope.reply_to is None:
                unread.append(envelope.message)
            else:  # an ask: its caller must not wait for an answer that won't come
                envelope.reply_to.set_exception(
                    exc_info=(pykka.ActorDeadError, pykka.ActorDeadError(self.child_name), None)
                )
        self.supervisor.tell(
            ChildFailed(self.child_name, error, tuple(unread), is_resource_shortage(exc))
        )


class PooledChild(Supervised, PooledActor):
    """A supervised actor whose turns run on the shared dispatcher (the many questions)."""


class PooledService(PooledChild):
    """A long-lived supervised actor on the shared dispatcher (Logger, Delivery, Router,
    QuestionSupervisor, Watcher, Peer).

    Its turns must not wait for long: what waits on another process (a
    connection, inotify, hermes, a deadline) waits on the I/O edge
    (actors/edge.py), and what is left (a store write, a file of at most
    64 KiB, a log append, the registry entry written every 30 s) is short and
    local.
    """
