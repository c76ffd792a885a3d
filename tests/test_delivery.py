"""DeliveryActor: `hermes send`, one at a time, in order, bounded (W20, C18)."""

from __future__ import annotations

import fcntl
import itertools
import logging
import os
import signal
import sqlite3
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest

from coms_hermes_bridge.actors import delivery as hermes_module
from coms_hermes_bridge.actors import sends as sends_module
from coms_hermes_bridge.actors.delivery import DeliveryActor, question_send
from coms_hermes_bridge.actors.sends import run_send, send_paths, sends_dir, under_way
from coms_hermes_bridge.actors.store import Store
from coms_hermes_bridge.messages.commands import (
    ChildFailed,
    HermesRan,
    LogEvent,
    SendText,
    TextPurpose,
)
from coms_hermes_bridge.messages.contract import cancel_note
from coms_hermes_bridge.send_waiter import TAIL as OUTPUT_TAIL
from tests.fakes import WiredRig, bridge_config, wait_for
from tests.hermes_fake import FakeHermes
from tests.test_question import question_spec

QID = "01HZY3K4M5N6P7Q8R9S0T1V2W3"
AT = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


class Notes:
    """The store as delivery uses it: whether a note is still owed (a question's send
    always is), marking it sent, and nothing owed from a last run."""

    def __init__(self, owed: Callable[[str], bool] = lambda note_id: True,
                 sent: Callable[[str], None] = lambda note_id: None) -> None:
        self.owed, self.sent = owed, sent
        self.outcomes: dict[str, str | None] = {}  # outcomes a restart would find (`sent`)
        self.recorded: list[tuple[str, str | None]] = []

    def send_owed(self, key: str) -> bool:
        return not key.startswith("note:") or self.owed(key.removeprefix("note:"))

    def load(self) -> tuple[list[Any], list[Any]]:
        return [], []

    def owed_notes(self) -> list[SendText]:
        return []

    def note_sent(self, note_id: str) -> None:
        self.sent(note_id)
        self.outcomes.pop(f"note:{note_id}", None)

    def record_sent(self, key: str, error: str | None) -> None:
        """(as if what it was sent for acted on it at once: a restart's is tested with a
        real store)"""
        self.recorded.append((key, error))

    def sent_outcome(self, key: str) -> tuple[str | None] | None:
        return (self.outcomes[key],) if key in self.outcomes else None


class DeliveryRig(WiredRig[DeliveryActor]):
    """Delivery as the tree starts it, sending to telegram:1:2 with `hermes`; a question's
    result goes to the Router (`rig.router`)."""

    def __init__(self, hermes: Path | str, *, profile: str | None = None,
                 send_timeout_ms: float = 5000, notes: Notes | None = None,
                 state: Path | None = None) -> None:
        self._serial = itertools.count()
        # the sends' files go beside the state file (actors/sends.py): a directory per rig
        state = state or Path(tempfile.mkdtemp(prefix="chd", dir="/tmp")) / "state-d.sqlite3"
        self.sends = sends_dir(state)
        config = bridge_config(target="telegram:1:2", hermes_profile=profile,
                               send_timeout_ms=send_timeout_ms, hermes=str(hermes),
                               state_path=state)
        super().__init__(DeliveryActor, store=notes or Notes(), config=config, now=lambda: AT)

    def send(self, text: str, purpose: TextPurpose = "question",
             note_id: str | None = None) -> None:
        """A question's text, or a note. Each question is a qid of its own (QID with a
        count): the same question told twice while queued is queued once."""
        qid = f"{QID}.{next(self._serial)}" if purpose == "question" else QID
        self.ref.tell(SendText(qid, text, purpose, note_id))

    def told(self, timeout: float = 5.0) -> tuple[str, str | None]:
        """What the Router was told of the next question: QID (whatever its count), and
        None when sent, else C18's error."""
        ran = self.router.expect(HermesRan, timeout)
        return ran.job.qid.partition(".")[0], ran.error


