"""The send waiter in process: what it keeps of hermes' run (C18) and how it hands it over
(the edges promise: a send survives a restart). The daemon runs it as a script; these call
its functions, so a change to them shows here."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest

from coms_hermes_bridge import send_waiter


def _lock(tmp_path: Path) -> int:
    return os.open(tmp_path / "send.lock", os.O_RDWR | os.O_CREAT, 0o600)


def _sh(script: str) -> list[str]:
    return ["/bin/sh", "-c", script]


def test_an_exit_status_and_both_streams_are_kept(tmp_path: Path) -> None:  # C18
    fd = _lock(tmp_path)
    try:
        outcome = send_waiter.run(_sh("printf out; printf err >&2; exit 3"), 10.0, fd)
        assert outcome == {"returncode": 3, "error": None, "stdout": "out", "stderr": "err"}
        # the bridge that outlives this one kills hermes' group by this pid
        pid = int(os.pread(fd, 32, 0).decode().strip())
        assert pid > 0
    finally:
        os.close(fd)


def test_a_clean_exit_is_status_zero(tmp_path: Path) -> None:  # C18
    fd = _lock(tmp_path)
    try:
        assert send_waiter.run(["true"], 10.0, fd) == {
            "returncode": 0, "error": None, "stdout": "", "stderr": ""}
    finally:
        os.close(fd)


def test_each_stream_keeps_only_its_last_tail(tmp_path: Path) -> None:  # C18: bounded
    fd = _lock(tmp_path)
    big = send_waiter.TAIL * 40  # many reads' worth, past one _CHUNK too
    script = (f"{sys.executable} -c \"import sys; sys.stdout.write('a' * {big} + 'END'); "
              f"sys.stderr.write('b' * {big} + 'FIN')\"")
    try:
        outcome = send_waiter.run(_sh(script), 30.0, fd)
    finally:
        os.close(fd)
    assert outcome["returncode"] == 0
    assert outcome["stdout"] == "a" * (send_waiter.TAIL - 3) + "END"
    assert outcome["stderr"] == "b" * (send_waiter.TAIL - 3) + "FIN"


def test_output_that_is_not_utf8_is_replaced_not_fatal(tmp_path: Path) -> None:  # C18
    fd = _lock(tmp_path)
    try:
        outcome = send_waiter.run(_sh("printf '\\377ok' >&2; exit 1"), 10.0, fd)
    finally:
        os.close(fd)
    assert outcome["stderr"] == "\ufffdok"


def test_past_the_timeout_the_whole_group_is_killed(tmp_path: Path) -> None:  # C18
    fd = _lock(tmp_path)
    marker = tmp_path / "child.pid"
    started = time.monotonic()
    try:
        outcome = send_waiter.run(_sh(f"sleep 30 & echo $! > {marker}; wait"), 0.5, fd)
    finally:
        os.close(fd)
    assert outcome == {"returncode": None, "error": None, "stdout": "", "stderr": ""}
    assert time.monotonic() - started < 10  # the timeout, not the sleep
    child = int(marker.read_text().strip())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{child}/stat", encoding="ascii") as handle:
                if handle.read().split(") ")[1].startswith("Z"):
                    break
        except FileNotFoundError:
            break
        time.sleep(0.02)
    else:
        pytest.fail("hermes' child outlived the kill of its group")


def test_an_exit_is_not_held_up_by_a_child_keeping_the_pipes(tmp_path: Path) -> None:  # C18
    fd = _lock(tmp_path)
    started = time.monotonic()
    try:
        outcome = send_waiter.run(_sh("printf said; (sleep 30 &) ; exit 0"), 20.0, fd)
    finally:
        os.close(fd)
    assert outcome["returncode"] == 0
    assert outcome["stdout"] == "said"
    assert time.monotonic() - started < 10


def test_a_command_that_cannot_start_is_an_error_not_a_crash(tmp_path: Path) -> None:  # C18
    fd = _lock(tmp_path)
    try:
        outcome = send_waiter.run([str(tmp_path / "no-such-hermes")], 10.0, fd)
    finally:
        os.close(fd)
    assert outcome["returncode"] is None
    assert "no-such-hermes" in str(outcome["error"])
    assert (outcome["stdout"], outcome["stderr"]) == ("", "")


def test_the_outcome_is_written_whole_and_private(tmp_path: Path) -> None:
    path = tmp_path / "x.outcome"
    old = os.umask(0)
    try:
        send_waiter.write_outcome(str(path), {"returncode": 0, "stderr": "é"})
    finally:
        os.umask(old)
    assert json.loads(path.read_text(encoding="utf-8")) == {"returncode": 0, "stderr": "é"}
    assert "é" in path.read_text(encoding="utf-8")  # as written, not escaped
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.outcome"]  # no .tmp left
    send_waiter.write_outcome(str(path), {"returncode": 1})  # a second replaces the first
    assert json.loads(path.read_text(encoding="utf-8")) == {"returncode": 1}


def test_main_runs_the_argv_after_the_separator_and_writes_the_key(tmp_path: Path) -> None:
    fd = _lock(tmp_path)
    path = tmp_path / "k.outcome"
    try:
        code = send_waiter.main([str(path), "10.0", "question:Q1", str(fd), "--",
                                 *_sh("printf hi; exit 4")])
    finally:
        os.close(fd)
    assert code == 0
    assert json.loads(path.read_text(encoding="utf-8")) == {
        "returncode": 4, "error": None, "stdout": "hi", "stderr": "", "key": "question:Q1"}


@pytest.mark.parametrize("args", [
    [],
    ["o", "1", "k", "3", "--"],  # no argv to run
    ["o", "1", "k", "3", "-x", "true"],  # no separator
])
def test_main_refuses_a_bad_command_line(
    args: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert send_waiter.main(args) == 2
    assert capsys.readouterr().err == (
        "usage: send_waiter.py OUTCOME TIMEOUT_S KEY LOCK_FD -- ARGV...\n")
    assert list(tmp_path.iterdir()) == []
