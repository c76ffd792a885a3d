"""The I/O edge: one asyncio event loop, in one thread, for everything that waits.

Actors must not block: they share the dispatcher's thread. Whatever waits on
the outside world (the listening socket and its clients, the sends of
responses to askers, the `hermes` processes, inotify, every deadline) waits
here instead, on one stdlib event loop. The loop tells actors what it saw
(`tell`, which never blocks), and actors ask it to act with `call`, `spawn`
or a timer, each of which is safe from any thread and returns at once.

The loop's clock is CLOCK_BOOTTIME, which keeps counting while the machine
is suspended: a question's deadline, stored as wall time, is turned into a
delay when its timer is set and then survives a suspend. (CLOCK_MONOTONIC,
asyncio's default, stops during a suspend and would fire late by as long.)

One edge serves the process (`shared_edge()`); it is not tied to an actor's
life, so a restarted actor finds its sends, timers and processes still
running. Callbacks run on the loop: they must be quick and must not block.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import os
import signal
import subprocess
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["Edge", "ProcessResult", "Timer", "awaited", "run_process", "shared_edge"]

T = TypeVar("T")

OUTPUT_TAIL = 4096
"""Bytes of each of a process's streams kept: the end says why it failed."""
_READ_CHUNK = 65536
_REAP_S = 2.0  # how long a killed process may take to be gone


