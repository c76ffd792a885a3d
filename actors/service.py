"""The daemon's line to its service manager (sd_notify(3)), the watchdog, stack dumps.

Without NOTIFY_SOCKET every call here does nothing, so the daemon behaves the same
under any other service manager or in a terminal.

The watchdog ping is earned, not timed: each tick first asks the actor tree a
bounded question, and a tree that does not answer in time gets no ping, so a
wedged daemon is killed and restarted by systemd rather than kept alive by a
thread that merely still runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping

import pykka.debug

from .loop import Episode, report

# A watchdog tick waits at most this long for the tree (or half the tick, if shorter).
WATCHDOG_PROBE_S = 2.0
# Ticks at least daily, however long WATCHDOG_USEC: a thread cannot wait past about 292
# years (OverflowError), and a ping sooner than asked is harmless.
MAX_TICK_S = 86_400.0


def _address(raw: str) -> str | None:
    """NOTIFY_SOCKET as a connectable unix address: a path, or `@name` for Linux's
    abstract namespace (a leading NUL byte). Anything else is not for us."""
    if raw.startswith("@"):
        return "\0" + raw[1:]
    if raw.startswith("/"):
        return raw
    return None


def _watchdog_interval(env: Mapping[str, str], pid: int) -> float | None:
    """Half of WATCHDOG_USEC in seconds (sd_watchdog_enabled(3)), at most MAX_TICK_S, or
    None when off.

    WATCHDOG_PID, when set, names the process the watchdog is for; a child
    that inherited the variables must not ping on its parent's behalf.
    """
    owner = env.get("WATCHDOG_PID")
    if owner and owner != str(pid):
        return None
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    return min(usec / 2_000_000, MAX_TICK_S) if usec > 0 else None


def _status(open_count: int) -> str:
    return f"STATUS={open_count} open question{'' if open_count == 1 else 's'}"


class ServiceLink:
    """What the daemon tells systemd. Every method is safe to call without systemd."""

    def __init__(self, address: str | None, watchdog_s: float | None) -> None:
        self.address = address
        self.watchdog_s = watchdog_s
        self._socket: socket.socket | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._unanswered = Episode()  # one line per bad spell, not one per tick
        self._failing = Episode()  # a manager gone away: one line, not one per ping

    @classmethod
    def from_env(cls, env: Mapping[str, str], pid: int | None = None) -> ServiceLink:
        raw = env.get("NOTIFY_SOCKET", "")
        address = _address(raw)
        if raw and address is None:
            report(f"ignoring NOTIFY_SOCKET={raw!r}: not a unix socket address", "warning")
        interval = _watchdog_interval(env, os.getpid() if pid is None else pid)
        return cls(address, interval if address is not None else None)

    def notify(self, *fields: str) -> bool:
        """Send `fields` as one datagram (newline-separated); False if it did not go."""
        if self.address is None:
            return False
        payload = "\n".join(fields).encode("utf-8")
        with self._lock:
            try:
                if self._socket is None:
                    self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                    self._socket.settimeout(1.0)
                self._socket.sendto(payload, self.address)
            except OSError as exc:
                if self._failing.happened(cause=exc.errno):
                    report(f"cannot notify the service manager: {exc}", "warning")
                return False
            if failed := self._failing.over():
                report(f"notifying the service manager works again ({failed} failed)", "info")
        return True

    def ready(self, open_count: int) -> None:
        """READY=1: the registry entry and the socket exist, askers may come (W7)."""
        self.notify("READY=1", _status(open_count))

    def stopping(self) -> None:
        self._stop.set()
        self.notify("STOPPING=1", "STATUS=stopping")

    def start_watchdog(self, probe: Callable[[float], int]) -> None:
        """Ping at half of WATCHDOG_USEC for as long as `probe` answers within its timeout.

        `probe(timeout)` must return the open-question count or raise; it runs
        in the watchdog thread, never in an actor.
        """
        if self.watchdog_s is None or self._watchdog is not None:
            return
        self._watchdog = threading.Thread(
            target=self._watch, args=(probe,), name="sd-watchdog", daemon=True
        )
        self._watchdog.start()

    def _watch(self, probe: Callable[[float], int]) -> None:
        assert self.watchdog_s is not None
        interval = self.watchdog_s
        timeout = min(WATCHDOG_PROBE_S, interval / 2)
        while not self._stop.wait(interval):
            try:
                count = probe(timeout)
            except Exception as exc:  # the watchdog thread's edge: no answer, no ping; it lives on
                if self._unanswered.happened():
                    report(
                        f"actor tree did not answer within {timeout:g}s ({type(exc).__name__});"
                        " withholding the watchdog ping",
                        "warning",
                    )
                continue
            if self._unanswered.over():
                report("actor tree answers again; watchdog pings resume", "info")
            if not self._stop.is_set():
                self.notify("WATCHDOG=1", _status(count))

    def close(self) -> None:
        self._stop.set()
        if self._watchdog is not None:
            self._watchdog.join(timeout=1.0)
        with self._lock:
            if self._socket is not None:
                with contextlib.suppress(OSError):
                    self._socket.close()
                self._socket = None


class _StackLines(logging.Handler):
    """Writes pykka's thread dumps to stderr, one prefixed line per stack line."""

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):  # a signal handler's edge: never raise into the thread
            for line in record.getMessage().splitlines():
                report(line, "info")


def dump_thread_stacks(*_args: object) -> None:
    """SIGUSR1: log every thread's stack, as Mopidy does, to see what a stuck daemon waits on.

    pykka.debug does the walking; it logs at CRITICAL on the `pykka` logger,
    which the daemon otherwise keeps quiet, so a handler is attached just for
    the dump.
    """
    logger = logging.getLogger("pykka")
    handler = _StackLines()
    logger.addHandler(handler)
    try:
        report("SIGUSR1: stacks of every thread follow", "info")
        pykka.debug.log_thread_tracebacks()
    finally:
        logger.removeHandler(handler)
