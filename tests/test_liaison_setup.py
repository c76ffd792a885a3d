"""`coms-hermes-bridge liaison install | uninstall | status` with the real hermes
(hermes-agent 0.19.0) in a scratch HOME: the plugin lands where Hermes loads it, Hermes
itself enables it, and each verb says what it did (X14)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.bridge_process import ROOT
from tests.hermes_venv import ensure_hermes_bin

pytestmark = pytest.mark.real_hermes

COMMAND = ROOT / ".venv" / "bin" / "coms-hermes-bridge"
SOURCE = ROOT / "coms_hermes_bridge" / "liaison"
FILES = ("plugin.yaml", "__init__.py", "answers.py", "markers.py")
RESTART = ("a running Hermes gateway loads plugins only when it starts: restart it "
           "(`hermes gateway restart`, or its service) for the liaison to take effect")


@dataclass
class Host:
    home: Path
    bin: Path

    def run(self, *args: str) -> tuple[int, list[str]]:
        env = {"HOME": str(self.home), "PATH": f"{self.bin}:/usr/bin:/bin", "LANG": "C.UTF-8"}
        done = subprocess.run([str(COMMAND), "liaison", *args], env=env, capture_output=True,
                              text=True, timeout=120, check=False)
        return done.returncode, (done.stdout + done.stderr).splitlines()

    def hermes_config(self, home: Path | None = None) -> str:
        return ((home or self.home / ".hermes") / "config.yaml").read_text(encoding="utf-8")


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "hermes").symlink_to(ensure_hermes_bin() / "hermes")
    yield Host(tmp_path / "home", bin_dir)


def test_install_status_upgrade_uninstall(host: Host) -> None:
    # X14: the plugin copied whole with its config, enabled by Hermes, idempotent,
    # an older copy upgraded, and gone again after uninstall
    host.home.mkdir()
    plugin = host.home / ".hermes" / "plugins" / "hub-liaison"
    questions = host.home / ".pi" / "coms" / "hermes-bridge" / "questions"
    assert host.run("install") == (0, [
        f"hub-liaison installed at {plugin} (answers go to {questions})",
        "hub-liaison enabled in Hermes",
        RESTART,
    ])
    for name in FILES:
        assert (plugin / name).read_bytes() == (SOURCE / name).read_bytes(), name
    assert json.loads((plugin / "liaison.json").read_text(encoding="utf-8")) == {
        "questions_dir": str(questions), "command": str(COMMAND.resolve()),
    }
    assert "  enabled:\n    - hub-liaison\n" in host.hermes_config()
    status = [f"✔ hub-liaison: installed at {plugin}", "✔ hub-liaison: enabled in Hermes",
              "✔ pre_gateway_dispatch, pre_llm_call: this Hermes has them",
              f"  answers go to {questions}"]
    assert host.run("status") == (0, status)

    assert host.run("install") == (0, [
        f"hub-liaison is up to date at {plugin}", "hub-liaison is enabled in Hermes", RESTART,
    ])

    (plugin / "answers.py").write_text("# an older liaison\n", encoding="utf-8")
    code, lines = host.run("status")
    assert (code, lines[0]) == (1, f"✖ hub-liaison: an older copy at {plugin}; run "
                                   "`coms-hermes-bridge liaison install`")
    assert host.run("install") == (0, [
        f"hub-liaison upgraded at {plugin} (answers go to {questions})",
        "hub-liaison is enabled in Hermes", RESTART,
    ])
    assert (plugin / "answers.py").read_bytes() == (SOURCE / "answers.py").read_bytes()
    assert sorted(p.name for p in plugin.parent.iterdir()) == ["hub-liaison"]  # no litter

    assert host.run("uninstall") == (0, [f"hub-liaison removed from {plugin}", RESTART])
    assert not plugin.exists()
    assert "enabled: []" in host.hermes_config()
    assert host.run("status") == (1, [
        f"✖ hub-liaison: not installed at {plugin}; run `coms-hermes-bridge liaison install`",
    ])
    assert host.run("uninstall") == (0, [f"hub-liaison is not installed at {plugin}"])
    # and back: Hermes' own disabled list must not keep a reinstalled liaison off
    assert host.run("install")[1][1] == "hub-liaison enabled in Hermes"
    assert host.run("status")[0] == 0


def test_install_into_a_profile_with_its_own_questions_dir(host: Host, tmp_path: Path) -> None:
    # X14: --hermes-profile as the other verbs have it; --questions-dir is recorded
    profile = host.home / ".hermes" / "profiles" / "work"
    profile.mkdir(parents=True)
    elsewhere = tmp_path / "answers"
    code, lines = host.run("install", "--hermes-profile", "work", "--questions-dir", str(elsewhere))
    assert (code, lines[0]) == (0, f"hub-liaison installed at {profile / 'plugins' / 'hub-liaison'}"
                                   f" (answers go to {elsewhere})")
    assert "  enabled:\n    - hub-liaison\n" in host.hermes_config(profile)
    assert not (host.home / ".hermes" / "plugins").exists()
    assert host.run("status", "--hermes-profile", "work")[0] == 0
    assert host.run("status")[0] == 1  # the default profile has none


def test_no_hermes_on_path_is_one_line(host: Host) -> None:
    # X14: the liaison is Hermes' plugin: without hermes there is nothing to install into
    (host.bin / "hermes").unlink()
    assert host.run("install") == (1, [
        "coms-hermes-bridge: 'hermes' is not on PATH; the liaison is a plugin of the "
        "Hermes gateway: install hermes-agent first",
    ])


def test_doctor_reads_the_plugins_state_as_hermes_does(host: Host) -> None:
    # X14, W21: doctor's liaison lines (those of `liaison status`) after a real install,
    # after Hermes disables the plugin, and with an older copy
    host.home.mkdir()
    plugin = host.home / ".hermes" / "plugins" / "hub-liaison"
    env = {"HOME": str(host.home), "PATH": f"{host.bin}:/usr/bin:/bin", "LANG": "C.UTF-8",
           "XDG_RUNTIME_DIR": str(host.home)}

    def liaison_lines() -> list[str]:
        done = subprocess.run([str(COMMAND), "doctor"], env=env, capture_output=True,
                              text=True, timeout=120, check=False)
        return [line for line in done.stdout.splitlines() if line[2:].startswith("hub-liaison")]

    assert host.run("install")[0] == 0
    assert liaison_lines() == [f"✔ hub-liaison: installed at {plugin}",
                               "✔ hub-liaison: enabled in Hermes"]
    disabled = subprocess.run([str(host.bin / "hermes"), "plugins", "disable", "hub-liaison"],
                              env=env, capture_output=True, text=True, timeout=120, check=False)
    assert disabled.returncode == 0, disabled.stdout + disabled.stderr
    (plugin / "answers.py").write_text("# an older liaison\n", encoding="utf-8")
    install = "run `coms-hermes-bridge liaison install`"
    assert liaison_lines() == [f"✖ hub-liaison: an older copy at {plugin}; {install}",
                               f"✖ hub-liaison: not enabled; {install}"]