@pytest.fixture
def hermes(tmp_path: Path) -> FakeHermes:
    return FakeHermes(tmp_path / "bin")


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
    rig = DeliveryRig(hermes.path)
    text = "❓ [HUB-Q:X] what?\n\n↩ reply; $(rm -rf /) `x` 'q' \"d\""
    rig.send(text)
    assert rig.told() == (QID, None)
    assert hermes.argvs() == [["send", "--to", "telegram:1:2", text]]


def test_profile_goes_before_send(hermes: FakeHermes) -> None:  # W20
    rig = DeliveryRig(hermes.path, profile="p")
    rig.send("hi")
    assert rig.told() == (QID, None)
    assert hermes.argvs() == [["--profile", "p", "send", "--to", "telegram:1:2", "hi"]]


def test_found_on_path(hermes: FakeHermes, monkeypatch: pytest.MonkeyPatch) -> None:  # W20
    monkeypatch.setenv("PATH", f"{hermes.directory}{os.pathsep}{os.environ['PATH']}")
    rig = DeliveryRig("hermes")
    rig.send("hi")
    assert rig.told() == (QID, None)
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
    rig = DeliveryRig(hermes.path)
    rig.send("hi")
    assert rig.told() == (QID, error)


def test_a_failed_send_is_one_error_line_for_the_operator(
    hermes: FakeHermes, capfd: pytest.CaptureFixture[str]
) -> None:  # C18: the level word journald and grep filter on
    hermes.configure(exit=3, stderr="chat not found\n")
    rig = DeliveryRig(hermes.path)
    rig.send("hi")
    assert rig.told() == (QID, "hermes send failed (3): chat not found")
    assert capfd.readouterr().err == (
        f"coms-hermes-bridge: error: question for {QID}.0 not delivered: "
        "hermes send failed (3): chat not found\n"
    )


def test_missing_hermes_is_a_failure(tmp_path: Path) -> None:  # C18
    missing = tmp_path / "nowhere" / "hermes"
    rig = DeliveryRig(missing)
    rig.send("hi")
    qid, error = rig.told()
    assert qid == QID and error is not None
    assert error.startswith("hermes send failed: [Errno 2] No such file or directory")
    assert str(missing) in error


def test_a_burst_runs_one_at_a_time_in_arrival_order(hermes: FakeHermes) -> None:  # W20
    hermes.configure(sleep=0.2)
    rig = DeliveryRig(hermes.path)
    for i in range(4):
        rig.send(f"text {i}")
    for _ in range(4):
        assert rig.told() == (QID, None)
    calls = hermes.calls()
    assert [c["argv"][-1] for c in calls] == [f"text {i}" for i in range(4)]
    for earlier, later in itertools.pairwise(calls):
        assert earlier["end"] <= later["start"], "two hermes runs overlapped"


def test_a_send_past_its_timeout_is_killed_with_its_group(hermes: FakeHermes) -> None:  # C18
    hermes.configure(sleep=10, spawn=True)
    # long enough for hermes to start on a loaded machine (300 ms was not), far below its 10 s
    rig = DeliveryRig(hermes.path, send_timeout_ms=1500)
    began = time.monotonic()
    rig.send("hi")
    failed = rig.told(timeout=6)
    assert time.monotonic() - began < 4.0
    assert failed == (QID, "hermes send failed: timed out after 1500ms")
    run = hermes.started()[0]
    assert run["pgid"] == run["pid"] and run["child"] is not None
    wait_for(lambda: not group_alive(run["pgid"]), timeout=2, what="hermes' group to die")


@pytest.mark.parametrize(("send_timeout_ms", "said"), [(1.5e-7, "1.5e-7"), (2e-3, "0.002")])
def test_the_send_timeout_is_said_as_javascript_prints_it(
    hermes: FakeHermes, send_timeout_ms: float, said: str
) -> None:  # C18, X17: Python would say 1.5e-07; upstream says 1.5e-7
    hermes.configure(sleep=10)
    rig = DeliveryRig(hermes.path, send_timeout_ms=send_timeout_ms)
    rig.send("hi")
    assert rig.told() == (QID, f"hermes send failed: timed out after {said}ms")


