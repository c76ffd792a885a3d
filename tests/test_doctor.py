"""`coms-hermes-bridge doctor` end to end: the real daemon, a fake hermes."""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from coms_hermes_bridge.actors.config import parse_config
from coms_hermes_bridge.doctor import UNIT, check_service, hermes_home
from tests.bridge_process import Bridge


@pytest.fixture
def bridge() -> Iterator[Bridge]:
    b = Bridge()
    yield b
    b.close()


def doctor(bridge: Bridge, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    # No user manager to ask (an empty runtime dir): the service line is "–" on any host.
    runtime = bridge.base / "run"
    runtime.mkdir(exist_ok=True)
    return bridge.verb("doctor", *args, XDG_RUNTIME_DIR=str(runtime), **env)


def skill(bridge: Bridge, home: Path | None = None) -> Path:
    path = (home or bridge.home / ".hermes") / "skills" / "hub-liaison" / "SKILL.md"
    path.parent.mkdir(parents=True)
    path.write_text("---\nname: hub-liaison\n---\n")
    return path


def marks(done: subprocess.CompletedProcess[str]) -> dict[str, str]:
    return {line.split(":", 1)[0][2:]: line[0] for line in done.stdout.splitlines()}


def test_all_links_hold(bridge: Bridge) -> None:  # the skill in place, bridge up
    bridge.start("--project", "demo")
    where = skill(bridge)
    done = doctor(bridge, "--project", "demo", "--to", "telegram:-1001234567890:7")
    assert done.returncode == 0, done.stdout + done.stderr
    assert marks(done) == {
        "hermes": "✔", "python-telegram-bot": "✔", "--to": "✔", "hub-liaison": "✔",
        "questions directory": "✔", "state": "✔", "bridge demo": "✔", "service": "–"}
    lines = done.stdout.splitlines()
    assert f"✔ hub-liaison: skill at {where}" in lines
    assert f"✔ questions directory: {bridge.questions} (ours, 0700)" in lines
    assert any(line.startswith(f"✔ bridge demo: user-remote (pid {bridge.entry['pid']}) answers")
               for line in lines)
    assert "hermes installs it at its first send (lazy installs allowed" in done.stdout
    assert [argv for argv in bridge.hermes.argvs()] == [["--version"]]  # nothing was sent


def test_no_skill_names_it_and_where_it_belongs(bridge: Bridge) -> None:
    bridge.start()
    done = doctor(bridge)
    assert done.returncode == 1
    expected = bridge.home / ".hermes" / "skills" / "hub-liaison" / "SKILL.md"
    assert (f"✖ hub-liaison: the Hermes gateway has no hub-liaison skill, so no answer will "
            f"ever come back; install it as {expected}") in done.stdout.splitlines()


def test_the_skill_is_looked_for_in_the_profile_or_hermes_home(bridge: Bridge) -> None:
    # `--hermes-profile X` -> ~/.hermes/profiles/X; else $HERMES_HOME
    bridge.start()
    profile = bridge.home / ".hermes" / "profiles" / "ops"
    skill(bridge, profile)
    assert marks(doctor(bridge, "--hermes-profile", "ops"))["hub-liaison"] == "✔"
    assert marks(doctor(bridge))["hub-liaison"] == "✖"
    assert marks(doctor(bridge, HERMES_HOME=str(profile)))["hub-liaison"] == "✔"
    done = doctor(bridge, "--hermes-profile", "nope")
    assert "✖ hermes profile: no profile 'nope' at" in done.stdout


def test_no_hermes_on_path(bridge: Bridge) -> None:
    bridge.start()
    skill(bridge)
    done = doctor(bridge, PATH=os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                               if not Path(p, "hermes").exists()))
    assert done.returncode == 1
    assert done.stdout.splitlines()[0] == (
        "✖ hermes: 'hermes' is not on PATH; install hermes-agent (pip install hermes-agent) "
        "or put hermes on the daemon's PATH")


