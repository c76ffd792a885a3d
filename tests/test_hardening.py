"""The real daemon against ordinary faults: floods, leftovers, limits (issue 9)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from tests.bridge_process import Bridge
from tests.fakes import wait_for

LINE_LIMIT = 64 * 1024


@pytest.fixture
def bridge() -> Iterator[Bridge]:
    b = Bridge()
    yield b
    b.close()


def test_50_mb_of_hermes_stderr_makes_short_lines(bridge: Bridge) -> None:  # issue 9.5, C18, W13
    bridge.hermes.configure(exit=1, flood=50_000_000, stderr="final reason")
    bridge.start()
    qid = bridge.ask("Anyone?")
    env = bridge.asker.response(timeout=30)
    assert env["msg_id"] == qid
    assert env["error"].startswith("hermes send failed (1): ")
    assert env["error"].endswith("final reason")
    assert bridge.asker.line_sizes[qid] < LINE_LIMIT
    bridge.wait_log("delivery_error", qid)
    lines = bridge.log.read_bytes().splitlines(keepends=True)
    assert lines and all(len(line) < LINE_LIMIT for line in lines)


def test_a_child_left_holding_stdout_does_not_delay_delivered(bridge: Bridge) -> None:  # 9.6
    bridge.hermes.configure(spawn=True)  # hermes exits 0, `sleep 30` keeps its pipes
    bridge.start()
    try:
        began = time.monotonic()
        qid = bridge.ask("Deploy?")
        bridge.wait_log("delivered", qid, timeout=5)
        assert time.monotonic() - began < 1.0
        assert bridge.events(qid) == ["question_received", "delivered"]
    finally:
        for run in bridge.hermes.started():
            if run["child"]:
                os.kill(run["child"], signal.SIGKILL)
    wait_for(lambda: bridge.ping()["agent_card"]["queue_depth"] == 1, what="still open")
