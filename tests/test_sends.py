"""Sends that outlive the bridge (actors/sends.py): no question is sent twice after a crash
or a stop mid-send, and no outcome is lost (C18, C19)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import re
import signal
import stat
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coms_hermes_bridge.actors import sends
from coms_hermes_bridge.actors.delivery import question_send
from coms_hermes_bridge.actors.sends import send_paths, sends_dir
from coms_hermes_bridge.actors.store import Store
from coms_hermes_bridge.messages.commands import SendText
from tests.bridge_process import Bridge
from tests.fakes import bridge_config, wait_for
from tests.hermes_fake import FakeHermes
from tests.test_delivery import QID, DeliveryRig, group_alive
from tests.test_question import question_spec

# what a Delivery's start queues for the pending question QID, and its Router tells again
QUESTION = question_send(question_spec(qid=QID, state="pending"),
                         bridge_config(target="telegram:1:2"))
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
    rig.ref.tell(QUESTION)
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
    rig.ref.tell(QUESTION)
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
    rig.ref.tell(QUESTION)
    assert rig.told() == (QID, "hermes send failed (2): no route")
    assert len(hermes.started()) == 1


def test_a_send_under_way_at_start_ends_before_any_other_starts(
        hermes: FakeHermes, store: Store) -> None:
    # one at a time, in order, across a restart too
    hermes.configure(sleep=0.5)
    stopped_mid_send(hermes, store)
    store.owe_note(SendText(QID, "a note meanwhile", "cancel_note", note_id="n1"))
    DeliveryRig(hermes.path, notes=store, state=store.path)  # type: ignore[arg-type]
    wait_for(lambda: len(hermes.calls()) == 2, what="both runs")
    first, second = hermes.calls()
    assert first["argv"][-1] == QUESTION.text and first["end"] <= second["start"]


def test_a_send_with_no_trace_is_sent_again(hermes: FakeHermes, store: Store) -> None:
    # its waiter killed (or its files lost): the one case sent again, at least once
    lock, outcome = send_paths(sends_dir(store.path), KEY)
    lock.parent.mkdir(mode=0o700)
    lock.write_bytes(b"")  # a lock nobody holds, and no outcome
    rig = DeliveryRig(hermes.path, notes=store, state=store.path)  # type: ignore[arg-type]
    rig.ref.tell(QUESTION)
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
    status = bridge.proc.wait(timeout=5)
    assert time.monotonic() - began < 1.0  # no waiting on hermes to stop
    assert status == (0 if stop == signal.SIGTERM else -signal.SIGKILL)
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
    rig.ref.tell(QUESTION)
    run = hermes.wait_started(1)[0]
    waiter = int(Path(f"/proc/{run['pid']}/stat").read_text().rsplit(")", 1)[1].split()[1])
    os.kill(waiter, signal.SIGSTOP)
    try:
        qid, error = rig.told(timeout=5)
        assert (qid, error) == (QID, "hermes send failed: the send waiter (exit -9) ended "
                                     "without an outcome")
        wait_for(lambda: not group_alive(run["pgid"]), timeout=3, what="hermes' group gone")
        assert list(rig.sends.iterdir()) == []
    finally:  # never leave a stopped waiter behind, whatever failed
        for pid, kill in ((waiter, os.kill), (run["pgid"], os.killpg)):
            with contextlib.suppress(ProcessLookupError):
                kill(pid, signal.SIGKILL)


# -- the pieces (actors/sends.py) ---------------------------------------------------


def test_a_send_is_known_by_its_question_or_its_note() -> None:
    assert sends.send_key(QUESTION) == f"question:{QID}"
    assert sends.send_key(SendText(QID, "✖", "cancel_note", note_id="c:1")) == "note:c:1"
    assert sends.send_key(SendText(QID, "⚠", "unreadable_note")) is None  # X7: kept nowhere
    assert sends.sends_dir(Path("/s/state-acc.sqlite3")) == Path("/s/state-acc.sends")


def test_a_sends_files_are_named_by_a_hash_of_its_key(tmp_path: Path) -> None:
    lock, outcome = send_paths(tmp_path, KEY)
    stem = hashlib.sha256(KEY.encode()).hexdigest()[:32]
    assert (lock, outcome) == (tmp_path / f"{stem}.lock", tmp_path / f"{stem}.outcome")
    assert send_paths(tmp_path, "note:\udc00")[0].name.endswith(".lock")  # never raises


def hold(path: Path) -> int:
    """A waiter's hold on a send's lock (another open file description)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def write_outcome(path: Path, key: str = KEY, code: int | None = 0) -> None:
    path.write_text(json.dumps({"key": key, "returncode": code, "error": None,
                                "stdout": "out", "stderr": "err"}))


