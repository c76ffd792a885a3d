"""One bridge per project and name (X13), with real daemons sharing one home and pool."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from coms_hermes_bridge.actors.registry import (
    EXIT_ALREADY_RUNNING,
)
from tests.bridge_process import ROOT, Bridge
from tests.fakes import wait_for


@pytest.fixture
def bridge() -> Iterator[Bridge]:
    b = Bridge()
    yield b
    b.close()


def agents(bridge: Bridge, project: str = "acc") -> dict[str, int]:
    """The registry's entries of the project: name -> pid."""
    directory = bridge.coms / "projects" / project / "agents"
    return {p.stem: json.loads(p.read_text())["pid"] for p in sorted(directory.glob("*.json"))}


def refused_line(bridge: Bridge, pid: int) -> str:
    return (f"coms-hermes-bridge: error: user-remote@acc already has a bridge running (pid {pid}); not starting a second "
            f"one (lock {bridge.coms / 'hermes-bridge' / 'locks' / 'acc@user-remote.lock'})")


def test_a_second_bridge_refuses_and_the_firsts_answers_are_kept(bridge: Bridge) -> None:
    # X13: the audit's reproduction. A acks five prompts and is paused while the human's
    # answers are written; B, for the same project, starts meanwhile (whatever its
    # --questions-dir). B refuses at once, naming A, and neither registers nor touches the
    # state: A, resumed, answers every asker.
    bridge.start("--project", "acc")
    assert bridge.proc is not None
    qids = [bridge.ask(f"question {n}") for n in range(5)]
    for qid in qids:
        bridge.wait_log("delivered", qid)
    state = bridge.state_path("acc")
    bridge.proc.send_signal(signal.SIGSTOP)
    pid = bridge.proc.pid
    wait_for(lambda: Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T",
             what="A stopped")
    before = state.stat().st_mtime_ns, Path(f"{state}-wal").stat().st_size
    try:
        for qid in qids:
            bridge.answer(qid, f"answer to {qid}")
        for questions_dir in (None, bridge.base / "elsewhere" / "questions"):
            flags = ["--project", "acc"]
            if questions_dir is not None:
                questions_dir.parent.mkdir()
                flags += ["--questions-dir", str(questions_dir)]
            second = bridge.run(*flags)
            assert second.returncode == EXIT_ALREADY_RUNNING
            assert second.stderr.splitlines() == [refused_line(bridge, bridge.proc.pid)]
            assert agents(bridge) == {"user-remote": bridge.proc.pid}  # never registered
            assert not (bridge.base / "elsewhere" / "state-acc.sqlite3").exists()
        assert (state.stat().st_mtime_ns, Path(f"{state}-wal").stat().st_size) == before
        assert all((bridge.questions / f"{qid}.answer.json").exists() for qid in qids)
    finally:
        bridge.proc.send_signal(signal.SIGCONT)
    got = {bridge.asker.response()["msg_id"] for _ in qids}
    assert got == set(qids)
    assert [r for r in bridge.log_records() if r["event"] == "answer_rejected"] == []


def test_another_name_in_the_same_project_is_another_peer(bridge: Bridge) -> None:
    # X13: a bridge with another --name is another peer, with state of its own
    bridge.start("--project", "acc")
    assert bridge.proc is not None
    other = subprocess.Popen(
        [sys.executable, "-m", "coms_hermes_bridge", "--project", "acc", "--name", "night"],
        cwd=str(ROOT), env=bridge.env(), stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: "night" in agents(bridge), what="the second name registered")
        assert agents(bridge) == {"night": other.pid, "user-remote": bridge.proc.pid}
        assert bridge.bridge_dir.joinpath("state-acc@night.sqlite3").is_file()
        assert bridge.state_path("acc").is_file()
    finally:
        other.send_signal(signal.SIGTERM)
        assert other.wait(timeout=10) == 0


def test_a_killed_bridges_lock_goes_with_it(bridge: Bridge) -> None:
    # X13 and W10: a restart right after SIGKILL takes the lock and the name back at once
    bridge.start("--project", "acc")
    qid = bridge.ask("still here after a kill?")
    bridge.wait_log("delivered", qid)
    bridge.kill()
    bridge.start("--project", "acc")
    assert bridge.proc is not None
    assert agents(bridge) == {"user-remote": bridge.proc.pid}
    bridge.answer(qid, "yes")
    assert bridge.asker.response()["msg_id"] == qid


def test_bridges_started_at_the_same_instant_make_one_peer(bridge: Bridge) -> None:
    # X13: of bridges started together exactly one runs; never two live entries
    for trial in range(3):
        start_together(bridge, trial)


def start_together(bridge: Bridge, trial: int) -> None:
    procs = [subprocess.Popen(
        [sys.executable, "-m", "coms_hermes_bridge", "--project", "acc"],
        cwd=str(ROOT), env=bridge.env(), stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    try:
        wait_for(lambda: sum(p.poll() is not None for p in procs) == 2, 20,
                 f"two of three refused (trial {trial})")
        refused = [p for p in procs if p.poll() is not None]
        (running,) = [p for p in procs if p.poll() is None]
        for p in refused:
            assert p.returncode == EXIT_ALREADY_RUNNING
            assert p.stderr is not None
            assert p.stderr.read().splitlines() == [refused_line(bridge, running.pid)]
        wait_for(lambda: agents(bridge) == {"user-remote": running.pid}, 10,
                 "the one bridge registered")
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                assert p.wait(timeout=10) == 0
