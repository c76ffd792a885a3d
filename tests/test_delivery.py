"""DeliveryActor: `hermes send`, one at a time, in order, bounded (W20, C18)."""

from __future__ import annotations

import itertools
import logging
import os
import signal
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pykka
import pytest
from hermes_fake import FakeHermes

from coms_hermes_bridge.actors.delivery import OUTPUT_TAIL, DeliveryActor
from coms_hermes_bridge.messages.commands import Delivered, DeliveryFailed, LogEvent, SendText
from coms_hermes_bridge.messages.contract import cancel_note
from tests.fakes import FakeRef, wait_for

QID = "01HZY3K4M5N6P7Q8R9S0T1V2W3"
AT = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.fixture
def hermes(tmp_path: Path) -> FakeHermes:
    return FakeHermes(tmp_path / "bin")


def start(
    hermes: str,
    *,
    logger: FakeRef | None = None,
    profile: str | None = None,
    send_timeout_ms: float = 5000,
    note_owed: Any = None,
    note_sent: Any = None,
) -> pykka.ActorRef[DeliveryActor]:
    return DeliveryActor.start(
        supervisor=FakeRef("supervisor"),
        logger=logger or FakeRef("logger"),
        target="telegram:1:2",
        profile=profile,
        send_timeout_ms=send_timeout_ms,
        hermes=hermes,
        now=lambda: AT,
        note_owed=note_owed,
        note_sent=note_sent,
    )


