"""The instance lock in this process (X13): one bridge per project and name. Kept apart
from tests/test_one_bridge.py, whose daemons a mutation run leaves out."""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path

import pytest

from coms_hermes_bridge.actors.registry import (
    AlreadyRunning,
    instance_lock_path,
    take_instance_lock,
)


def open_fds() -> set[int]:
    """This process's open fds (less the one the listing itself used, closed by now)."""
    return {fd for fd in map(int, os.listdir("/proc/self/fd")) if os.path.exists(f"/proc/self/fd/{fd}")}


def test_the_lock_is_the_pools_per_project_and_name(coms_dir: Path) -> None:  # X13
    assert instance_lock_path(coms_dir, "acc", "night") == (
        coms_dir / "hermes-bridge" / "locks" / "acc@night.lock")


def test_a_second_taker_is_refused_with_the_holders_pid(coms_dir: Path) -> None:  # X13
    path = instance_lock_path(coms_dir, "acc", "user-remote")
    path.parent.mkdir(parents=True)
    path.write_text("4194304999\n")  # a longer line left by an earlier holder
    before = open_fds()
    held = take_instance_lock(path)
    try:
        assert path.read_text() == f"{os.getpid()}\n"
        with pytest.raises(AlreadyRunning) as caught:  # (flock: another open file is another taker)
            take_instance_lock(path)
        assert (caught.value.path, caught.value.pid) == (path, os.getpid())
        assert caught.value.args == (path, os.getpid())  # what a traceback of it shows
        assert open_fds() == before | {held}  # the refused taker's fd is closed
    finally:
        os.close(held)


def test_a_holder_that_never_says_its_pid_is_refused_at_once_unnamed(coms_dir: Path) -> None:
    # X13: refused within a moment, whatever the holder wrote (here bytes that are no ASCII)
    path = instance_lock_path(coms_dir, "acc", "user-remote")
    path.parent.mkdir(parents=True)
    holder = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(holder, b"\xff\xfe\n")
        started = time.monotonic()
        with pytest.raises(AlreadyRunning) as caught:
            take_instance_lock(path)
        assert time.monotonic() - started < 5
        assert (caught.value.path, caught.value.pid) == (path, None)
    finally:
        os.close(holder)


def test_a_lock_path_that_is_no_file_fails_and_keeps_no_fd(coms_dir: Path) -> None:  # X13
    path = instance_lock_path(coms_dir, "acc", "user-remote")
    path.parent.mkdir(parents=True)
    os.mkfifo(path, 0o600)  # opens and locks, but cannot be truncated
    before = open_fds()
    with pytest.raises(OSError) as caught:
        take_instance_lock(path)
    assert caught.value.errno == errno.EINVAL
    assert open_fds() == before
