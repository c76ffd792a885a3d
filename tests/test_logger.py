"""LoggerActor: the only writer of log.ndjson (C20)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pykka
import pytest
from fakes import FakeRef, wait_for

from coms_hermes_bridge.actors.logger import LoggerActor
from coms_hermes_bridge.messages.commands import LogEvent
from coms_hermes_bridge.messages.contract import log_record

QID = "01HZY3K4M5N6P7Q8R9S0T1V2W3"
AT = datetime(2025, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)


def start(log_path: Path) -> pykka.ActorRef[LoggerActor]:
    return LoggerActor.start(supervisor=FakeRef("supervisor"), log_path=log_path)


def test_appends_each_record_as_one_line_in_order(tmp_path: Path) -> None:  # C20
    log_path = tmp_path / "deep" / "dir" / "log.ndjson"
    records = [
        log_record(AT, QID, "question_received"),
        log_record(AT, QID, "delivered"),
        log_record(AT, None, "answer_rejected", {"reason": "invalid_path", "file": "x.txt"}),
        log_record(AT, QID, "late_answer", {"state": "answered"}),
    ]
    ref = start(log_path)
    for record in records:
        ref.tell(LogEvent(record))
    expected = "".join(r.to_line() for r in records).encode("utf-8")
    wait_for(lambda: log_path.exists() and log_path.read_bytes() == expected, what="four lines")
    assert log_path.read_bytes().splitlines()[2] == (
        b'{"at":"2025-01-02T03:04:05.678Z","qid":"00000000000000000000000000",'
        b'"event":"answer_rejected","detail":{"reason":"invalid_path","file":"x.txt"}}'
    )


def test_keeps_appending_after_the_file_is_rotated_away(tmp_path: Path) -> None:  # C20
    log_path = tmp_path / "log.ndjson"
    ref = start(log_path)
    first = log_record(AT, QID, "question_received")
    ref.ask(LogEvent(first))
    log_path.rename(tmp_path / "log.ndjson.1")
    second = log_record(AT, QID, "delivered")
    ref.ask(LogEvent(second))
    assert log_path.read_text(encoding="utf-8") == second.to_line()
    assert (tmp_path / "log.ndjson.1").read_text(encoding="utf-8") == first.to_line()


def test_unwritable_path_reports_on_stderr_and_survives(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:  # C20
    log_path = tmp_path / "log.ndjson"
    log_path.mkdir()  # a directory where the file should be: every write fails
    ref = start(log_path)
    ref.ask(LogEvent(log_record(AT, QID, "question_received")))
    err = capfd.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("coms-hermes-bridge: cannot write") and str(log_path) in err
    assert ref.is_alive()

    log_path.rmdir()
    good = log_record(AT, QID, "delivered")
    ref.ask(LogEvent(good))
    assert log_path.read_text(encoding="utf-8") == good.to_line()


def test_an_unknown_message_fails_loudly(tmp_path: Path) -> None:
    supervisor = FakeRef("supervisor")
    ref = LoggerActor.start(supervisor=supervisor, log_path=tmp_path / "log.ndjson")
    ref.tell("not a LogEvent")
    failed = supervisor.next()
    assert "logger" in repr(failed) and "str" in repr(failed)
