"""The systemd user unit and its installer."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from coms_hermes_bridge.actors.registry import EXIT_ALREADY_RUNNING
from tests.bridge_process import ROOT

TEMPLATE = ROOT / "contrib" / "systemd" / "coms-hermes-bridge@.service"
INSTALLER = ROOT / "scripts" / "install_service.py"


def settings(text: str) -> dict[str, list[str]]:
    """Every `Key=value` of a unit file, repeated keys kept in order."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")) and "=" in line:
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


def test_unit_promises_notify_watchdog_restart_and_hardening() -> None:
    unit = settings(TEMPLATE.read_text())
    assert unit["Type"] == ["notify"]
    assert unit["NotifyAccess"] == ["main"]
    assert unit["WatchdogSec"] == ["30s"]
    assert unit["Restart"] == ["on-failure"]
    assert unit["RestartPreventExitStatus"] == [str(EXIT_ALREADY_RUNNING)]  # X13
    # promise 2: a daemon that gave up (exit 1) comes back for as long as it takes, later
    # and later, never a tight loop and never out of restarts
    assert (unit["RestartSec"], unit["RestartSteps"], unit["RestartMaxDelaySec"]) == (
        ["1s"], ["10"], ["5min"])
    assert unit["StartLimitIntervalSec"] == ["0"] and "StartLimitBurst" not in unit
    assert unit["KillMode"] == ["process"]  # a send under way outlives a stop
    assert unit["NoNewPrivileges"] == ["yes"]
    assert unit["ProtectSystem"] == ["strict"]
    assert "%h/.pi" in unit["ReadWritePaths"]
    assert unit["PrivateTmp"] == ["yes"]
    assert unit["ExecStart"] == [
        "%h/.local/bin/coms-hermes-bridge --project %i $COMS_HERMES_BRIDGE_FLAGS"
    ]
    assert unit["EnvironmentFile"] == ["%E/coms-hermes-bridge/%i.env"]


def install(home: Path, *args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CONFIG_HOME", "PI_COMS_DIR")}
    env.update(HOME=str(home))
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        [sys.executable, str(INSTALLER), *args],
        capture_output=True, text=True, timeout=30, env=env, check=False,
    )


def fake_hermes(directory: Path) -> Path:
    directory.mkdir(parents=True)
    hermes = directory / "hermes"
    hermes.write_text("#!/bin/sh\nexit 0\n")
    hermes.chmod(0o755)
    return directory


def test_install_writes_the_unit_and_the_instance_settings(tmp_path: Path) -> None:
    # `just install-service PROJECT --to ...` (here without systemctl)
    home = tmp_path / "home"
    home.mkdir()
    tools = fake_hermes(tmp_path / "tools")
    command = ROOT / ".venv" / "bin" / "coms-hermes-bridge"
    done = install(
        home, "acme", "--to", "telegram:-100123:7", "--timeout", "600000",
        "--bin", str(command), "--no-enable", path=f"{tools}:{os.environ['PATH']}",
    )
    assert done.returncode == 0, done.stderr
    unit_path = home / ".config" / "systemd" / "user" / "coms-hermes-bridge@.service"
    env_path = home / ".config" / "coms-hermes-bridge" / "acme.env"
    assert done.stdout.splitlines() == [
        f"installed {unit_path} (runs {command})",
        f"wrote {env_path}",
        "not enabled; to start it: systemctl --user enable --now coms-hermes-bridge@acme.service",
    ]
    unit = settings(unit_path.read_text())
    assert unit["ExecStart"] == [f"{command} --project %i $COMS_HERMES_BRIDGE_FLAGS"]
    assert unit["Type"] == ["notify"]
    assert settings(env_path.read_text()) == {
        "COMS_HERMES_BRIDGE_FLAGS": ["--to telegram:-100123:7 --timeout 600000"],
        "PATH": [f"{tools}:/usr/local/bin:/usr/bin:/bin"],  # where hermes was found
    }
    assert env_path.stat().st_mode & 0o777 == 0o600
    assert (home / ".pi").is_dir()  # ReadWritePaths= needs it to exist


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--to", "a", "--to", "b"], "install-service: --to may only be specified once"),
        (["--to", "telegram:"], "install-service: --to 'telegram:' has nothing after the colon: "
         "give the chat, or telegram alone for hermes' home channel"),
        (["--questions-dir", "/no-such-dir-chb/q"], "install-service: --questions-dir "
         "/no-such-dir-chb/q: its parent /no-such-dir-chb is not a directory"),
        (["--bogus"], "install-service: unrecognized arguments: --bogus"),
        (["--project", "x"], "install-service: the project is the instance name; do not pass --project"),
        (["--questions-dir", "/a b"], "install-service: flag '/a b' has a space, quote, backslash, % or $;"
         " put such a value in a drop-in (systemctl --user edit) instead"),
    ],
)
def test_install_refuses_what_the_daemon_would(tmp_path: Path, flags: list[str], message: str) -> None:
    done = install(tmp_path, "acme", *flags, "--no-enable")
    assert (done.returncode, done.stderr) == (1, message + "\n")
    assert not (tmp_path / ".config").exists()


