"""The questions directory against a real daemon: it heals, stays private, bounds what
it reads, and tells the human when their answer could not be read (X7)."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bridge_process import Bridge, new_qid
from tests.fakes import wait_for

MiB = 1024 * 1024


@pytest.fixture
def bridge() -> Iterator[Bridge]:
    b = Bridge()
    yield b
    b.close()


def vm_hwm_kib(pid: int) -> int:
    """Peak resident set size of a process (VmHWM), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM line")


def sparse(path: Path, size: int) -> None:
    with path.open("wb") as file:
        file.truncate(size)  # 200 MB in no time and no disk


def body(qid: str, **fields: object) -> bytes:
    return json.dumps({"qid": qid, "answer": "ok", "answered_by": "telegram:alice",
                       "at": "2026-11-30T12:01:00.000Z", **fields}).encode()


def test_deleted_directory_heals_without_a_crash_loop(bridge: Bridge) -> None:
    # Eight deletions within two seconds: under the old restart-on-loss this
    # exhausted the restart bound (5 in 10 s) and the daemon exited 1.
    bridge.start("--poll-ms", "200")
    qid = bridge.ask("Still listening?")
    bridge.wait_log("delivered", qid)
    wait_for(bridge.questions.is_dir, what="the questions directory")
    for _ in range(8):
        shutil.rmtree(bridge.questions)
        wait_for(bridge.questions.is_dir, what="the directory made again")
        assert bridge.questions.stat().st_mode & 0o777 == 0o700
        time.sleep(0.25)  # the interval between deletions is the scenario
    assert bridge.proc is not None and bridge.proc.poll() is None
    assert not any("crashed" in line for line in bridge.stderr_lines), bridge.stderr_lines
    assert any("watching it anew (0700)" in line for line in bridge.stderr_lines)
    bridge.answer(qid, "yes")
    env = bridge.asker.response()
    assert (env["msg_id"], env["response"]) == (qid, {"kind": "freeform", "text": "yes"})


def test_directory_is_private_whatever_the_umask(bridge: Bridge) -> None:
    old = os.umask(0)
    try:
        bridge.start()  # the daemon inherits umask 000
    finally:
        os.umask(old)
    # made by the watcher as it starts, or at a later beat if it could not be made then
    wait_for(bridge.questions.is_dir, what="the questions directory")
    assert bridge.questions.stat().st_mode & 0o777 == 0o700


def test_a_looser_directory_is_tightened_at_start(bridge: Bridge) -> None:
    bridge.questions.mkdir(parents=True)
    bridge.questions.chmod(0o777)
    bridge.start()
    line = f"coms-hermes-bridge: {bridge.questions} was mode 0777; tightened to 0700"
    wait_for(lambda: line in bridge.stderr_lines, what="the tightening line")
    assert bridge.questions.stat().st_mode & 0o777 == 0o700


def test_huge_answer_files_are_never_read(bridge: Bridge) -> None:  # X6, X7
    bridge.start()
    qid = bridge.ask("Big?")
    bridge.wait_log("delivered", qid)
    assert bridge.proc is not None
    before = vm_hwm_kib(bridge.proc.pid)
    foreign = new_qid()
    for name in (f"{qid}.answer.json", f"{foreign}.answer.json"):
        sparse(bridge.base / name, 200 * MiB)
        os.rename(bridge.base / name, bridge.questions / name)
    own = bridge.wait_log("answer_rejected", qid)
    assert own["detail"] == {"reason": "invalid_schema", "file": f"{qid}.answer.json",
                             "size": 200 * MiB, "limit": 64 * 1024}
    other = bridge.wait_log("answer_rejected", foreign)  # no bridge knows it (X6)
    assert other["detail"] == {"reason": "foreign_qid", "file": f"{foreign}.answer.json",
                               "size": 200 * MiB, "limit": 64 * 1024}
    grown = vm_hwm_kib(bridge.proc.pid) - before
    assert grown < 64 * 1024, f"peak RSS grew by {grown} KiB"
    bridge.answer(qid, "still open")  # the question is still answerable
    env = bridge.asker.response()
    assert (env["msg_id"], env["response"]) == (qid, {"kind": "freeform", "text": "still open"})


def test_an_unreadable_answer_is_noted_once_and_the_question_stays_open(
    bridge: Bridge,
) -> None:  # X7
    bridge.start()
    qid = bridge.ask("Which one?")
    bridge.wait_log("delivered", qid)
    note = f"⚠ [HUB-Q:{qid}] Your answer could not be read (invalid_schema); please reply again."
    path = bridge.drop(f"{qid}.answer.json", body(qid, answer=5))
    wait_for(lambda: note in bridge.sent_texts(), what="the ⚠ note")
    wait_for(lambda: not path.exists(), what="the malformed file removed")
    path = bridge.drop(f"{qid}.answer.json", body(qid, answered_by=""))  # again, within the minute
    wait_for(lambda: len([r for r in bridge.log_records() if r["event"] == "answer_rejected"]) == 2,
             what="the second rejection")
    assert bridge.ping()["agent_card"]["queue_depth"] == 1
    bridge.answer(qid, "the first")
    env = bridge.asker.response()
    assert (env["msg_id"], env["response"]) == (qid, {"kind": "freeform", "text": "the first"})
    bridge.wait_log("answered", qid)
    assert bridge.sent_texts().count(note) == 1