def test_held_locks_are_under_way_and_the_rest_finished(tmp_path: Path) -> None:
    keys = [f"question:{n}" for n in range(5)]
    (held_lock, _), (done_lock, done), (_, orphan), (tmp_lock, _), (gone_lock, _) = (
        send_paths(tmp_path, key) for key in keys)
    fd = hold(held_lock)
    try:
        done_lock.write_bytes(b"")
        write_outcome(done, keys[1])
        write_outcome(orphan, keys[2], 3)  # its lock went first
        partial = tmp_lock.with_name(tmp_lock.stem + ".outcome.tmp")  # a waiter killed writing
        partial.write_text("{")
        gone_lock.write_bytes(b"")  # no outcome: no trace
        assert sends.under_way(tmp_path) == [held_lock]
        seen = {paths[0].name: (outcome.key if outcome else None, outcome and
                                outcome.result.returncode) for outcome, *paths in
                sends.finished(tmp_path)}
        assert seen == {done_lock.name: (keys[1], 0), orphan.with_suffix(".lock").name:
                        (keys[2], 3), tmp_lock.name: (None, None), gone_lock.name: (None, None)}
    finally:
        os.close(fd)
    assert sends.under_way(tmp_path) == []


def test_an_unreadable_outcome_is_said_and_dropped(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    _, outcome = send_paths(tmp_path, KEY)
    outcome.write_text('{"key": "k"}')
    assert [o for o, *_ in sends.finished(tmp_path)] == [None]
    assert capfd.readouterr().err == (
        f"coms-hermes-bridge: warning: send outcome {outcome} is unreadable "
        "(KeyError('returncode')); dropped it\n")


@pytest.mark.parametrize(("text", "pid"), [(b"123\n", 123), (b"1\n", 1), (b"", None),
                                           (b"0\n", None), (b"x1\n", None), (b"-5\n", None),
                                           (b"\xff7\n", None), (None, None),
                                           (b"123" + b" " * 29 + b"\n", None)])
def test_the_hermes_pid_a_waiter_wrote(tmp_path: Path, text: bytes | None,
                                       pid: int | None) -> None:
    # (None: no lock file at all; past 32 bytes it is no pid a waiter wrote)
    lock = tmp_path / "a.lock"
    if text is not None:
        lock.write_bytes(text)
    assert sends._hermes_pid(lock) == pid


def test_waiting_for_sends_under_way_ends_when_they_do_or_at_the_limit(tmp_path: Path) -> None:
    lock = tmp_path / "a.lock"
    fd = hold(lock)
    try:
        assert asyncio.run(sends.wait_done([lock], 0.1)) is False
    finally:
        os.close(fd)
    assert asyncio.run(sends.wait_done([lock], 0.1)) is True


class CoarseLoop(asyncio.SelectorEventLoop):
    """A loop on a clock that ticks once a second (as a coarse clock does), from 0."""

    def __init__(self) -> None:
        self._zero = time.monotonic()
        super().__init__()

    def time(self) -> float:
        return float(int(time.monotonic() - self._zero))


def test_waiting_ends_at_the_limit_even_on_a_clock_that_has_not_moved(tmp_path: Path) -> None:
    # C18, bounded: the limit reached is the end, not the tick after it
    lock = tmp_path / "a.lock"
    fd = hold(lock)
    try:
        with asyncio.Runner(loop_factory=CoarseLoop) as runner:
            began = time.monotonic()
            assert runner.run(sends.wait_done([lock], 0)) is False
            assert time.monotonic() - began < 0.5
    finally:
        os.close(fd)


def test_a_link_planted_among_the_locks_is_never_followed(tmp_path: Path) -> None:
    # a symlink is no send under way, whatever it points at (files.py: links never followed)
    held = tmp_path / "elsewhere.lock"
    fd = hold(held)
    try:
        (tmp_path / "sends").mkdir()
        (tmp_path / "sends" / "planted.lock").symlink_to(held)
        assert sends.under_way(tmp_path / "sends") == []
    finally:
        os.close(fd)


def test_a_send_whose_waiter_still_runs_is_waited_for_not_started_again(
        tmp_path: Path, hermes: FakeHermes) -> None:
    # a crashed Delivery's send still under way: its successor takes that run's outcome
    lock, outcome = send_paths(tmp_path, KEY)
    fd = hold(lock)

    def finish() -> None:
        write_outcome(outcome, code=4)
        os.close(fd)

    threading.Timer(0.2, finish).start()
    got = asyncio.run(sends.run_send(tmp_path, KEY, [str(hermes.path), "x"], 5))
    assert (got.key, got.result.returncode) == (KEY, 4)
    assert hermes.started() == []


def test_a_send_whose_waiter_overruns_is_failed_and_its_files_left_to_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hermes: FakeHermes) -> None:
    monkeypatch.setattr(sends, "_SLACK_S", 0.1)
    lock, _ = send_paths(tmp_path, KEY)
    fd = hold(lock)
    try:
        with pytest.raises(sends.WaiterFailed,
                           match=r"^its earlier waiter is still running past the send timeout$"):
            asyncio.run(sends.run_send(tmp_path, KEY, [str(hermes.path), "x"], 0.1))
        assert lock.exists()
    finally:
        os.close(fd)
    assert hermes.started() == []


