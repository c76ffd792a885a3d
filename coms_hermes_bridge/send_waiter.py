"""The waiter around one `hermes send`, which outlives the bridge: a bridge stopped while
hermes runs must neither lose the send nor make it twice. It runs hermes (its group killed
past the timeout) and writes the outcome to a file the bridge, this run or the next, reads.
It holds the flock of the send's lock file meanwhile, so a restarted bridge waits.

`python -I -S send_waiter.py OUTCOME TIMEOUT_S KEY LOCK_FD -- ARGV...`: stdlib only, so it
never depends on the installed package still being there when it ends."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time

TAIL = 4096  # bytes of each stream kept: the end says why it failed
_CHUNK = 65536
_REAP_S = 2.0  # how long a killed group may take to be gone


def _drain(fd: int, tail: bytearray) -> bool:
    """Read what is there; False once the stream has ended."""
    try:
        chunk = os.read(fd, _CHUNK)
    except BlockingIOError:
        return True
    except OSError:
        return False
    tail += chunk
    del tail[:-TAIL]
    return bool(chunk)


def run(argv: list[str], timeout_s: float, lock_fd: int) -> dict[str, object]:
    """hermes' status (None: killed at the timeout) or why it could not start, and each
    stream's tail. A pidfd tells the exit: a grandchild holding the pipes is not waited on."""
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
    except (OSError, ValueError) as exc:
        return {"returncode": None, "error": str(exc), "stdout": "", "stderr": ""}
    # for a bridge that kills a stalled waiter: hermes must not go on sending alone
    with contextlib.suppress(OSError):
        os.pwrite(lock_fd, f"{proc.pid}\n".encode(), 0)
    pidfd = os.pidfd_open(proc.pid)
    try:
        return _watch(proc, pidfd, timeout_s)
    finally:  # a one-shot process, but the tests run it in theirs
        os.close(pidfd)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def _watch(proc: subprocess.Popen[bytes], pidfd: int, timeout_s: float) -> dict[str, object]:
    tails = {pipe.fileno(): bytearray() for pipe in (proc.stdout, proc.stderr) if pipe}
    with selectors.DefaultSelector() as selector:
        selector.register(pidfd, selectors.EVENT_READ)
        for fd in tails:
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        exited = False
        while not exited and (left := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(left):
                if key.fd == pidfd:
                    exited = True
                elif not _drain(key.fd, tails[key.fd]):
                    selector.unregister(key.fd)
    if not exited:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(_REAP_S)
        return {"returncode": None, "error": None, "stdout": "", "stderr": ""}
    proc.wait()
    for fd, tail in tails.items():
        for _ in range(64):  # what is in the pipes already, to its end; never wait for more
            if not _drain(fd, tail):
                break
    out, err = (bytes(tail).decode("utf-8", "replace") for tail in tails.values())
    return {"returncode": proc.returncode, "error": None, "stdout": out, "stderr": err}


def write_outcome(path: str, outcome: dict[str, object]) -> None:
    """Whole or not at all: a temporary name, fsynced, then renamed."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(outcome, ensure_ascii=False))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def main(args: list[str]) -> int:
    if len(args) < 6 or args[4] != "--":
        print("usage: send_waiter.py OUTCOME TIMEOUT_S KEY LOCK_FD -- ARGV...", file=sys.stderr)
        return 2
    path, timeout, key, lock_fd, argv = args[0], float(args[1]), args[2], int(args[3]), args[5:]
    outcome = run(argv, timeout, lock_fd)
    outcome["key"] = key
    write_outcome(path, outcome)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
