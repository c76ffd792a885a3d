"""The daemon under a service manager, as a process: sd_notify, stderr lines with their
levels, the dev script. (The link itself: test_service_link.py.)"""

from __future__ import annotations

import re
import signal
import subprocess
from collections.abc import Iterator

import pytest

from tests.bridge_process import ROOT, Bridge
from tests.fakes import NotifySocket


@pytest.fixture
def bridge() -> Iterator[Bridge]:
    b = Bridge()
    yield b
    b.close()


def test_sd_notify_ready_watchdog_stopping(bridge: Bridge) -> None:
    # READY=1 after the registry entry exists, WATCHDOG=1 at half of
    # WATCHDOG_USEC (>= 2 in 2.5 s at 1 s), STATUS= with the open count, STOPPING=1 on SIGTERM
    notify = NotifySocket(bridge.base / "notify.sock")
    try:
        bridge.start(wait=False, NOTIFY_SOCKET=str(notify.path), WATCHDOG_USEC="1000000")
        at, ready = notify.until("READY=1")
        assert bridge.entry_path().exists()  # the entry came first (W7)
        bridge.wait_ready()
        assert ready.split("\n") == ["READY=1", "STATUS=0 open questions"]
        qid = bridge.ask("Still there?")
        bridge.wait_log("delivered", qid)
        pings: list[tuple[float, str]] = []
        while len(pings) < 2:
            pings.append(notify.until("WATCHDOG=1", timeout=2.5))
        assert pings[1][0] - at <= 2.5
        last = notify.until("WATCHDOG=1", timeout=2.5)[1]
        assert last.split("\n") == ["WATCHDOG=1", "STATUS=1 open question"]
        assert bridge.signal(signal.SIGTERM) == 0
        _, stopping = notify.until("STOPPING=1", timeout=1.0)
        assert stopping.split("\n")[0] == "STOPPING=1"
    finally:
        notify.close()


@pytest.mark.slow  # seconds of real time: in `just test-slow`
def test_operator_lines_carry_a_level(bridge: Bridge) -> None:
    # start, ready, stop, a delivery error, a rejected answer file, each one line
    bridge.hermes.configure(exit=3, stderr="chat not found\n")
    bridge.start()
    qid = bridge.ask("Anyone?")
    bridge.asker.response()
    bridge.drop("notes.txt", b"hello")
    bridge.wait_log("answer_rejected")
    assert bridge.signal() == 0
    lines = bridge.stderr_lines
    assert lines[0] == ("coms-hermes-bridge: info: starting as peer user-remote in coms project "
                        "default (agents must use this project to ask), hermes target telegram")
    assert lines[1].startswith("coms-hermes-bridge: info: ready: user-remote@default at ")
    assert re.search(r", [01] open question\(s\)$", lines[1])  # the asker may be first
    assert (
        f"coms-hermes-bridge: error: question for {qid} not delivered:"
        " hermes send failed (3): chat not found"
    ) in lines
    assert "coms-hermes-bridge: warning: rejected answer file notes.txt: invalid_path" in lines
    assert lines[-1] == "coms-hermes-bridge: info: stopping on SIGTERM (exit 0)"


def test_scripts_dev_run_ends_with_the_daemons_own_status(bridge: Bridge) -> None:
    # `scripts/dev run` becomes the daemon (exec), so SIGTERM to what was
    # started is SIGTERM to the daemon, and its exit 0 is the status (not just's 143)
    bridge.start(command=(str(ROOT / "scripts" / "dev"), "run"))
    assert bridge.proc is not None and bridge.entry["pid"] == bridge.proc.pid
    assert bridge.signal(signal.SIGTERM, timeout=10) == 0
    assert bridge.stderr_lines[-1] == "coms-hermes-bridge: info: stopping on SIGTERM (exit 0)"


def test_scripts_dev_without_a_recipe_lists_them(bridge: Bridge) -> None:
    # no argument prints the recipes instead of starting the daemon
    done = subprocess.run(
        [str(ROOT / "scripts" / "dev")], capture_output=True, text=True, timeout=120,
        env=bridge.env(), stdin=subprocess.DEVNULL, check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "usage: scripts/dev <recipe> [args...]"
    recipes = {line.split()[0] for line in lines[2:] if line.startswith("    ")}
    assert {"run", "test", "check", "install-service"} <= recipes
    assert not bridge.coms.exists()  # nothing was started or registered


def test_help_lists_the_environment_the_daemon_reads(bridge: Bridge) -> None:
    done = bridge.run("--help")
    assert done.returncode == 0
    for name in ("HOME", "PI_COMS_DIR", "PI_COMS_TIMEOUT_MS", "NOTIFY_SOCKET", "WATCHDOG_USEC",
                 "JOURNAL_STREAM", "COMS_HERMES_BRIDGE_HEARTBEAT_MS", "COMS_HERMES_BRIDGE_REOFFER_MS",
                 "COMS_HERMES_BRIDGE_DEBUG"):
        assert f"\n  {name}" in done.stdout, name
    assert "status [--project P] [--json]" in done.stdout and "SIGTERM" in done.stdout
