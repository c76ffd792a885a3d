"""Sends that outlive the bridge: each `hermes send` runs under a waiter process, and the
next run finds its outcome, so a crash or stop mid-send never sends a question twice.

Per send, in `state-<project>.sends/`: `<h>.lock`, flocked while under way (the waiter inherits
the fd), and `<h>.outcome`, written whole by the waiter when hermes has ended. The outcome
goes into the store (`Store.record_sent`) before the files go; only a send with no trace
(lost with /tmp, or its waiter killed) is sent again: at least once.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .. import send_waiter
from ..messages.commands import SendText
from .files import open_private, private_dir, read_regular
from .loop import report

OUTCOME_LIMIT = 64 * 1024  # an outcome holds two 4 KiB tails and a few fields
_LOCK = ".lock"
_OUTCOME = ".outcome"
UNKEPT = "unkept:"  # the key of a send kept nowhere (`send_key` None): never taken up again
_POLL_S = 0.05  # how often a send left under way by an earlier run is looked at
_SLACK_S = 10.0  # past the send timeout, how long a waiter may take to say it is done


class WaiterFailed(OSError):
    """The waiter ended without an outcome (killed, or it could not run)."""


def sends_dir(state_path: Path) -> Path:
    """One per state file, beside it."""
    return state_path.with_name(state_path.stem + ".sends")


def send_key(job: SendText) -> str | None:
    """What a send is known by across runs: a question by its qid, a note by its id; a note
    kept nowhere (X7's) has none, and its outcome is never taken up."""
    if job.purpose == "question":
        return f"question:{job.qid}"
    if job.note_id is not None:
        return f"note:{job.note_id}"
    return None


def send_paths(directory: Path, key: str) -> tuple[Path, Path]:
    stem = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return directory / f"{stem}{_LOCK}", directory / f"{stem}{_OUTCOME}"


@dataclass(frozen=True, slots=True)
class ProcessResult:
    """hermes' exit status (None: killed at its timeout) and the tail of each stream."""

    returncode: int | None
    stdout: str
    stderr: str


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the waiter wrote: hermes' result, or why hermes could not start."""

    key: str
    result: ProcessResult
    error: str | None  # hermes could not be started: why


def _held(lock: Path) -> bool:
    """Is a waiter still holding this lock (its send under way)?"""
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def under_way(directory: Path) -> list[Path]:
    """The lock files of sends still running (an earlier run's, or a crashed actor's)."""
    return [path for path in sorted(directory.glob(f"*{_LOCK}")) if _held(path)]


def _read_outcome(path: Path) -> Outcome | None:
    data = read_regular(path, OUTCOME_LIMIT)
    if data is None:
        return None
    try:
        raw = json.loads(data)
        code = raw["returncode"]
        result = ProcessResult(None if code is None else int(code), str(raw["stdout"]),
                               str(raw["stderr"]))
        error = raw["error"]
        return Outcome(str(raw["key"]), result, None if error is None else str(error))
    except (ValueError, TypeError, KeyError) as exc:
        report(f"send outcome {path} is unreadable ({exc!r}); dropped it", "warning")
        return None


def finished(directory: Path) -> Iterator[tuple[Outcome | None, Path, Path]]:
    """Every send no waiter runs any more: its outcome (None: no trace) and its two paths."""
    for lock in sorted(directory.glob(f"*{_LOCK}")):
        if not _held(lock):
            outcome = lock.with_suffix(_OUTCOME)
            yield _read_outcome(outcome), lock, outcome
    for outcome in sorted(directory.glob(f"*{_OUTCOME}")):
        lock = outcome.with_suffix(_LOCK)
        if not lock.exists():  # the lock went first (a removal cut short)
            yield _read_outcome(outcome), lock, outcome
    for partial in sorted(directory.glob(f"*{_OUTCOME}.tmp")):  # a waiter killed writing
        lock = partial.with_name(partial.name.split(".")[0] + _LOCK)
        if not lock.exists():
            yield None, lock, partial


def forget(*paths: Path) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):  # none to remove
            path.unlink()


async def wait_done(locks: list[Path], limit_s: float) -> bool:
    """Until no lock is held (their sends ended), or `limit_s`; True if they all ended."""
    loop = asyncio.get_running_loop()
    end = loop.time() + limit_s
    while any(_held(lock) for lock in locks):
        if loop.time() >= end:
            return False
        await asyncio.sleep(_POLL_S)
    return True


def _start_waiter(directory: Path, key: str, argv: list[str], timeout_s: float
                  ) -> subprocess.Popen[bytes] | None:
    """Lock, then start the waiter holding the lock with us (on the loop: milliseconds,
    one send at a time), in its own session so Ctrl-C never reaches it. None when this
    send is under way (a crashed actor's) or ended with its outcome not yet taken."""
    lock, outcome = send_paths(directory, key)
    private_dir(directory)
    fd = open_private(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        if outcome.exists():
            return None
        return subprocess.Popen(
            [sys.executable, "-I", "-S", send_waiter.__file__, str(outcome), repr(timeout_s),
             key, str(fd), "--", *argv],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True,
            pass_fds=(fd,))
    finally:
        os.close(fd)


async def run_send(directory: Path, key: str, argv: list[str], timeout_s: float) -> Outcome:
    """Run `argv` under a waiter and return its outcome. Cancelled, it only stops waiting:
    whoever runs next takes the outcome. OSError if the waiter cannot start; WaiterFailed
    if it ends without an outcome."""
    loop = asyncio.get_running_loop()
    proc = _start_waiter(directory, key, argv, timeout_s)
    lock, path = send_paths(directory, key)
    if proc is None:
        await wait_done([lock], timeout_s + _SLACK_S)
        return _outcome(lock, path, "its earlier waiter")
    exited = asyncio.Event()
    pidfd = os.pidfd_open(proc.pid)
    try:
        loop.add_reader(pidfd, exited.set)
        try:
            async with asyncio.timeout(timeout_s + _SLACK_S):
                await exited.wait()
        except TimeoutError:  # a stopped or wedged waiter: hermes goes, then the waiter
            for pid in (_hermes_pid(lock), proc.pid):
                if pid is not None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(TimeoutError):  # bounded: one stuck in the kernel stays
                async with asyncio.timeout(_SLACK_S):
                    await exited.wait()
        proc.poll()  # collected if it exited; never a wait on the loop
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)
    return _outcome(lock, path, f"the send waiter (exit {proc.returncode})")


def _hermes_pid(lock: Path) -> int | None:
    """The pid (and group) of the waiter's hermes, written into the lock file."""
    data = read_regular(lock, 32)
    text = data.decode("ascii", "replace").strip() if data else ""
    return int(text) if text.isdigit() and int(text) > 0 else None


def _outcome(lock: Path, path: Path, who: str) -> Outcome:
    outcome = _read_outcome(path)
    if outcome is None:
        if _held(lock):  # still running (its waiter stalled): its files stay its own
            raise WaiterFailed(f"{who} is still running past the send timeout")
        forget(lock)
        raise WaiterFailed(f"{who} ended without an outcome")
    return outcome