def test_delivery_goes_on_after_a_timeout(hermes: FakeHermes) -> None:  # C18
    hermes.configure(sleep=10)
    # long enough for the fast run's Python start-up on a loaded machine (200 ms was not)
    rig = DeliveryRig(hermes.path, send_timeout_ms=1500)
    rig.send("slow")
    hermes.wait_started(1)
    hermes.configure()
    rig.send("fast")
    assert rig.told() == (QID, "hermes send failed: timed out after 1500ms")
    assert rig.told() == (QID, None)


def test_hermes_output_is_kept_to_its_last_4_kib(hermes: FakeHermes) -> None:  # C18
    hermes.configure(exit=1, flood=50_000_000, stderr="final reason")
    rig = DeliveryRig(hermes.path, send_timeout_ms=30_000)
    rig.send("hi")
    qid, error = rig.told(timeout=30)
    assert qid == QID and error is not None
    assert error.startswith("hermes send failed (1): ")
    assert error.endswith("final reason")
    assert len(error.encode()) <= len("hermes send failed (1): ") + OUTPUT_TAIL


def test_hermes_exit_decides_even_when_a_child_holds_its_pipes(hermes: FakeHermes) -> None:
    # exits 0 but leaves `sleep 30` behind holding stdout and stderr
    hermes.configure(spawn=True)
    rig = DeliveryRig(hermes.path, send_timeout_ms=10_000)
    began = time.monotonic()
    rig.send("hi")
    try:
        assert rig.told(timeout=5) == (QID, None)
        # waiting for the pipes would take the child's 30 s, or fail at the 10 s send timeout
        assert time.monotonic() - began < 5.0
    finally:
        os.kill(hermes.started()[0]["child"], signal.SIGKILL)


def test_hermes_exit_status_decides_failure_with_a_child_left(hermes: FakeHermes) -> None:  # C18
    hermes.configure(spawn=True, exit=3, stderr="no route")
    rig = DeliveryRig(hermes.path, send_timeout_ms=10_000)
    began = time.monotonic()
    rig.send("hi")
    try:
        assert rig.told(timeout=5) == (QID, "hermes send failed (3): no route")
        # waiting for the pipes would take the child's 30 s, or fail at the 10 s send timeout
        assert time.monotonic() - began < 5.0
    finally:
        os.kill(hermes.started()[0]["child"], signal.SIGKILL)


def test_an_unforeseen_fault_running_hermes_is_the_send_failing(
    hermes: FakeHermes, monkeypatch: pytest.MonkeyPatch
) -> None:  # C18: named, and the next send goes on
    faults = [RuntimeError("no pidfd")]

    async def faulty(directory: Path, key: str, argv: list[str], timeout_s: float) -> Any:
        if faults:
            raise faults.pop()
        return await run_send(directory, key, argv, timeout_s)

    monkeypatch.setattr(hermes_module, "run_send", faulty)
    rig = DeliveryRig(hermes.path)
    rig.send("one")
    rig.send("two")
    assert rig.told() == (QID, "hermes send failed: RuntimeError: no pidfd")
    assert rig.told() == (QID, None)


def test_a_failed_note_is_logged_by_delivery_itself(hermes: FakeHermes) -> None:  # C18, C20
    hermes.configure(exit=2, stderr="boom")
    rig = DeliveryRig(hermes.path)
    rig.send(cancel_note(QID), "cancel_note")
    record = rig.logger.expect(LogEvent).record
    assert record.event == "delivery_error"
    assert record.qid == QID
    assert record.at == "2025-01-02T03:04:05.000Z"
    assert record.detail == {"phase": "cancel_note", "error": "hermes send failed (2): boom"}


def test_a_sent_note_logs_nothing(hermes: FakeHermes) -> None:  # C20
    settled: list[str] = []
    rig = DeliveryRig(hermes.path, notes=Notes(sent=settled.append))
    rig.send("note", "late_note", note_id="late:1")
    # marked sent once the run is settled, after any log line it would have brought
    wait_for(lambda: settled == ["late:1"], what="the note to be sent")
    assert len(hermes.calls()) == 1
    rig.logger.assert_nothing()


