"""LoggerActor: the only writer of log.ndjson (C20)."""

from __future__ import annotations

import os
import stat
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from coms_hermes_bridge.actors import logger as logger_module
from coms_hermes_bridge.actors.files import open_private
from coms_hermes_bridge.actors.logger import LoggerActor
from coms_hermes_bridge.messages.commands import ChildFailed, LogEvent
from coms_hermes_bridge.messages.contract import log_record
from coms_hermes_bridge.messages.wire import LogRecord
from tests.fakes import WiredRig, actors_held, bridge_config, wait_for

QID = "01HZY3K4M5N6P7Q8R9S0T1V2W3"
AT = datetime(2025, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
PROJECT = "alpha"


class LoggerRig(WiredRig[LoggerActor]):
    """The logger as the tree starts it, its log at `log_path`."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        super().__init__(LoggerActor, config=bridge_config(log_path=log_path, project=PROJECT))

    def log(self, *records: LogRecord) -> None:
        """Tell each record, in order."""
        for record in records:
            self.ref.tell(LogEvent(record))

    def logged(self, *records: LogRecord) -> None:
        """Tell each record, and return once the logger has written them: the last is
        asked, so it is handled (with all before it) when the ask returns."""
        *first, last = records
        self.log(*first)
        self.ref.ask(LogEvent(last))

    def wait_for_lines(self, records: list[LogRecord], what: str) -> None:
        expected = lines(records)
        wait_for(lambda: self.log_path.exists() and self.log_path.read_bytes() == expected,
                 what=what)


def lines(records: list[LogRecord]) -> bytes:
    return "".join(r.to_line(PROJECT) for r in records).encode("utf-8")


def test_appends_each_record_as_one_line_in_order(tmp_path: Path) -> None:  # C20
    rig = LoggerRig(tmp_path / "deep" / "dir" / "log.ndjson")
    records = [
        log_record(AT, QID, "question_received"),
        log_record(AT, QID, "delivered"),
        log_record(AT, None, "answer_rejected", {"reason": "invalid_path", "file": "x.txt"}),
        log_record(AT, QID, "late_answer", {"state": "answered"}),
    ]
    rig.log(*records)
    rig.wait_for_lines(records, "four lines")
    assert rig.log_path.read_bytes().splitlines()[2] == (
        b'{"at":"2025-01-02T03:04:05.678Z","qid":"00000000000000000000000000",'
        b'"event":"answer_rejected","detail":{"reason":"invalid_path","file":"x.txt"},'
        b'"project":"alpha"}'  # X16: every record names the bridge's project, last
    )


def test_keeps_appending_after_the_file_is_rotated_away(tmp_path: Path) -> None:  # C20
    rig = LoggerRig(tmp_path / "log.ndjson")
    first = log_record(AT, QID, "question_received")
    rig.logged(first)
    rig.log_path.rename(tmp_path / "log.ndjson.1")
    second = log_record(AT, QID, "delivered")
    rig.logged(second)
    assert rig.log_path.read_text(encoding="utf-8") == second.to_line(PROJECT)
    assert (tmp_path / "log.ndjson.1").read_text(encoding="utf-8") == first.to_line(PROJECT)


def test_a_deleted_log_file_is_made_again(tmp_path: Path) -> None:  # C20
    rig = LoggerRig(tmp_path / "log.ndjson")
    rig.logged(log_record(AT, QID, "question_received"))
    rig.log_path.unlink()
    second = log_record(AT, QID, "delivered")
    rig.logged(second)
    assert rig.log_path.read_text(encoding="utf-8") == second.to_line(PROJECT)


def test_unwritable_path_reports_on_stderr_and_survives(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:  # C20
    rig = LoggerRig(tmp_path / "log.ndjson")
    rig.log_path.mkdir()  # a directory where the file should be: every write fails
    rig.logged(log_record(AT, QID, "question_received"))
    err = capfd.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("coms-hermes-bridge: cannot write") and str(rig.log_path) in err
    assert rig.ref.is_alive()
    rig.supervisor.assert_nothing()

    rig.log_path.rmdir()
    good = log_record(AT, QID, "delivered")
    rig.logged(good)
    assert rig.log_path.read_text(encoding="utf-8") == good.to_line(PROJECT)


def test_a_log_that_keeps_failing_is_said_once_and_its_recovery_once(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:  # C20: a full disk fails every line; the operator gets two lines, not a flood
    rig = LoggerRig(tmp_path / "dir" / "log.ndjson")
    rig.log_path.mkdir(parents=True)
    for event in ("question_received", "delivered", "answered"):
        rig.logged(log_record(AT, QID, event))  # each lost
    assert capfd.readouterr().err == (
        f"coms-hermes-bridge: cannot write {rig.log_path}: "
        f"[Errno 21] Is a directory: '{rig.log_path}'\n")
    rig.log_path.rmdir()
    rig.log_path.parent.rmdir()
    rig.log_path.parent.write_text("")  # a new cause mid-episode is said, once
    rig.logged(log_record(AT, QID, "timeout"))
    rig.logged(log_record(AT, QID, "timeout"))
    assert capfd.readouterr().err.count("\n") == 1
    rig.log_path.parent.unlink()
    good = [log_record(AT, QID, "delivered"), log_record(AT, QID, "answered")]
    for record in good:
        rig.logged(record)
    assert capfd.readouterr().err == (
        f"coms-hermes-bridge: warning: {rig.log_path.parent} was gone; made it again (0700)\n"
        f"coms-hermes-bridge: writing {rig.log_path} works again (5 line(s) lost)\n")
    assert rig.log_path.read_bytes() == lines(good)
    rig.log_path.unlink()
    rig.log_path.mkdir()
    rig.logged(log_record(AT, QID, "timeout"))  # a new episode: said again
    assert capfd.readouterr().err.startswith(f"coms-hermes-bridge: cannot write {rig.log_path}: ")


class _FillingOs:
    """`os` as the logger sees it: writes to the log file go `step` bytes at a time, and
    once `room` bytes of it are written the disk is full (ENOSPC) until `room` is None."""

    def __init__(self, log_path: Path, room: int | None, step: int | None = None) -> None:
        self.inode = log_path.stat().st_ino
        self.room, self.step = room, step
        self.refused = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def write(self, fd: int, data: bytes) -> int:
        if os.fstat(fd).st_ino != self.inode:
            return os.write(fd, data)
        n = len(data) if self.step is None else min(self.step, len(data))
        if self.room is not None:
            if self.room == 0:
                self.refused += 1
                raise OSError(28, "No space left on device")
            n = min(n, self.room)
            self.room -= n
        return os.write(fd, bytes(data[:n]))


@pytest.mark.parametrize(("kept", "lost_lines"), [(1, 2), (10, 2), (-1, 2), (None, 1)],
                         ids=["one byte", "mid-line", "all but its newline", "at a line's end"])
def test_a_line_cut_short_by_a_full_disk_leaves_every_later_line_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
    kept: int | None, lost_lines: int,
) -> None:  # C20: a write that stops mid-line must not glue the next record to it
    rig = LoggerRig(tmp_path / "log.ndjson")
    first, cut, lost, after = (log_record(AT, QID, event) for event in
                               ("question_received", "delivered", "answered", "timeout"))
    rig.logged(first)
    line = cut.to_line(PROJECT).encode()
    room = len(line) if kept is None else kept % len(line)  # the bytes of it that fit
    filling = _FillingOs(rig.log_path, room)
    monkeypatch.setattr(logger_module, "os", filling)
    rig.logged(cut, lost)
    assert filling.refused == lost_lines
    filling.room = None  # room again
    rig.logged(after)
    torn = line if kept is None else line[:room] + b"\n"
    assert rig.log_path.read_bytes() == lines([first]) + torn + lines([after])
    assert capfd.readouterr().err.splitlines() == [
        f"coms-hermes-bridge: cannot write {rig.log_path}: [Errno 28] No space left on device",
        f"coms-hermes-bridge: writing {rig.log_path} works again ({lost_lines} line(s) lost)"]


def test_a_disk_full_again_just_after_the_mending_newline_leaves_no_blank_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # C20: every line of log.ndjson is one record, never an empty one
    rig = LoggerRig(tmp_path / "log.ndjson")
    first, cut, mended, after = (log_record(AT, QID, event) for event in
                                 ("question_received", "delivered", "answered", "timeout"))
    rig.logged(first)
    line = cut.to_line(PROJECT).encode()
    filling = _FillingOs(rig.log_path, 10)
    monkeypatch.setattr(logger_module, "os", filling)
    rig.logged(cut)  # 10 bytes of it, then the disk is full
    filling.room = 1  # room for the newline that ends the torn line, and no more
    rig.logged(mended)
    filling.room = None
    rig.logged(after)
    assert rig.log_path.read_bytes() == lines([first]) + line[:10] + b"\n" + lines([after])


def test_a_line_the_system_takes_in_pieces_is_written_whole_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # C20: a short write is not an error; the rest follows it
    rig = LoggerRig(tmp_path / "log.ndjson")
    first, *rest = (log_record(AT, QID, event) for event in
                    ("question_received", "delivered", "answered"))
    rig.logged(first)
    monkeypatch.setattr(logger_module, "os", _FillingOs(rig.log_path, None, step=7))
    rig.log(*rest)
    rig.wait_for_lines([first, *rest], "every line once")


def test_a_log_path_the_system_refuses_outright_is_said_once_and_the_logger_lives_on(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:  # C20: a ValueError from the OS call (no errno) is a failing write like any other
    rig = LoggerRig(tmp_path / "log\0.ndjson")
    rig.logged(log_record(AT, QID, "delivered"))
    rig.logged(log_record(AT, QID, "answered"))
    assert capfd.readouterr().err == (
        f"coms-hermes-bridge: cannot write {rig.log_path}: embedded null byte\n")
    assert rig.ref.is_alive()
    rig.supervisor.assert_nothing()


def test_an_unknown_message_fails_loudly_naming_the_logger_and_what_it_was_told(
    tmp_path: Path,
) -> None:
    rig = LoggerRig(tmp_path / "log.ndjson")
    rig.ref.tell(["not", "a", "LogEvent"])
    assert rig.supervisor.expect(ChildFailed) == ChildFailed(
        "logger", "UnknownMessage: logger does not take list: ['not', 'a', 'LogEvent']")
    rig.stopped()


def test_lines_told_before_the_logger_crashes_are_written(tmp_path: Path) -> None:
    # C20: a crash (here an unknown message) loses no line already told to the logger
    rig = LoggerRig(tmp_path / "log.ndjson")
    records = [log_record(AT, QID, "delivered", {"to": f"chat {i}"}) for i in range(50)]
    with actors_held():  # all in the mailbox before the message it fails on
        rig.log(*records)
        rig.ref.tell("not a LogEvent")
    rig.supervisor.expect(ChildFailed)  # told once the actor has released
    assert rig.log_path.read_bytes() == lines(records)


def test_lines_told_before_a_stop_are_written(tmp_path: Path) -> None:  # C20
    rig = LoggerRig(tmp_path / "log.ndjson")
    records = [log_record(AT, QID, "delivered", {"to": f"chat {i}"}) for i in range(50)]
    with actors_held():  # all in the mailbox before the stop
        rig.log(*records)
        stopped = rig.ref.stop(block=False)
    stopped.get(timeout=5)
    assert rig.log_path.read_bytes() == lines(records)


def test_the_log_file_stays_open_between_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # no open per line: the path is only looked at
    opened: list[Path] = []
    def counting_open(path: Path, flags: int) -> int:
        opened.append(path)
        return open_private(path, flags)

    monkeypatch.setattr(logger_module, "open_private", counting_open)
    rig = LoggerRig(tmp_path / "log.ndjson")
    records = [log_record(AT, QID, "delivered", {"to": f"chat {i}"}) for i in range(5)]
    for record in records:
        rig.logged(record)
    assert rig.log_path.read_bytes() == lines(records)
    assert opened == [rig.log_path]


class _CloseFailsOs:
    """The `os` module as the logger sees it, with `close` failing as on a lost NFS mount
    (the descriptor is released all the same)."""

    def close(self, fd: int) -> None:
        os.close(fd)
        raise OSError(5, "Input/output error")

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


def test_a_close_that_fails_does_not_stop_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # C20: the rotated file is let go of, whatever close says
    monkeypatch.setattr(logger_module, "os", _CloseFailsOs())
    rig = LoggerRig(tmp_path / "log.ndjson")
    rig.logged(log_record(AT, QID, "question_received"))
    rig.log_path.rename(tmp_path / "log.ndjson.1")
    second = log_record(AT, QID, "delivered")
    rig.logged(second)
    assert rig.log_path.read_text(encoding="utf-8") == second.to_line(PROJECT)
    assert rig.ref.is_alive()
    rig.supervisor.assert_nothing()  # the sync above ran after all it was told


def test_a_log_file_left_loose_is_tightened_when_the_logger_starts(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:  # the log holds the conversation: 0600 before the first new line
    log_path = tmp_path / "log.ndjson"
    log_path.write_text("")
    log_path.chmod(0o644)
    rig = LoggerRig(log_path)
    rig.sync()  # begin has run
    assert stat.S_IMODE(log_path.stat().st_mode) == 0o600
    assert capfd.readouterr().err == (
        f"coms-hermes-bridge: {log_path} was mode 0644; tightened to 0600\n"
    )


def test_a_log_file_loosened_meanwhile_is_tightened_at_the_next_line(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:  # the log holds the conversation: 0600, as when it was opened per line
    rig = LoggerRig(tmp_path / "log.ndjson")
    rig.logged(log_record(AT, QID, "question_received"))
    rig.log_path.chmod(0o644)
    rig.logged(log_record(AT, QID, "delivered"))
    assert stat.S_IMODE(rig.log_path.stat().st_mode) == 0o600
    assert capfd.readouterr().err == (
        f"coms-hermes-bridge: {rig.log_path} was mode 0644; tightened to 0600\n"
    )
    assert len(rig.log_path.read_bytes().splitlines()) == 2


def test_a_log_directory_that_cannot_be_made_is_said_at_start(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:  # C20: said, and the bridge goes on without its log
    (tmp_path / "blocked").write_text("a file where the log's directory should be")
    log_path = tmp_path / "blocked" / "log.ndjson"
    rig = LoggerRig(log_path)
    rig.logged(log_record(AT, QID, "question_received"))
    first = capfd.readouterr().err.splitlines()[0]
    assert first == (
        f"coms-hermes-bridge: cannot prepare {log_path}: {log_path.parent} is not a directory"
    )
    assert rig.ref.is_alive()
    rig.supervisor.assert_nothing()


def test_a_log_directory_removed_meanwhile_is_made_again_and_said(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:  # C20
    directory = tmp_path / "logs"
    rig = LoggerRig(directory / "log.ndjson")
    rig.logged(log_record(AT, QID, "question_received"))
    rig.log_path.unlink()
    directory.rmdir()
    capfd.readouterr()
    second = log_record(AT, QID, "delivered")
    rig.logged(second)
    assert rig.log_path.read_text(encoding="utf-8") == second.to_line(PROJECT)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert capfd.readouterr().err == (
        f"coms-hermes-bridge: warning: {directory} was gone; made it again (0700)\n"
    )