class _BootLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock counts a suspend (see the module's docstring)."""

    def time(self) -> float:
        return time.clock_gettime(time.CLOCK_BOOTTIME)


def report(message: str) -> None:
    """base.report, imported when first needed: base imports the dispatcher, which runs
    its turns here."""
    from .base import report as say

    say(message)


class Timer:
    """One action set for later; `cancel()` from any thread makes sure it does not run.

    Plain slots and bound methods, no closures: every open question holds one or two,
    so at 10,000 open questions each byte here counts ten thousand times."""

    __slots__ = ("_action", "_cancelled", "_due", "_edge", "_handle")

    def __init__(self, edge: Edge, due: float, action: Callable[[], None]) -> None:
        self._edge = edge
        self._due = due
        self._action = action
        self._handle: asyncio.TimerHandle | None = None
        self._cancelled = False

    def cancel(self) -> None:
        self._cancelled = True  # checked when it fires, should the cancel below come late
        self._edge.call(self._drop)

    def _arm(self) -> None:
        if not self._cancelled:
            self._handle = self._edge.loop.call_at(self._due, self._fire)

    def _fire(self) -> None:
        self._handle = None
        if self._cancelled:
            return
        try:
            self._action()
        except Exception as exc:  # one bad action must not reach the loop's handler
            report(f"{self._edge.name}: a timer action failed: {exc!r}")

    def _drop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class Edge:
    """The event loop and its thread, started on first use."""

    def __init__(self, name: str = "edge") -> None:
        self.name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # Calls from other threads, run in one wake-up of the loop: a burst of them
        # (a thousand answers' responses) costs one write to the loop's pipe, not one each.
        self._calls: deque[tuple[Callable[..., object], tuple[Any, ...]]] = deque()
        self._waking = False
        _EDGES.add(self)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        return loop if loop is not None else self._start()

    def _forked(self) -> None:
        """In a forked child (a test runner's worker): the loop's thread stayed behind."""
        self._lock = threading.Lock()
        self._loop = self._thread = None
        self._calls, self._waking = deque(), False

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = _BootLoop()
                loop.set_exception_handler(_loop_fault)
                # a daemon thread: the process ends without waiting for the loop
                thread = threading.Thread(target=loop.run_forever, name=self.name, daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def on_loop(self) -> bool:
        """Is the caller the loop's own thread?"""
        return self._thread is threading.current_thread()

    def call(self, fn: Callable[..., object], *args: Any) -> None:
        """Run `fn(*args)` on the loop, soon, in the order the calls were made."""
        loop = self.loop
        if self.on_loop():
            loop.call_soon(fn, *args)
            return
        with self._lock:
            self._calls.append((fn, args))
            if self._waking:
                return
            self._waking = True
        loop.call_soon_threadsafe(self._run_calls)

    def _run_calls(self) -> None:
        with self._lock:
            calls, self._calls = self._calls, deque()
            self._waking = False
        for fn, args in calls:
            try:
                fn(*args)
            except Exception as exc:  # one bad call must not keep the others from running
                report(f"{self.name}: a call failed: {exc!r}")

    def spawn(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run a coroutine on the loop; its future may be waited on by a non-actor thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def after(self, delay: float, action: Callable[[], None]) -> Timer:
        """Run `action` on the loop `delay` seconds from now (it must be quick: a `tell`).
        The delay counts from this call, however long the loop takes to arm it."""
        timer = Timer(self, self.loop.time() + delay, action)
        self.call(timer._arm)
        return timer

    def at(self, when: float, action: Callable[[], None]) -> Timer:
        """Run `action` once the wall clock reads `when` (at once if it already does)."""
        return self.after(when - time.time(), action)

    def schedule(self, delay: float, action: Callable[[], None]) -> Callable[[], None]:
        """`after` in the shape the supervisors take: returns the function that cancels."""
        return self.after(delay, action).cancel

    def close(self) -> None:
        """Stop the loop and its thread (for an edge of a test's own; the shared one lives
        as long as the process). What was still running is dropped."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        if not thread.is_alive():
            loop.close()


async def awaited(send: Callable[[Callable[[T], None]], None], timeout: float) -> T:
    """Hand `send` a reply callback (safe from any thread, called at most once) and wait
    on the loop, never in a thread, for the value it is called with; TimeoutError after
    `timeout`. An actor answers this way: a message carries the callback."""
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


def _loop_fault(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """What asyncio itself could not handle (a task that failed with nobody to see it)."""
    exc = context.get("exception")  # asyncio's every context has a message
    report(f"edge: {context['message']}" + (f": {exc!r}" if exc is not None else ""))


@dataclass(frozen=True, slots=True)
class ProcessResult:
    """How a process ended: its exit status (None: killed at its timeout) and the
    last OUTPUT_TAIL bytes of each stream."""

    returncode: int | None
    stdout: str
    stderr: str


def kill_group(pid: int) -> None:
    """Kill a process and anything it spawned: it runs as leader of its own session."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def run_process(argv: list[str], timeout_s: float) -> ProcessResult:
    """Run `argv` (no shell, its own session, no stdin) until it exits or `timeout_s` passes;
    then its whole process group is killed. Raises OSError or ValueError if it cannot start.

    The exit decides, read from a pidfd: pipes that a grandchild still holds
    open after the process exited are not waited on. Only each stream's tail
    is kept, so a chatty process costs no memory. Cancelled, it is killed
    with its group.
    """
    loop = asyncio.get_running_loop()
    spawned: asyncio.Future[subprocess.Popen[bytes]] = loop.run_in_executor(
        _spawner(), functools.partial(_popen, argv))
    try:
        proc = await asyncio.shield(spawned)
    except asyncio.CancelledError:  # given up while it started: it must not run on
        spawned.add_done_callback(_kill_spawned)
        raise
    tails: dict[int, bytearray] = {}  # stdout's, then stderr's
    pidfd: int | None = None
    exited = asyncio.Event()
    try:
        pidfd = os.pidfd_open(proc.pid)
        loop.add_reader(pidfd, exited.set)
        for pipe in (proc.stdout, proc.stderr):
            assert pipe is not None
            fd = pipe.fileno()
            os.set_blocking(fd, False)
            tails[fd] = bytearray()
            loop.add_reader(fd, _drain, loop, fd, tails[fd], 1)
        try:
            async with asyncio.timeout(timeout_s):
                await exited.wait()
        except TimeoutError:
            kill_group(proc.pid)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_REAP_S):  # gone at once, unless stuck in the kernel
                    await exited.wait()
            return ProcessResult(None, "", "")
        proc.wait()  # it exited: collecting its status does not wait
        for fd, tail in tails.items():
            _drain(loop, fd, tail, 64)  # what is in the pipes already; never wait for more
        out, err = (bytes(tail).decode("utf-8", "replace") for tail in tails.values())
        return ProcessResult(proc.returncode, out, err)
    finally:
        if proc.poll() is None:  # cancelled, or stuck past its kill: never left running
            kill_group(proc.pid)
        for fd in tails:
            loop.remove_reader(fd)
        if pidfd is not None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


_SPAWNER: concurrent.futures.ThreadPoolExecutor | None = None


def _popen(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)


def _spawner() -> concurrent.futures.ThreadPoolExecutor:
    """The one thread that starts processes. Starting one (fork, exec, and waiting
    until exec succeeded) blocks for a millisecond or more; on the loop's thread
    that would stall every socket meanwhile."""
    global _SPAWNER
    with _SHARED_LOCK:
        if _SPAWNER is None:
            _SPAWNER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="edge-spawn")
        return _SPAWNER


def _kill_spawned(spawned: asyncio.Future[subprocess.Popen[bytes]]) -> None:
    if not spawned.cancelled() and spawned.exception() is None:
        proc = spawned.result()
        kill_group(proc.pid)
        proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def _drain(loop: asyncio.AbstractEventLoop, fd: int, tail: bytearray, reads: int) -> None:
    for _ in range(reads):
        try:
            chunk = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            loop.remove_reader(fd)
            return
        tail += chunk
        del tail[:-OUTPUT_TAIL]


_SHARED: Edge | None = None
_SHARED_LOCK = threading.Lock()
_EDGES: weakref.WeakSet[Edge] = weakref.WeakSet()


def _after_fork() -> None:
    global _SHARED_LOCK, _SPAWNER
    _SHARED_LOCK = threading.Lock()
    _SPAWNER = None
    for edge in list(_EDGES):
        edge._forked()


os.register_at_fork(after_in_child=_after_fork)


def shared_edge() -> Edge:
    """The process's edge, made on first use."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = Edge()
        return _SHARED