def test_a_sent_note_that_cannot_be_recorded_is_said(
    hermes: FakeHermes, capfd: pytest.CaptureFixture[str]
) -> None:  # it stays owed, and is sent again at the next start (at least once)
    def note_sent(note_id: str) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    rig = DeliveryRig(hermes.path, notes=Notes(sent=note_sent))
    rig.send("✖ cancelled", "cancel_note", note_id="cancel:1")
    rig.send("next")
    assert rig.told() == (QID, None)
    assert capfd.readouterr().err == (
        f"coms-hermes-bridge: could not record the cancel_note for {QID} as sent: "
        "OperationalError('database or disk is full')\n"
    )


def test_a_reminder_no_longer_owed_is_never_run(hermes: FakeHermes) -> None:  # X9
    owed = {"remind:a": False, "remind:b": True, "c": True}
    asked: list[str] = []
    sent: list[str] = []

    def note_owed(note_id: str) -> bool:
        asked.append(note_id)
        return owed[note_id]

    rig = DeliveryRig(hermes.path, notes=Notes(owed=note_owed, sent=sent.append))
    rig.send("⏰ a", "remind_note", note_id="remind:a")  # its question closed
    rig.send("⏰ b", "remind_note", note_id="remind:b")
    rig.send("✖ c", "cancel_note", note_id="c")
    rig.send("❓ d")
    assert rig.told() == (QID, None)
    assert [argv[-1] for argv in hermes.argvs()] == ["⏰ b", "✖ c", "❓ d"]
    assert sent == ["remind:b", "c"]
    assert asked == ["remind:a", "remind:b", "c"]  # every note kept in the store is asked


def test_a_withdrawn_reminder_queued_behind_a_send_does_not_hold_up_the_next(
    hermes: FakeHermes,
) -> None:  # X9: skipped in the queue, and the job after it runs at once
    hermes.configure(sleep=0.3)
    rig = DeliveryRig(hermes.path, notes=Notes(owed=lambda note_id: False))
    rig.send("first")
    hermes.wait_started(1)
    rig.send("⏰ gone", "remind_note", note_id="remind:gone")
    rig.send("second")
    assert [rig.told(), rig.told()] == [(QID, None)] * 2
    assert [argv[-1] for argv in hermes.argvs()] == ["first", "second"]


def test_a_note_without_a_note_id_is_sent_without_asking_the_store(
    hermes: FakeHermes,
) -> None:  # X9, X7: nothing to look up
    asked: list[str] = []

    def note_owed(note_id: str) -> bool:
        asked.append(note_id)
        return False

    rig = DeliveryRig(hermes.path, notes=Notes(owed=note_owed))
    rig.send("⏰ anonymous", "remind_note")
    rig.send("next")
    assert rig.told() == (QID, None)
    assert [argv[-1] for argv in hermes.argvs()] == ["⏰ anonymous", "next"]
    assert asked == []


def test_a_store_that_cannot_say_sends_the_reminder_and_says_why(
    hermes: FakeHermes, capfd: pytest.CaptureFixture[str]
) -> None:  # X9: at least once, like every note
    def note_owed(note_id: str) -> bool:
        raise sqlite3.OperationalError("database is locked")

    rig = DeliveryRig(hermes.path, notes=Notes(owed=note_owed))
    rig.send("⏰ maybe", "remind_note", note_id="remind:m")
    rig.send("next")
    assert rig.told() == (QID, None)
    assert [argv[-1] for argv in hermes.argvs()] == ["⏰ maybe", "next"]
    assert capfd.readouterr().err == (
        "coms-hermes-bridge: delivery: cannot tell whether note:remind:m is owed: "
        "OperationalError('database is locked')\n"
    )