def test_a_stopped_bridge_fails_the_check(bridge: Bridge) -> None:
    bridge.start()
    skill(bridge)
    assert doctor(bridge).returncode == 0
    assert bridge.signal() == 0
    done = doctor(bridge)
    assert done.returncode == 1
    assert ("✖ bridge default: no live bridge registered for project default; start it "
            "(`just run --project default --to …`, or its service)") in done.stdout.splitlines()


def test_bad_links_are_each_named(bridge: Bridge) -> None:
    bridge.start()
    skill(bridge)
    bridge.questions.chmod(0o755)
    done = doctor(bridge, "--to", "telegram:chat:x", HERMES_DISABLE_LAZY_INSTALLS="1")
    assert done.returncode == 1
    got = marks(done)
    assert (got["--to"], got["questions directory"], got["python-telegram-bot"]) == (
        "✖", "✖", "✖")
    assert (f"✖ questions directory: {bridge.questions} is mode 0755; `chmod 700 "
            f"{bridge.questions}` (the bridge tightens it at start)") in done.stdout.splitlines()
    assert "HERMES_DISABLE_LAZY_INSTALLS=1 forbids hermes to install it" in done.stdout


def test_send_test_sends_one_message(bridge: Bridge) -> None:
    bridge.start()
    skill(bridge)
    done = doctor(bridge, "--send-test", "--to", "telegram:42")
    assert done.returncode == 0, done.stdout
    assert done.stdout.splitlines()[-1] == "✔ test message: sent to telegram:42; look for it in Telegram"
    assert bridge.hermes.argvs()[-1] == [
        "send", "--to", "telegram:42", "coms-hermes-bridge doctor: a test message; nothing to answer."]
    bridge.hermes.configure(exit=2, stderr="chat not found\n")
    done = doctor(bridge, "--send-test")
    assert done.returncode == 1
    assert done.stdout.splitlines()[-1] == "✖ test message: hermes send failed (2): chat not found"


def test_hermes_home_is_read_as_hermes_reads_it(tmp_path: Path) -> None:
    home = {"HOME": str(tmp_path)}
    assert hermes_home(home, None) == tmp_path / ".hermes"
    assert hermes_home(home, "ops") == tmp_path / ".hermes" / "profiles" / "ops"
    elsewhere = {**home, "HERMES_HOME": "/srv/hermes"}
    assert hermes_home(elsewhere, None) == Path("/srv/hermes")
    assert hermes_home(elsewhere, "ops") == Path("/srv/hermes/profiles/ops")
    a_profile = {**home, "HERMES_HOME": "/srv/hermes/profiles/dev"}
    assert hermes_home(a_profile, None) == Path("/srv/hermes/profiles/dev")
    assert hermes_home(a_profile, "ops") == Path("/srv/hermes/profiles/ops")


def test_with_home_unset_the_service_unit_is_looked_for_in_the_users_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # as the daemon finds its files then: the password database's home, not ./~
    home = tmp_path / "home"
    unit = home / ".config" / "systemd" / "user" / UNIT
    unit.parent.mkdir(parents=True)
    unit.write_text("[Service]\n")
    real = pwd.getpwuid(os.getuid())
    entry = pwd.struct_passwd((*real[:5], str(home), real[6]))  # pw_dir is the sixth
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: entry)
    monkeypatch.delenv("HOME")
    monkeypatch.chdir(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text("#!/bin/sh\necho inactive\nexit 3\n")
    (bin_dir / "systemctl").chmod(0o755)
    env = {"PATH": str(bin_dir)}
    config = parse_config(["--project", "demo"], env)
    assert config.questions_dir == home / ".pi" / "coms" / "hermes-bridge" / "questions"
    unit_name = "coms-hermes-bridge@demo.service"
    assert check_service(config, env).line() == (
        f"✖ service: {unit_name} is inactive; `systemctl --user enable --now {unit_name}`, "
        f"then `journalctl --user -u {unit_name}`")
    assert hermes_home(env, None) == home / ".hermes"