def group_alive(pgid: int) -> bool:
    """Any process of the group that is not a zombie (zombies wait only to be reaped)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def test_runs_hermes_with_the_exact_argv_and_reports_delivered(hermes: FakeHermes) -> None:  # W20
    ref = start(str(hermes.path))
    question = FakeRef("question")
    text = "❓ [HUB-Q:X] what?\n\n↩ reply; $(rm -rf /) `x` 'q' \"d\""
    ref.tell(SendText(QID, text, "question", question))
    assert question.expect(Delivered) == Delivered(QID)
    assert hermes.argvs() == [["send", "--to", "telegram:1:2", text]]


def test_profile_goes_before_send(hermes: FakeHermes) -> None:  # W20
    ref = start(str(hermes.path), profile="p")
    question = FakeRef("question")
    ref.tell(SendText(QID, "hi", "question", question))
    question.expect(Delivered)
    assert hermes.argvs() == [["--profile", "p", "send", "--to", "telegram:1:2", "hi"]]


def test_found_on_path(hermes: FakeHermes, monkeypatch: pytest.MonkeyPatch) -> None:  # W20
    monkeypatch.setenv("PATH", f"{hermes.directory}{os.pathsep}{os.environ['PATH']}")
    ref = start("hermes")
    question = FakeRef("question")
    ref.tell(SendText(QID, "hi", "question", question))
    question.expect(Delivered)
    assert len(hermes.calls()) == 1


@pytest.mark.parametrize(
    ("config", "error"),
    [
        ({"exit": 3, "stderr": "chat not found\n"}, "hermes send failed (3): chat not found"),
        ({"exit": 4, "stdout": "no token"}, "hermes send failed (4): no token"),
        ({"exit": 5, "stdout": "out", "stderr": "err"}, "hermes send failed (5): err"),
        ({"exit": 1}, "hermes send failed (1)"),
    ],
)
def test_nonzero_exit_is_a_failure_naming_code_and_output(
    hermes: FakeHermes, config: dict[str, Any], error: str
) -> None:  # C18
    hermes.configure(**config)
    ref = start(str(hermes.path))
    question = FakeRef("question")
    ref.tell(SendText(QID, "hi", "question", question))
    assert question.expect(DeliveryFailed) == DeliveryFailed(QID, error)


def test_missing_hermes_is_a_failure(tmp_path: Path) -> None:  # C18
    missing = tmp_path / "nowhere" / "hermes"
    ref = start(str(missing))
    question = FakeRef("question")
    ref.tell(SendText(QID, "hi", "question", question))
    failed = question.expect(DeliveryFailed)
    assert failed.error.startswith("hermes send failed: [Errno 2] No such file or directory")
    assert str(missing) in failed.error


def test_a_burst_runs_one_at_a_time_in_arrival_order(hermes: FakeHermes) -> None:  # W20
    hermes.configure(sleep=0.2)
    ref = start(str(hermes.path))
    question = FakeRef("question")
    for i in range(4):
        ref.tell(SendText(QID, f"text {i}", "question", question))
    for _ in range(4):
        question.expect(Delivered)
    calls = hermes.calls()
    assert [c["argv"][-1] for c in calls] == [f"text {i}" for i in range(4)]
    for earlier, later in itertools.pairwise(calls):
        assert earlier["end"] <= later["start"], "two hermes runs overlapped"


def test_a_send_past_its_timeout_is_killed_with_its_group(hermes: FakeHermes) -> None:  # C18
    hermes.configure(sleep=10, spawn=True)
    ref = start(str(hermes.path), send_timeout_ms=300)
    question = FakeRef("question")
    began = time.monotonic()
    ref.tell(SendText(QID, "hi", "question", question))
    failed = question.expect(DeliveryFailed, timeout=3)
    assert time.monotonic() - began < 1.5
    assert failed == DeliveryFailed(QID, "hermes send failed: timed out after 300ms")
    run = hermes.started()[0]
    assert run["pgid"] == run["pid"] and run["child"] is not None
    wait_for(lambda: not group_alive(run["pgid"]), timeout=2, what="hermes' group to die")


def test_the_worker_goes_on_after_a_timeout(hermes: FakeHermes) -> None:  # C18
    hermes.configure(sleep=10)
    # long enough for the fast run's Python start-up on a loaded machine (200 ms was not)
    ref = start(str(hermes.path), send_timeout_ms=1500)
    question = FakeRef("question")
    ref.tell(SendText(QID, "slow", "question", question))
    hermes.wait_started(1)
    hermes.configure()
    ref.tell(SendText(QID, "fast", "question", question))
    question.expect(DeliveryFailed)
    question.expect(Delivered)


def test_a_failed_note_is_logged_by_delivery_itself(hermes: FakeHermes) -> None:  # C18, C20
    hermes.configure(exit=2, stderr="boom")
    logger = FakeRef("logger")
    ref = start(str(hermes.path), logger=logger)
    ref.tell(SendText(QID, cancel_note(QID), "cancel_note"))
    record = logger.expect(LogEvent).record
    assert record.event == "delivery_error"
    assert record.qid == QID
    assert record.at == "2025-01-02T03:04:05.000Z"
    assert record.detail == {"phase": "cancel_note", "error": "hermes send failed (2): boom"}


def test_a_sent_note_logs_nothing(hermes: FakeHermes) -> None:
    logger = FakeRef("logger")
    settled: list[str] = []
    ref = start(str(hermes.path), logger=logger, note_sent=settled.append)
    ref.tell(SendText(QID, "note", "late_note", note_id="late:1"))
    # marked sent once the run is settled, after any log line it would have brought
    wait_for(lambda: settled == ["late:1"], what="the note to be sent")
    assert len(hermes.calls()) == 1
    logger.assert_nothing()


class DeadRef:
    def tell(self, message: Any) -> None:
        raise pykka.ActorDeadError("gone")


def test_a_dead_reply_to_does_not_kill_the_worker(hermes: FakeHermes) -> None:
    ref = start(str(hermes.path))
    ref.tell(SendText(QID, "first", "question", DeadRef()))
    question = FakeRef("question")
    ref.tell(SendText(QID, "second", "question", question))
    question.expect(Delivered)


def test_release_during_a_long_send_is_quick_and_kills_hermes(hermes: FakeHermes) -> None:
    hermes.configure(sleep=10, spawn=True)
    ref = start(str(hermes.path), send_timeout_ms=60_000)
    question = FakeRef("question")
    ref.tell(SendText(QID, "one", "question", question))
    ref.tell(SendText(QID, "two", "question", question))
    run = hermes.wait_started(1)[0]
    assert group_alive(run["pgid"])
    began = time.monotonic()
    ref.stop(timeout=2)
    assert time.monotonic() - began < 0.6
    wait_for(lambda: not group_alive(run["pgid"]), timeout=2, what="hermes' group to die")
    # stopped (ref.stop returned): it has no turn left to tell anything in, and only
    # its turns tell; the queue is dropped
    question.assert_nothing()
    assert len(hermes.started()) == 1


def test_an_unknown_message_fails_loudly(hermes: FakeHermes) -> None:
    supervisor = FakeRef("supervisor")
    DeliveryActor.start(
        supervisor=supervisor, logger=FakeRef(), target="telegram", profile=None,
        send_timeout_ms=1000, hermes=str(hermes.path),
    ).tell(object())
    assert "delivery" in repr(supervisor.next())


def test_hermes_output_is_kept_to_its_last_4_kib(hermes: FakeHermes) -> None:  # C18
    hermes.configure(exit=1, flood=50_000_000, stderr="final reason")
    ref = start(str(hermes.path), send_timeout_ms=30_000)
    question = FakeRef("question")
    ref.tell(SendText(QID, "hi", "question", question))
    failed = question.expect(DeliveryFailed, timeout=30)
    assert failed.error.startswith("hermes send failed (1): ")
    assert failed.error.endswith("final reason")
    assert len(failed.error.encode()) <= len("hermes send failed (1): ") + OUTPUT_TAIL


def test_hermes_exit_decides_even_when_a_child_holds_its_pipes(hermes: FakeHermes) -> None:
    # exits 0 but leaves `sleep 30` behind holding stdout and stderr
    hermes.configure(spawn=True)
    ref = start(str(hermes.path), send_timeout_ms=10_000)
    question = FakeRef("question")
    began = time.monotonic()
    ref.tell(SendText(QID, "hi", "question", question))
    try:
        assert question.expect(Delivered, timeout=5) == Delivered(QID)
        assert time.monotonic() - began < 1.0
    finally:
        child = hermes.started()[0]["child"]
        os.kill(child, signal.SIGKILL)


def test_hermes_exit_status_decides_failure_with_a_child_left(hermes: FakeHermes) -> None:  # 9.6
    hermes.configure(spawn=True, exit=3, stderr="no route")
    ref = start(str(hermes.path), send_timeout_ms=10_000)
    question = FakeRef("question")
    began = time.monotonic()
    ref.tell(SendText(QID, "hi", "question", question))
    try:
        failed = question.expect(DeliveryFailed, timeout=5)
        assert failed == DeliveryFailed(QID, "hermes send failed (3): no route")
        assert time.monotonic() - began < 1.0
    finally:
        os.kill(hermes.started()[0]["child"], signal.SIGKILL)


def test_a_reminder_no_longer_owed_is_never_run(hermes: FakeHermes) -> None:  # X9
    owed = {"remind:a": False, "remind:b": True}
    asked: list[str] = []
    sent: list[str] = []

    def note_owed(note_id: str) -> bool:
        asked.append(note_id)
        return owed[note_id]

    ref = start(str(hermes.path), note_owed=note_owed, note_sent=sent.append)
    question = FakeRef("question")
    ref.tell(SendText(QID, "⏰ a", "remind_note", note_id="remind:a"))  # its question closed
    ref.tell(SendText(QID, "⏰ b", "remind_note", note_id="remind:b"))
    ref.tell(SendText(QID, "✖ c", "cancel_note", note_id="c"))  # other notes: never asked
    ref.tell(SendText(QID, "❓ d", "question", question))
    assert question.expect(Delivered) == Delivered(QID)
    assert [argv[-1] for argv in hermes.argvs()] == ["⏰ b", "✖ c", "❓ d"]
    assert sent == ["remind:b", "c"]
    assert asked == ["remind:a", "remind:b"]


def test_a_withdrawn_reminder_queued_behind_a_send_does_not_hold_up_the_next(
    hermes: FakeHermes,
) -> None:  # X9: skipped in the queue, and the job after it runs at once
    hermes.configure(sleep=0.3)
    ref = start(str(hermes.path), note_owed=lambda note_id: False)
    question = FakeRef("question")
    ref.tell(SendText(QID, "first", "question", question))
    hermes.wait_started(1)
    ref.tell(SendText(QID, "⏰ gone", "remind_note", note_id="remind:gone"))
    ref.tell(SendText(QID, "second", "question", question))
    assert [question.expect(Delivered), question.expect(Delivered)] == [Delivered(QID)] * 2
    assert [argv[-1] for argv in hermes.argvs()] == ["first", "second"]


def test_a_reminder_without_a_note_id_is_sent_without_asking_the_store(
    hermes: FakeHermes,
) -> None:  # X9: nothing to look up
    asked: list[str | None] = []
    ref = start(str(hermes.path), note_owed=lambda note_id: asked.append(note_id) or False)
    question = FakeRef("question")
    ref.tell(SendText(QID, "⏰ anonymous", "remind_note"))
    ref.tell(SendText(QID, "next", "question", question))
    question.expect(Delivered)
    assert [argv[-1] for argv in hermes.argvs()] == ["⏰ anonymous", "next"]
    assert asked == []


def test_a_store_that_cannot_say_sends_the_reminder_and_says_why(
    hermes: FakeHermes, capfd: pytest.CaptureFixture[str]
) -> None:  # X9: at least once, like every note
    def note_owed(note_id: str) -> bool:
        raise RuntimeError("database is locked")

    ref = start(str(hermes.path), note_owed=note_owed)
    question = FakeRef("question")
    ref.tell(SendText(QID, "⏰ maybe", "remind_note", note_id="remind:m"))
    ref.tell(SendText(QID, "next", "question", question))
    question.expect(Delivered)
    assert [argv[-1] for argv in hermes.argvs()] == ["⏰ maybe", "next"]
    assert capfd.readouterr().err == (
        "coms-hermes-bridge: delivery: cannot tell whether remind:m is owed: "
        "RuntimeError('database is locked')\n"
    )


def test_a_failed_send_is_one_error_line_for_the_operator(
    hermes: FakeHermes, capfd: pytest.CaptureFixture[str]
) -> None:  # C18: the level word journald and grep filter on
    hermes.configure(exit=3, stderr="chat not found\n")
    ref = start(str(hermes.path))
    question = FakeRef("question")
    ref.tell(SendText(QID, "hi", "question", question))
    question.expect(DeliveryFailed)
    assert capfd.readouterr().err == (
        f"coms-hermes-bridge: error: question for {QID} not delivered: "
        "hermes send failed (3): chat not found\n"
    )


def test_a_sent_note_that_cannot_be_recorded_is_said(
    hermes: FakeHermes, capfd: pytest.CaptureFixture[str]
) -> None:  # it stays owed, and is sent again at the next start (at least once)
    def note_sent(note_id: str) -> None:
        raise RuntimeError("disk full")

    ref = start(str(hermes.path), note_sent=note_sent)
    question = FakeRef("question")
    ref.tell(SendText(QID, "✖ cancelled", "cancel_note", note_id="cancel:1"))
    ref.tell(SendText(QID, "next", "question", question))
    question.expect(Delivered)
    assert capfd.readouterr().err == (
        f"coms-hermes-bridge: could not record the cancel_note for {QID} as sent: "
        "RuntimeError('disk full')\n"
    )


def test_an_unforeseen_fault_running_hermes_is_the_send_failing(
    hermes: FakeHermes, monkeypatch: pytest.MonkeyPatch
) -> None:  # C18: named, and the next send goes on
    from coms_hermes_bridge.actors import delivery as delivery_module

    real = delivery_module.run_process
    faults = [RuntimeError("no pidfd")]

    async def run_process(argv: list[str], timeout_s: float) -> Any:
        if faults:
            raise faults.pop()
        return await real(argv, timeout_s)

    monkeypatch.setattr(delivery_module, "run_process", run_process)
    ref = start(str(hermes.path))
    question = FakeRef("question")
    ref.tell(SendText(QID, "one", "question", question))
    ref.tell(SendText(QID, "two", "question", question))
    assert question.expect(DeliveryFailed) == DeliveryFailed(
        QID, "hermes send failed: RuntimeError: no pidfd")
    assert question.expect(Delivered) == Delivered(QID)


def test_an_idle_delivery_stops_cleanly(
    hermes: FakeHermes, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    ref = start(str(hermes.path))
    ref.stop(timeout=5)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert capfd.readouterr().err == ""


def test_an_unknown_message_names_delivery_and_the_message(hermes: FakeHermes) -> None:
    supervisor = FakeRef("supervisor")
    DeliveryActor.start(
        supervisor=supervisor, logger=FakeRef(), target="telegram", profile=None,
        send_timeout_ms=1000, hermes=str(hermes.path),
    ).tell(("no", "such"))
    assert supervisor.next().error == "UnknownMessage: delivery does not take tuple: ('no', 'such')"