def test_a_stop_during_a_long_send_is_quick_and_leaves_hermes_to_finish(
        hermes: FakeHermes) -> None:
    # a stop (the daemon's, or a crash) never kills a running hermes: it may reach the chat
    # all the same, and its outcome is left for whoever runs next (no second send)
    hermes.configure(sleep=1, spawn=True)
    rig = DeliveryRig(hermes.path, send_timeout_ms=60_000)
    rig.send("one")
    rig.send("two")
    run = hermes.wait_started(1)[0]
    began = time.monotonic()
    rig.ref.stop(timeout=2)
    assert time.monotonic() - began < 0.6
    try:
        wait_for(lambda: len(hermes.calls()) == 1, timeout=5, what="hermes to finish its run")
        wait_for(lambda: list(rig.sends.glob("*.outcome")), what="the outcome left behind")
        # stopped: it has no turn left to tell anything in; the queue is dropped
        rig.router.assert_nothing()
        assert len(hermes.started()) == 1
    finally:
        os.kill(run["child"], signal.SIGKILL)


def test_an_idle_delivery_stops_cleanly(
    hermes: FakeHermes, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    rig = DeliveryRig(hermes.path)
    rig.ref.stop(timeout=5)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert capfd.readouterr().err == ""


def test_an_unknown_message_fails_loudly_naming_delivery_and_the_message(
    hermes: FakeHermes,
) -> None:
    rig = DeliveryRig(hermes.path)
    rig.ref.tell(("no", "such"))
    assert rig.supervisor.expect(ChildFailed) == ChildFailed(
        "delivery", "UnknownMessage: delivery does not take tuple: ('no', 'such')")
    rig.stopped()


# -- a restart is a start: what the store owes is sent, once, in order ----------------

QID_A, QID_B = "01HZY3K4M5N6P7Q8R9S0T1V2WA", "01HZY3K4M5N6P7Q8R9S0T1V2WB"


def owing(tmp_path: Path) -> tuple[Store, list[SendText]]:
    """A store owing two questions' sends (A, then B; a third, delivered, owes none) and
    a late note; the sends in the order owed."""
    store = Store.open(tmp_path / "state-d.sqlite3")
    specs = [question_spec(qid=qid, state=state)
             for qid, state in ((QID_A, None), ("01HZY3K4M5N6P7Q8R9S0T1V2WC", "delivered"),
                                (QID_B, "pending"))]
    for spec in specs:
        store.put_open(spec, owner=f"question:{spec.qid}")
    note = SendText(QID_A, "⚠ late", "late_note", note_id=f"late:{QID_A}:1")
    store.owe_note(note)
    config = bridge_config(target="telegram:1:2")
    return store, [question_send(specs[0], config), question_send(specs[2], config), note]


def test_a_delivery_that_starts_sends_all_the_store_owes_once_in_order(
    hermes: FakeHermes, tmp_path: Path,
) -> None:  # promise 1: a restart is a start
    store, owed = owing(tmp_path)
    rig = DeliveryRig(hermes.path, notes=cast(Any, store), state=store.path)
    assert [rig.router.expect(HermesRan) for _ in range(2)] == [
        HermesRan(owed[0], None), HermesRan(owed[1], None)]
    wait_for(lambda: len(hermes.calls()) == 3, what="the note sent")
    rig.ref.tell(owed[0])  # told again (a question restarted): its outcome is in the store
    assert rig.router.expect(HermesRan) == HermesRan(owed[0], None)
    store.set_state(QID_B, "delivered", owner=f"question:{QID_B}")
    rig.ref.tell(owed[1])  # told again after its question acted: owed no more
    rig.ref.tell(owed[2])  # a note already run
    rig.sync()
    rig.router.assert_nothing()
    assert [argv[-1] for argv in hermes.argvs()] == [job.text for job in owed]
    assert store.owed_notes() == []
    rig.ref.stop()
    store.shutdown()


def test_a_delivery_that_crashes_with_sends_queued_leaves_each_sent_once_in_order(
    hermes: FakeHermes, tmp_path: Path,
) -> None:  # promise 1: its queue is lost with it, and rebuilt from the store
    hermes.configure(sleep=0.5)
    store, owed = owing(tmp_path)
    rig = DeliveryRig(hermes.path, notes=cast(Any, store), state=store.path)
    hermes.wait_started(1)  # A runs; B and the note wait in the queue
    rig.ref.tell(owed[1])  # its sender told it again meanwhile: queued once
    rig.ref.tell(("no", "such"))  # crashes it mid-send
    rig.supervisor.expect(ChildFailed)
    hermes.configure(sleep=0)
    successor = DeliveryRig(hermes.path, notes=cast(Any, store), state=store.path)
    told = [successor.router.expect(HermesRan) for _ in range(2)]
    assert told == [HermesRan(owed[0], None), HermesRan(owed[1], None)]
    wait_for(lambda: store.owed_notes() == [], what="the note sent")
    assert [argv[-1] for argv in hermes.argvs()] == [job.text for job in owed]
    assert len(hermes.started()) == 3
    rig.router.assert_nothing()
    successor.ref.stop()
    store.shutdown()


# -- sends an earlier run left under way --------------------------------------------------


def test_a_send_under_way_at_start_holds_back_every_other_and_is_not_run_again(
    hermes: FakeHermes, tmp_path: Path, capfd: pytest.CaptureFixture[str],
) -> None:  # W20: one at a time, in order, across a restart too; C19: never sent twice
    hermes.configure(sleep=0.5)
    store = Store.open(tmp_path / "state-d.sqlite3")
    note = SendText(QID_A, "✖ a note", "cancel_note", note_id="n1")
    store.owe_note(note)
    first = DeliveryRig(hermes.path, notes=cast(Any, store), state=store.path)
    hermes.wait_started(1)
    first.ref.stop(timeout=2)  # mid-send: hermes runs on
    spec = question_spec(qid=QID_B, state="pending")
    store.put_open(spec, owner=f"question:{QID_B}")  # owed now, and queued first at start
    capfd.readouterr()
    successor = DeliveryRig(hermes.path, notes=cast(Any, store), state=store.path)
    successor.sync()
    assert capfd.readouterr().err == (
        "coms-hermes-bridge: info: delivery: waiting for 1 send(s) under way\n")
    asked = question_send(spec, bridge_config(target="telegram:1:2"))
    assert successor.router.expect(HermesRan) == HermesRan(asked, None)
    runs = hermes.calls()
    assert [run["argv"][-1] for run in runs] == [note.text, asked.text]
    assert runs[0]["end"] <= runs[1]["start"]
    wait_for(lambda: store.owed_notes() == [], what="the note settled from its outcome")
    assert len(hermes.started()) == 2
    successor.ref.stop()
    store.shutdown()


def test_a_send_that_timed_out_unwatched_for_a_question_closed_meanwhile_leaves_nothing(
    hermes: FakeHermes, tmp_path: Path,
) -> None:  # C18, C19: its outcome is taken at start, its files go, nothing is sent again
    hermes.configure(sleep=3)
    store = Store.open(tmp_path / "state-d.sqlite3")
    store.put_open(question_spec(qid=QID_A, state=None), owner=f"question:{QID_A}")
    first = DeliveryRig(hermes.path, send_timeout_ms=300, notes=cast(Any, store),
                        state=store.path)
    hermes.wait_started(1)
    first.ref.stop(timeout=2)  # mid-send: its waiter times hermes out on its own
    wait_for(lambda: under_way(first.sends) == [], what="the send to end unwatched")
    assert store.close(QID_A, "cancelled", owner=f"question:{QID_A}")
    successor = DeliveryRig(hermes.path, send_timeout_ms=300, notes=cast(Any, store),
                            state=store.path)
    successor.sync()
    assert list(successor.sends.iterdir()) == []
    assert len(hermes.started()) == 1
    successor.supervisor.assert_nothing()
    successor.router.assert_nothing()
    successor.ref.stop()
    store.shutdown()


def test_a_send_that_failed_unwatched_is_told_from_its_outcome_and_the_next_runs_at_once(
    hermes: FakeHermes, tmp_path: Path,
) -> None:  # C18: its failure, as hermes said it; C19: not run again; W20: the queue goes on
    hermes.configure(sleep=1, exit=2, stderr="no route")
    store, owed = owing(tmp_path)
    first = DeliveryRig(hermes.path, notes=cast(Any, store), state=store.path)
    hermes.wait_started(1)
    first.ref.stop(timeout=2)  # mid-send: A fails with nobody watching
    wait_for(lambda: under_way(first.sends) == [], what="the send to end unwatched")
    hermes.configure()
    successor = DeliveryRig(hermes.path, notes=cast(Any, store), state=store.path)
    assert [successor.router.expect(HermesRan) for _ in range(2)] == [
        HermesRan(owed[0], "hermes send failed (2): no route"), HermesRan(owed[1], None)]
    wait_for(lambda: store.owed_notes() == [], what="the note sent")
    assert [run["argv"][-1] for run in hermes.started()] == [job.text for job in owed]
    successor.ref.stop()
    store.shutdown()


def test_sends_whose_waiters_left_no_outcome_are_cleared_at_start_and_the_owed_go(
    hermes: FakeHermes, tmp_path: Path,
) -> None:  # promise 1, C19: a waiter killed before (or while) writing leaves no trace of
    # hermes' run: its files go, and what the store owes is sent (at least once)
    store, owed = owing(tmp_path)
    sends = sends_dir(store.path)
    sends.mkdir(mode=0o700)
    lock, _ = send_paths(sends, f"question:{QID_A}")
    lock.touch()
    _, outcome = send_paths(sends, "note:gone")
    outcome.with_name(f"{outcome.name}.tmp").write_text('{"key": "no')
    rig = DeliveryRig(hermes.path, notes=cast(Any, store), state=store.path)
    assert [rig.router.expect(HermesRan) for _ in range(2)] == [
        HermesRan(owed[0], None), HermesRan(owed[1], None)]
    wait_for(lambda: store.owed_notes() == [], what="the note sent")
    rig.sync()
    rig.supervisor.assert_nothing()
    assert list(sends.iterdir()) == []
    assert [argv[-1] for argv in hermes.argvs()] == [job.text for job in owed]
    rig.ref.stop()
    store.shutdown()


def test_a_failed_send_told_again_is_settled_from_its_kept_outcome(
    hermes: FakeHermes, tmp_path: Path,
) -> None:  # C18, C19: hermes ran it once; its failure is what the question is told again
    hermes.configure(exit=2, stderr="no route")
    store = Store.open(tmp_path / "state-d.sqlite3")
    spec = question_spec(qid=QID_A, state=None)
    store.put_open(spec, owner=f"question:{QID_A}")
    rig = DeliveryRig(hermes.path, notes=cast(Any, store), state=store.path)
    asked = question_send(spec, bridge_config(target="telegram:1:2"))
    assert rig.router.expect(HermesRan) == HermesRan(asked, "hermes send failed (2): no route")
    rig.ref.tell(asked)  # told again (its question restarted)
    assert rig.router.expect(HermesRan) == HermesRan(asked, "hermes send failed (2): no route")
    assert len(hermes.started()) == 1
    rig.ref.stop()
    store.shutdown()


def test_a_question_told_again_while_queued_is_sent_and_settled_once(
    hermes: FakeHermes, tmp_path: Path,
) -> None:  # W20, C19: queued once, so its question hears of it once
    hermes.configure(sleep=0.3)
    store, owed = owing(tmp_path)
    rig = DeliveryRig(hermes.path, notes=cast(Any, store), state=store.path)
    hermes.wait_started(1)  # A runs; B and the note wait in the queue
    rig.ref.tell(owed[1])
    rig.ref.tell(owed[1])
    assert [rig.router.expect(HermesRan) for _ in range(2)] == [
        HermesRan(owed[0], None), HermesRan(owed[1], None)]
    wait_for(lambda: store.owed_notes() == [], what="the note sent")
    rig.sync()
    rig.router.assert_nothing()
    assert len(hermes.started()) == 3
    rig.ref.stop()
    store.shutdown()


def test_notes_kept_nowhere_are_each_sent(hermes: FakeHermes) -> None:  # X7
    rig = DeliveryRig(hermes.path)
    rig.send("✖ first", "cancel_note")
    rig.send("✖ second", "cancel_note")
    wait_for(lambda: len(hermes.calls()) == 2, what="both notes sent")
    assert [argv[-1] for argv in hermes.argvs()] == ["✖ first", "✖ second"]


def test_a_note_withdrawn_and_told_again_once_owed_is_sent(hermes: FakeHermes) -> None:
    # X9: withdrawn is checked when it would run; told again, it is queued again
    owed = [False]
    rig = DeliveryRig(hermes.path, notes=Notes(owed=lambda note_id: owed[0]))
    rig.send("⚠ late", "late_note", note_id="n1")
    rig.sync()
    owed[0] = True
    rig.send("⚠ late", "late_note", note_id="n1")
    wait_for(lambda: len(hermes.calls()) == 1, what="the note sent")
    assert [argv[-1] for argv in hermes.argvs()] == ["⚠ late"]


def test_a_send_that_cannot_start_its_waiter_is_the_send_failing(
    hermes: FakeHermes,
) -> None:  # C18: the reason, in its words
    rig = DeliveryRig(hermes.path)
    rig.send("Ship\x00?")  # no argv can carry it
    assert rig.told() == (QID, "hermes send failed: embedded null byte")
    assert hermes.started() == []


def test_a_stop_never_kills_hermes_though_its_waiter_is_wedged_past_every_bound(
    hermes: FakeHermes, monkeypatch: pytest.MonkeyPatch,
) -> None:  # C19: once stopped, nothing of this run acts on the send; its successor takes it
    monkeypatch.setattr(sends_module, "_SLACK_S", 0.2)
    hermes.configure(sleep=2)
    rig = DeliveryRig(hermes.path, send_timeout_ms=1000)
    rig.send("one")
    run = hermes.wait_started(1)[0]
    stat = Path(f"/proc/{run['pid']}/stat").read_text()
    waiter = int(stat[stat.rindex(")") + 2 :].split()[1])  # hermes's parent
    os.kill(waiter, signal.SIGSTOP)
    try:
        rig.ref.stop(timeout=2)
        wait_for(lambda: len(hermes.calls()) == 1, what="hermes to finish its run")
    finally:
        os.kill(waiter, signal.SIGCONT)


@pytest.mark.slow
def test_a_send_under_way_that_never_ends_holds_back_the_rest_for_its_bound_only(
    hermes: FakeHermes, tmp_path: Path,
) -> None:  # W20, bounded: an earlier run's send is waited for its timeout and 10 s more
    store, owed = owing(tmp_path)
    lock, _ = send_paths(sends_dir(store.path), "question:gone")
    lock.parent.mkdir(mode=0o700)
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # a waiter that never ends
        began = time.time()
        rig = DeliveryRig(hermes.path, send_timeout_ms=100, notes=cast(Any, store),
                          state=store.path)
        run = hermes.wait_started(1, timeout=15)[0]
        assert 10.1 <= run["start"] - began < 10.9
        assert run["argv"][-1] == owed[0].text
    rig.ref.stop()
    store.shutdown()


def test_a_file_where_the_sends_directory_goes_fails_each_send_and_crashes_nothing(
    hermes: FakeHermes, tmp_path: Path,
) -> None:  # C18: the reason in its words; the Delivery actor lives on (no crash loop)
    state = tmp_path / "state-d.sqlite3"
    sends_dir(state).write_text("not a directory")
    rig = DeliveryRig(hermes.path, state=state)
    for _ in range(2):
        rig.send("hi")
        qid, error = rig.told()
        assert (qid, error) == (
            QID, f"hermes send failed: {sends_dir(state)} is not a directory")
    assert rig.ref.is_alive() and hermes.started() == []
