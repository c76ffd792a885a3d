"""sd_notify(3) and the watchdog; without NOTIFY_SOCKET every call does nothing. A ping is
earned: a tree that does not answer a bounded ask gets none, so systemd restarts a
wedged daemon."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable, Mapping

from .loop import Episode, report

WATCHDOG_PROBE_S = 2.0  # a tick's wait for the tree (or half the tick, if shorter)
# at least daily: a thread cannot wait ~292 years (OverflowError); an early ping is harmless
MAX_TICK_S = 86_400.0


def _address(raw: str) -> str | None:
    """A path, or `@name` (Linux's abstract namespace); anything else is not for us."""
    if raw.startswith("@"):
        return "\0" + raw[1:]
    if raw.startswith("/"):
        return raw
    return None


def _watchdog_interval(env: Mapping[str, str], pid: int) -> float | None:
    """Half of WATCHDOG_USEC in seconds, at most MAX_TICK_S; None when off or when
    WATCHDOG_PID names another process (sd_watchdog_enabled(3))."""
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
    """Every method is safe without systemd."""

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
        """One datagram; False if it did not go."""
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
        """Ping while `probe(timeout)` returns the open count in time (on this thread)."""
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
            except Exception as exc:
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