def test_an_outcome_not_yet_taken_is_taken_not_sent_again(
        tmp_path: Path, hermes: FakeHermes) -> None:
    _, outcome = send_paths(tmp_path, KEY)
    write_outcome(outcome, code=0)
    got = asyncio.run(sends.run_send(tmp_path, KEY, [str(hermes.path), "x"], 5))
    assert got.result == sends.ProcessResult(0, "out", "err")
    assert hermes.started() == []


def test_a_waiter_that_leaves_no_outcome_is_a_failure_and_its_lock_goes(tmp_path: Path) -> None:
    lock, outcome = send_paths(tmp_path, KEY)
    lock.write_bytes(b"")
    with pytest.raises(sends.WaiterFailed, match=r"^the send waiter ended without an outcome$"):
        sends._outcome(lock, outcome, "the send waiter")
    assert not lock.exists()


def test_the_waiter_is_started_isolated_in_a_session_of_its_own_with_no_stdin(
        tmp_path: Path, hermes: FakeHermes) -> None:
    hermes.configure(stdout="said")
    got = asyncio.run(sends.run_send(tmp_path, KEY, [str(hermes.path), "x"], 5))
    assert got.result == sends.ProcessResult(0, "said", "")
    run = hermes.started()[0]
    assert run["pgid"] == run["pid"]  # hermes leads its own group
    lock, outcome = send_paths(tmp_path, KEY)
    assert sends._hermes_pid(lock) == run["pid"]  # written for a kill past the timeout
    assert outcome.exists() and not sends._held(lock)
    assert stat.S_IMODE(tmp_path.stat().st_mode) & 0o077 == 0


def test_the_waiter_keeps_none_of_the_bridges_stdin_or_stdout(tmp_path: Path) -> None:
    # it outlives the bridge: a pipe the bridge was given must not stay open in it
    show = ("import os; p = os.getppid(); "
            "print(os.readlink(f'/proc/{p}/fd/0'), os.readlink(f'/proc/{p}/fd/1'))")
    read, write = os.pipe()
    saved = os.dup(0), os.dup(1)
    try:
        os.dup2(read, 0)
        os.dup2(write, 1)
        got = asyncio.run(sends.run_send(tmp_path, KEY, [sys.executable, "-c", show], 5))
    finally:
        for fd, was in enumerate(saved):
            os.dup2(was, fd)
            os.close(was)
        os.close(read)
        os.close(write)
    assert got.result == sends.ProcessResult(0, "/dev/null /dev/null\n", "")


NO_GROUP = 4194305  # above any pid_max: no process group has it


@pytest.mark.parametrize(("refusal", "stuck", "said"), [
    (None, False, "(exit -9) ended without an outcome"),  # hermes' group is gone already
    (PermissionError, False, "(exit -9) ended without an outcome"),  # its pid now another's
    (None, True, "(exit None) is still running past the send timeout")])  # kill never takes
def test_a_stalled_waiter_is_failed_whatever_its_kill_meets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refusal: type[OSError] | None,
        stuck: bool, said: str) -> None:
    # C18, bounded: hermes writes a pid no group has over its own and stops its waiter;
    # past the timeout run_send fails the send within its bound, whatever the kills say
    monkeypatch.setattr(sends, "_SLACK_S", 0.3)
    lock, _ = send_paths(tmp_path, KEY)
    ppid = tmp_path / "waiter.pid"
    hermes = (
        "import os, pathlib, signal, time\n"
        f"lock, end = pathlib.Path({str(lock)!r}), time.monotonic() + 5\n"
        "while lock.read_text() != f'{os.getpid()}\\n' and time.monotonic() < end:\n"
        "    time.sleep(0.01)\n"
        f"lock.write_text('{NO_GROUP}\\n')\n"
        f"pathlib.Path({str(ppid)!r}).write_text(str(os.getppid()))\n"
        "os.kill(os.getppid(), signal.SIGSTOP)\n")
    real = os.killpg

    def killpg(pid: int, sig: int) -> None:
        if pid == NO_GROUP and refusal is not None:
            raise refusal(1, "Operation not permitted")
        if not (stuck and pid != NO_GROUP):
            real(pid, sig)

    monkeypatch.setattr(sends.os, "killpg", killpg)
    try:
        with pytest.raises(sends.WaiterFailed, match=f"^the send waiter {re.escape(said)}$"):
            asyncio.run(asyncio.wait_for(
                sends.run_send(tmp_path, KEY, [sys.executable, "-c", hermes], 0.2), 5))
    finally:  # never leave a stopped waiter behind, whatever failed
        if ppid.exists():
            with contextlib.suppress(ProcessLookupError):
                real(int(ppid.read_text()), signal.SIGKILL)