def test_install_warns_as_the_daemon_will_and_installs(tmp_path: Path) -> None:
    done = install(tmp_path, "acme", "--to", "whatsapp:+15551234567", "--bin", sys.executable,
                   "--no-enable")
    assert (done.returncode, done.stderr) == (0, (
        "install-service: warning: --to whatsapp:+15551234567: answers come back only from "
        "Telegram (the liaison listens there alone); answer other questions with "
        "`coms-hermes-bridge answer`\n"))
    assert (tmp_path / ".config" / "coms-hermes-bridge" / "acme.env").is_file()


def test_install_refuses_a_bad_project(tmp_path: Path) -> None:
    done = install(tmp_path, "../x", "--no-enable")
    assert (done.returncode, done.stderr) == (1, 'install-service: invalid project name: "../x"\n')


def test_installed_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    # the unit as installed, checked by systemd itself
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (.ci/run installs it where it can)")
    home = tmp_path / "home"
    home.mkdir()
    command = ROOT / ".venv" / "bin" / "coms-hermes-bridge"
    done = install(home, "acme", "--to", "telegram:42", "--bin", str(command), "--no-enable")
    assert done.returncode == 0, done.stderr
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = {
        **os.environ,
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_RUNTIME_DIR": str(runtime),
        "SYSTEMD_LOG_COLOR": "0",
    }
    verify = subprocess.run(
        [analyze, "--user", "--man=no", "verify", "coms-hermes-bridge@acme.service"],
        capture_output=True, text=True, timeout=60, env=env, check=False, cwd=str(tmp_path),
    )
    if verify.returncode != 0 and "Failed to initialize manager" in verify.stderr:
        pytest.skip(f"systemd-analyze cannot run here: {verify.stderr.strip()}")
    # systemd only warns about unknown keys or bad values; any line about our unit is a
    # fault, but for the growing delay's keys on a systemd older than 254 (a fixed delay)
    assert verify.returncode == 0, verify.stderr
    newer = ("Unknown key 'RestartSteps'", "Unknown key 'RestartMaxDelaySec'")
    faults = [line for line in verify.stderr.splitlines()
              if "coms-hermes-bridge" in line and not any(key in line for key in newer)]
    assert not faults, verify.stderr


@pytest.mark.slow
def test_the_unit_under_a_real_user_manager() -> None:
    # the shipped unit, installed by the installer, run by systemd 252's own
    # user manager: READY, a question answered, SIGKILL -> restarted, stop -> exit 0
    manager = Path("/lib/systemd/systemd")
    if os.geteuid() != 0 or not manager.exists() or shutil.which("unshare") is None:
        pytest.skip("needs root, util-linux unshare and systemd (a private mount namespace "
                    "lets systemd --user run on a host that did not boot with systemd)")
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable,
         str(ROOT / "tests" / "systemd_drill.py"), str(ROOT)],
        capture_output=True, text=True, timeout=150, stdin=subprocess.DEVNULL, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert "error" not in seen, seen
    assert seen["install"][0] == 0, seen["install"]
    assert (seen["started"]["ActiveState"], seen["started"]["SubState"]) == ("active", "running")
    assert seen["ack"]["type"] == "ack"
    assert seen["hermes_argv"] == ["send", "--to", "telegram:42"]
    assert seen["restarted"]["NRestarts"] == "1"  # Restart=on-failure after the SIGKILL
    assert seen["restarted"]["MainPID"] != seen["started"]["MainPID"]
    assert seen["response"] == [True, {"kind": "freeform", "text": "from systemd"}, None]
    assert seen["stop"] == 0
    assert (seen["stopped"]["ActiveState"], seen["stopped"]["Result"],
            seen["stopped"]["ExecMainStatus"]) == ("inactive", "success", "0")  # exit 0 (W8)
    assert seen["entry_left"] is False
