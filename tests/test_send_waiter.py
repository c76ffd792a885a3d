"""The send waiter in process: what it keeps of hermes' run (C18) and how it hands it over
(the edges promise: a send survives a restart). The daemon runs it as a script; these call
its functions, so a change to them shows here."""

from __future__ import annotations

import gc
import json
import locale
import os
import signal
import stat
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

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


def test_a_timeout_under_a_second_still_waits_for_hermes(tmp_path: Path) -> None:  # C18
    fd = _lock(tmp_path)
    try:  # `true` ends in milliseconds: its status, not a timeout
        assert send_waiter.run(["true"], 0.9, fd)["returncode"] == 0
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


def test_the_tail_is_the_end_even_with_much_left_in_the_pipe_at_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # C18: hermes' own stderr, its end; here hermes ends before the waiter reads
    fd = _lock(tmp_path)
    big = send_waiter.TAIL * 50  # past one _CHUNK, held by a pipe hermes enlarged

    late: list[int] = []

    def late_clock() -> float:  # the waiter gets the CPU back only once hermes has exited
        if not late:
            pid = int(os.pread(fd, 32, 0).decode().strip())
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
                    if handle.read().split(") ")[1].startswith("Z"):
                        break
                time.sleep(0.01)
            late.append(pid)
        return time.monotonic()

    monkeypatch.setattr(send_waiter, "time", SimpleNamespace(monotonic=late_clock))
    script = ("import fcntl, sys; fcntl.fcntl(2, fcntl.F_SETPIPE_SZ, 1 << 20); "
              f"sys.stderr.write('b' * {big} + 'FIN')")
    try:
        outcome = send_waiter.run([sys.executable, "-c", script], 30.0, fd)
    finally:
        os.close(fd)
    assert late
    assert outcome == {"returncode": 0, "error": None, "stdout": "",
                       "stderr": "b" * (send_waiter.TAIL - 3) + "FIN"}


def test_output_that_is_not_utf8_is_replaced_not_fatal(tmp_path: Path) -> None:  # C18
    fd = _lock(tmp_path)
    try:
        outcome = send_waiter.run(_sh("printf '\\377ok' >&2; exit 1"), 10.0, fd)
    finally:
        os.close(fd)
    assert outcome["stderr"] == "\ufffdok"


def test_hermes_reads_nothing_of_the_waiters_stdin(tmp_path: Path) -> None:  # C18
    # hermes' input is empty: whatever the waiter's stdin holds never reaches the send
    fd, (read_end, write_end), saved = _lock(tmp_path), os.pipe(), os.dup(0)
    os.write(write_end, b"not for hermes\n")
    os.close(write_end)
    os.dup2(read_end, 0)
    try:
        outcome = send_waiter.run(["cat"], 10.0, fd)
    finally:
        os.dup2(saved, 0)
        for spare in (saved, read_end, fd):
            os.close(spare)
    assert outcome == {"returncode": 0, "error": None, "stdout": "", "stderr": ""}


def test_a_lock_fd_that_takes_no_pid_does_not_stop_the_send(tmp_path: Path) -> None:  # C18
    os.close(_lock(tmp_path))  # the file; the waiter gets it read-only: the pid write fails
    fd = os.open(tmp_path / "send.lock", os.O_RDONLY)
    try:
        outcome = send_waiter.run(_sh("printf sent"), 10.0, fd)
    finally:
        os.close(fd)
    assert outcome == {"returncode": 0, "error": None, "stdout": "sent", "stderr": ""}


def test_the_deadline_reached_is_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # C18: no time left means hermes is killed, not waited on
    monkeypatch.setattr(send_waiter, "time", SimpleNamespace(monotonic=lambda: 100.0))
    fd = _lock(tmp_path)
    try:
        outcome = send_waiter.run(_sh("printf late"), 0.0, fd)
    finally:
        os.close(fd)
    assert outcome == {"returncode": None, "error": None, "stdout": "", "stderr": ""}


@pytest.mark.parametrize("refusal", [ProcessLookupError, PermissionError])
def test_a_group_that_cannot_be_killed_still_ends_in_a_timeout(
    refusal: type[OSError], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # C18: gone already or not ours, the waiter still reports the timeout, and
    # waits only a bounded time for a group it could not kill
    def refuse(pgid: int, sig: int) -> None:
        raise refusal

    monkeypatch.setattr(os, "killpg", refuse)
    fd = _lock(tmp_path)
    started = time.monotonic()
    try:
        outcome = send_waiter.run(_sh("sleep 12"), 0.3, fd)
        pid = int(os.pread(fd, 32, 0).decode().strip())
    finally:
        os.close(fd)
    elapsed = time.monotonic() - started
    monkeypatch.undo()
    os.killpg(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert outcome == {"returncode": None, "error": None, "stdout": "", "stderr": ""}
    assert elapsed < 0.3 + send_waiter._REAP_S + 5  # not the 12 s hermes would run


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


def test_drain_tells_an_open_stream_from_an_ended_one() -> None:
    # an open but empty stream is not ended (the waiter keeps watching it); an ended or
    # unreadable one is (the waiter stops watching it, so it cannot spin on it)
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    tail = bytearray()
    try:
        assert send_waiter._drain(read_end, tail) is True
        os.write(write_end, b"part")
        assert send_waiter._drain(read_end, tail) is True
        os.close(write_end)
        assert send_waiter._drain(read_end, tail) is False
        assert tail == b"part"
    finally:
        os.close(read_end)
    assert send_waiter._drain(read_end, tail) is False  # closed: EBADF
    assert tail == b"part"


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


def test_a_longer_temporary_left_by_a_killed_waiter_does_not_spoil_the_outcome(
    tmp_path: Path,
) -> None:
    path = tmp_path / "x.outcome"
    (tmp_path / "x.outcome.tmp").write_text('{"returncode": 7, "stderr": "' + "x" * 200)
    send_waiter.write_outcome(str(path), {"returncode": 0})
    assert json.loads(path.read_text(encoding="utf-8")) == {"returncode": 0}


def test_the_outcome_is_utf8_whatever_the_locale(tmp_path: Path) -> None:
    path = tmp_path / "x.outcome"
    old = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")  # an ASCII locale
    try:
        send_waiter.write_outcome(str(path), {"stderr": "é ⌛"})
    finally:
        locale.setlocale(locale.LC_CTYPE, old)
    assert path.read_bytes() == '{"stderr": "é ⌛"}'.encode()


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


def test_main_runs_a_one_word_argv(tmp_path: Path) -> None:
    fd = _lock(tmp_path)
    path = tmp_path / "k.outcome"
    try:
        assert send_waiter.main([str(path), "10.0", "question:Q2", str(fd), "--", "true"]) == 0
    finally:
        os.close(fd)
    assert json.loads(path.read_text(encoding="utf-8")) == {
        "returncode": 0, "error": None, "stdout": "", "stderr": "", "key": "question:Q2"}


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


@pytest.mark.parametrize("script", ["exit 0", "sleep 30"], ids=["exited", "timed-out"])
def test_no_descriptor_is_left_open_after_a_run(tmp_path: Path, script: str) -> None:
    # bounded: hermes' pipes and its pidfd are closed however the run ended
    fd = _lock(tmp_path)
    before = sorted(os.listdir("/proc/self/fd"))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            send_waiter.run(_sh(script), 0.5, fd)
            gc.collect()
        assert sorted(os.listdir("/proc/self/fd")) == before
        assert [str(w.message) for w in caught if "unclosed file" in str(w.message)] == []
    finally:
        os.close(fd)
