"""Sends that outlive the bridge (actors/sends.py): no question is sent twice after a crash
or a stop mid-send, and no outcome is lost (C18, C19)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coms_hermes_bridge.actors import sends
from coms_hermes_bridge.actors.sends import send_paths, sends_dir
from coms_hermes_bridge.actors.store import Store
from coms_hermes_bridge.messages.commands import SendText
from tests.bridge_process import Bridge
from tests.fakes import wait_for
from tests.hermes_fake import FakeHermes
from tests.test_delivery import QID, DeliveryRig, group_alive
from tests.test_question import question_spec

QUESTION = SendText(QID, "❓ [HUB-Q:x] ship?", "question")
KEY = f"question:{QID}"


@pytest.fixture
def hermes(tmp_path: Path) -> FakeHermes:
    return FakeHermes(tmp_path / "bin")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """The state, with the question QID open and pending (its send's outcome is owed)."""
    store = Store.open(tmp_path / "state-d.sqlite3")
    store.put_open(question_spec(qid=QID, state="pending"), owner="question:x:1")
    yield store
    store.shutdown()


def stopped_mid_send(hermes: FakeHermes, store: Store) -> DeliveryRig:
    """A Delivery stopped while hermes runs its question (as a daemon stopped or killed)."""
    rig = DeliveryRig(hermes.path, notes=store, state=store.path)  # type: ignore[arg-type]
    rig.ref.tell(SendText(QID, QUESTION.text, "question", rig.question))
    hermes.wait_started(1)
    rig.ref.stop(timeout=2)
    return rig


def test_a_restart_mid_send_takes_the_outcome_and_never_sends_again(
        hermes: FakeHermes, store: Store) -> None:
    # the successor waits for the send under way, keeps its outcome, and the question told
    # again at start (as the Router tells a pending one) is settled from it: one send
    hermes.configure(sleep=0.5)
    stopped_mid_send(hermes, store)
    assert len(hermes.calls()) == 0  # still running when the successor starts
    rig = DeliveryRig(hermes.path, notes=store, state=store.path)  # type: ignore[arg-type]
    rig.ref.tell(SendText(QID, QUESTION.text, "question", rig.question))
    assert rig.told() == (QID, None)
    assert len(hermes.started()) == 1
    assert store.sent_outcome(KEY) == (None,)  # kept until the question acts on it
    assert list(rig.sends.iterdir()) == []  # the files went once the store had it


def test_a_send_that_failed_while_nobody_watched_is_c18s_error(
        hermes: FakeHermes, store: Store) -> None:
    hermes.configure(sleep=0.3, exit=2, stderr="no route")
    stopped_mid_send(hermes, store)
    wait_for(lambda: len(hermes.calls()) == 1, what="hermes to end on its own")
    rig = DeliveryRig(hermes.path, notes=store, state=store.path)  # type: ignore[arg-type]
    rig.ref.tell(SendText(QID, QUESTION.text, "question", rig.question))
    assert rig.told() == (QID, "hermes send failed (2): no route")
    assert len(hermes.started()) == 1


def test_a_send_under_way_at_start_ends_before_any_other_starts(
        hermes: FakeHermes, store: Store) -> None:
    # one at a time, in order, across a restart too
    hermes.configure(sleep=0.5)
    stopped_mid_send(hermes, store)
    rig = DeliveryRig(hermes.path, notes=store, state=store.path)  # type: ignore[arg-type]
    rig.send("a note meanwhile", "cancel_note", note_id="n1")
    wait_for(lambda: len(hermes.calls()) == 2, what="both runs")
    first, second = hermes.calls()
    assert first["argv"][-1] == QUESTION.text and first["end"] <= second["start"]


def test_a_send_with_no_trace_is_sent_again(hermes: FakeHermes, store: Store) -> None:
    # its waiter killed (or its files lost): the one case sent again, at least once
    lock, outcome = send_paths(sends_dir(store.path), KEY)
    lock.parent.mkdir(mode=0o700)
    lock.write_bytes(b"")  # a lock nobody holds, and no outcome
    rig = DeliveryRig(hermes.path, notes=store, state=store.path)  # type: ignore[arg-type]
    rig.ref.tell(SendText(QID, QUESTION.text, "question", rig.question))
    assert rig.told() == (QID, None)
    assert len(hermes.calls()) == 1
    assert not outcome.exists()


def test_the_questions_next_state_forgets_its_outcome(store: Store) -> None:
    # the store keeps an outcome exactly while what it was sent for is owed, and forgets
    # it in the transaction that acts on it
    store.owe_note(SendText(QID, "✖ note", "cancel_note", note_id="n1"))
    store.record_sent(KEY, None)
    store.record_sent("note:n1", "hermes send failed (1): x")
    store.record_sent("question:OTHER", None)  # nothing open: owed nothing, not kept
    assert store.sent_outcome("question:OTHER") is None
    assert store.sent_outcome("note:n1") == ("hermes send failed (1): x",)
    store.note_sent("n1")
    assert store.sent_outcome("note:n1") is None
    assert store.sent_outcome(KEY) == (None,)
    assert store.set_state(QID, "delivered", owner="question:x:1")
    assert store.sent_outcome(KEY) is None


def test_an_outcome_owed_nothing_any_more_is_forgotten_at_start(store: Store) -> None:
    store.record_sent(KEY, "hermes send failed (1): x")
    assert store.close(QID, "cancelled", owner="question:x:1")  # closed, in one step
    assert store.sent_outcome(KEY) is None
    store.put_open(question_spec(qid=QID, state="pending"), owner="question:x:2")
    store.record_sent(KEY, None)
    store._conn.execute("UPDATE open_questions SET state = 'delivered'")  # as an old file
    store.load()
    assert store.sent_outcome(KEY) is None


# -- the daemon ------------------------------------------------------------------


@pytest.fixture
def bridge() -> Iterator[Bridge]:
    b = Bridge()
    yield b
    b.close()


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM])
def test_no_second_send_after_a_crash_or_stop_mid_send(bridge: Bridge, stop: int) -> None:
    # killed or stopped while hermes runs the question: hermes finishes (its own session),
    # the restarted daemon takes its outcome, the human sees the question once, and the
    # answer still reaches the asker
    bridge.hermes.configure(sleep=1.0)
    bridge.start()
    assert bridge.proc is not None
    qid = bridge.ask("asked once?")
    bridge.hermes.wait_started(1)
    began = time.monotonic()
    bridge.proc.send_signal(stop)
    bridge.proc.wait(timeout=5)
    assert time.monotonic() - began < 1.0  # no waiting on hermes to stop
    assert bridge.hermes.calls() == []  # it was still running
    bridge.start()
    bridge.wait_log("delivered", qid)
    bridge.answer(qid, "yes")
    assert bridge.asker.response()["msg_id"] == qid
    assert [t for t in bridge.sent_texts() if qid in t and t.startswith("❓")] != []
    assert len(bridge.hermes.started()) == 1
    assert [r["event"] for r in bridge.log_records() if r["qid"] == qid].count("delivered") == 1
    assert os.listdir(bridge.bridge_dir / "state-default.sends") == []


def test_a_stalled_waiter_is_killed_past_the_send_timeout_and_hermes_with_it(
        hermes: FakeHermes, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    # C18, bounded: a waiter that stops answering (SIGSTOP) cannot hold Delivery, and the
    # hermes it started (its own session) must not go on to send on its own
    monkeypatch.setattr(sends, "_SLACK_S", 0.5)
    hermes.configure(sleep=30, spawn=True)
    rig = DeliveryRig(hermes.path, notes=store, state=store.path,  # type: ignore[arg-type]
                      send_timeout_ms=300)
    rig.ref.tell(SendText(QID, QUESTION.text, "question", rig.question))
    run = hermes.wait_started(1)[0]
    waiter = int(Path(f"/proc/{run['pid']}/stat").read_text().rsplit(")", 1)[1].split()[1])
    os.kill(waiter, signal.SIGSTOP)
    qid, error = rig.told(timeout=5)
    assert (qid, error) == (QID, "hermes send failed: the send waiter (exit -9) ended "
                                 "without an outcome")
    wait_for(lambda: not group_alive(run["pgid"]), timeout=3, what="hermes' group gone")
    assert list(rig.sends.iterdir()) == []
