"""The event loop every actor's turns and every wait run on, and the operator's stderr lines.

A turn must be short and never wait for another actor. The loop's clock is CLOCK_BOOTTIME:
a stored deadline becomes a delay, and CLOCK_MONOTONIC stops while the machine sleeps.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

import pykka

from ..messages.commands import Address

T = TypeVar("T")
Spawned = asyncio.Future[T] | concurrent.futures.Future[T]

# -- operator lines -------------------------------------------------------------

Level = Literal["error", "warning", "info"]
MAX_REPORT = 4000  # characters of one stderr line; hermes' stderr can be long
_PRIORITY = {"error": 3, "warning": 4, "info": 6}  # syslog's, for journald's `<N>` prefix
_REPORT_LOCK = threading.Lock()  # one whole line at a time, from any thread


def _stderr_is_journal() -> bool:
    """systemd names journald's stream in JOURNAL_STREAM (dev:inode)."""
    stream = os.environ.get("JOURNAL_STREAM")
    if not stream:
        return False
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return stream == f"{st.st_dev}:{st.st_ino}"


def report(message: str, level: Level | None = None) -> None:
    """One operator-facing line on stderr, whole under a lock; never raises."""
    try:
        line = " ".join(message.splitlines())
        if len(line) > MAX_REPORT:
            line = line[: MAX_REPORT - 1] + "…"
        prefix = ""
        if level is not None:
            line = f"{level}: {line}"
            if _stderr_is_journal():
                prefix = f"<{_PRIORITY[level]}>"
        with _REPORT_LOCK:
            sys.stderr.write(f"{prefix}coms-hermes-bridge: {line}\n")
            sys.stderr.flush()
    except (OSError, ValueError):
        pass


class StopFlag:
    """pykka's `actor_stopped`, of which it calls only `set` and `is_set`: an Event per
    question is a lock and a condition, 1.2 KB each (RSS at --max-open)."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True


class Episode:
    """A recurring fault: said when it begins (or its cause changes) and when it ends, with
    how often it happened: two lines, not a flood."""

    __slots__ = ("cause", "count")

    def __init__(self) -> None:
        self.count = 0
        self.cause: object = None

    def happened(self, cause: object = None) -> bool:
        """Count one more; True when it is news (the first, or a new cause)."""
        self.count += 1
        first, self.cause = self.count == 1 or cause != self.cause, cause
        return first

    def over(self) -> int:
        """End the episode: how many times it happened (0: none was going on)."""
        count, self.count = self.count, 0
        return count


def utc_now() -> datetime:
    """The wall clock, injected into actors so tests can pin it."""
    return datetime.now(UTC)


# -- the loop -------------------------------------------------------------------


class _BootLoop(asyncio.SelectorEventLoop):
    def time(self) -> float:
        return time.clock_gettime(time.CLOCK_BOOTTIME)


class Edge:
    """The event loop and its (daemon) thread. One serves the process (`shared_edge()`),
    tied to no actor's life: a restarted actor finds its sends and timers running."""

    def __init__(self, name: str = "edge") -> None:
        self.name = name
        self.loop: asyncio.AbstractEventLoop = _BootLoop()
        self.loop.set_exception_handler(self._fault)
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def on_loop(self) -> bool:
        return self._thread is threading.current_thread()

    def call(self, fn: Callable[..., object], *args: Any) -> None:
        """`fn(*args)` on the loop, soon, in call order."""
        if self.on_loop():
            self.loop.call_soon(fn, *args)
        else:
            self.loop.call_soon_threadsafe(fn, *args)

    def spawn(self, coro: Coroutine[Any, Any, T]) -> Spawned[T]:
        """Run a coroutine on the loop (from the loop itself, a task at once)."""
        if self.on_loop():
            return self.loop.create_task(coro)
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def _fault(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """What a callback or task raised with nobody to see it: one line."""
        exc = context.get("exception")
        report(f"{self.name}: {context['message']}" + (f": {exc!r}" if exc is not None else ""))


_SHARED_LOCK = threading.Lock()  # not functools.cache: two first callers would make two
_SHARED_EDGE: Edge | None = None


def shared_edge() -> Edge:
    """The process's edge, made on first use."""
    global _SHARED_EDGE
    with _SHARED_LOCK:
        if _SHARED_EDGE is None:
            _SHARED_EDGE = Edge()
        return _SHARED_EDGE


def tell_quietly(ref: Address, message: Any) -> None:
    """From the loop: an actor that stopped meanwhile needs to hear nothing more."""
    with contextlib.suppress(pykka.ActorDeadError):
        ref.tell(message)


async def awaited(send: Callable[[Callable[[T], None]], None], timeout: float) -> T:
    """Hand `send` a reply callback (any thread, used once) and wait on the loop for its
    value, or TimeoutError: how an actor answers the edge without an ask."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(value: T) -> None:
        if not future.done():
            future.set_result(value)

    def reply(value: T) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(settle, value)

    send(reply)
    async with asyncio.timeout(timeout):
        return await future


