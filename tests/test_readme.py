"""The README's set-up and first hour, run as written: each command line is taken from the
README itself, so a command that stops working as the README writes it fails here. (The
agent's `coms-cli` line is the pool's own client, not ours: its words are checked.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator

import pytest

from tests.bridge_process import ROOT, Bridge
from tests.hermes_venv import ensure_hermes_bin

README = (ROOT / "README.md").read_text(encoding="utf-8")
ACTIVATE = ". .venv/bin/activate"


def commands(section: str) -> list[str]:
    """The command lines of the ```sh blocks of one `## ` section, comments cut off."""
    body = README.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    lines = []
    for block in re.findall(r"```sh\n(.*?)```", body, re.S):
        for line in block.splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line:
                lines.append(line)
    return lines


def line(starting: str, section: str = "The first hour") -> str:
    (found,) = [c for c in commands(section) if c.startswith(starting)]
    return found


@pytest.fixture
def bridge() -> Iterator[Bridge]:
    b = Bridge()
    yield b
    b.close()


def shell(bridge: Bridge, command: str, **subs: str) -> subprocess.CompletedProcess[str]:
    """`command` as a reader types it in the checkout after `. .venv/bin/activate`, in the
    bridge's world (its HOME, its coms directory, the fake hermes on PATH)."""
    for name, value in subs.items():
        command = command.replace(f"<{name}>", value)
    return subprocess.run(["bash", "-c", f"{ACTIVATE} && {command}"], cwd=ROOT,
                          env=bridge.env(PYTHONPATH=""), capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


def test_the_set_up_puts_the_command_on_path() -> None:
    # the README's two set-up lines, then the command the first hour uses
    setup = commands("Set up")
    assert setup == ["scripts/dev setup", ACTIVATE]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    done = subprocess.run(["bash", "-c", " && ".join([*setup, "command -v coms-hermes-bridge"])],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == str(ROOT / ".venv" / "bin" / "coms-hermes-bridge")


def test_the_first_hour_as_written(bridge: Bridge) -> None:
    # doctor, the bridge, a question asked and answered, status, the operator's cancel
    # (X15) and the service, each from the README's own line (the liaison: below)
    doctor = shell(bridge, line("coms-hermes-bridge doctor"))
    assert doctor.returncode == 1  # no liaison yet, no bridge up: said, not crashed
    assert "✔ hermes" in doctor.stdout and "✖" in doctor.stdout, doctor.stdout
    assert ("⚠ --to: telegram:123456789: hermes sends to it as given, but has not seen this "
            "chat yet; the human must have written to the bot there first"
            ) in doctor.stdout.splitlines()  # resolved, nothing sent
    assert all(run["argv"][:2] != ["send", "--to"] for run in bridge.hermes.started())

    start = line("coms-hermes-bridge --project")
    bridge.project = "myproject"
    bridge.start(command=("bash", "-c", f"{ACTIVATE} && exec {start}"))
    assert any(s.endswith("starting as peer user-remote in coms project myproject (agents "
                          "must use this project to ask), hermes target telegram:123456789")
               for s in bridge.stderr_lines), bridge.stderr_lines

    qid = bridge.ask("Deploy to prod?")  # as coms-cli would, to the project's user-remote
    bridge.wait_log("delivered", qid)
    assert bridge.hermes.calls()[-1]["argv"][:3] == ["send", "--to", "telegram:123456789"]
    status = shell(bridge, line("coms-hermes-bridge status"))
    assert status.returncode == 0 and f"{qid}  builder" in status.stdout, status.stdout

    answered = shell(bridge, line("coms-hermes-bridge answer"), qid=qid)
    assert answered.returncode == 0, answered.stderr
    response = bridge.asker.response()
    assert (response["msg_id"], response["response"]) == (qid, {"kind": "freeform", "text": "yes"})

    other = bridge.ask("Still there?")
    bridge.wait_log("delivered", other)
    cancelled = shell(bridge, line("coms-hermes-bridge cancel"), qid=other)
    assert cancelled.returncode == 0, cancelled.stderr
    response = bridge.asker.response()
    assert (response["msg_id"], response["response"], response["error"]) == (
        other, None, "cancelled by the operator")

    service = shell(bridge, line("scripts/dev install-service") + " --no-enable")
    assert service.returncode == 0, service.stderr
    unit = bridge.home / ".config" / "systemd" / "user" / "coms-hermes-bridge@.service"
    flags = (bridge.home / ".config" / "coms-hermes-bridge" / "myproject.env").read_text()
    assert unit.is_file() and "--to telegram:123456789" in flags, flags


@pytest.mark.real_hermes
def test_the_liaison_line_installs_it_into_the_real_hermes(bridge: Bridge) -> None:
    # X14: the README's install line, with the real hermes on PATH (it asks Hermes'
    # own interpreter about plugins), then the restart line exists in that hermes
    real = bridge.base / "real"
    real.mkdir()
    (real / "hermes").symlink_to(ensure_hermes_bin() / "hermes")
    env = bridge.env(PYTHONPATH="", PATH=f"{real}:/usr/bin:/bin")
    for command in (line("coms-hermes-bridge liaison"), "coms-hermes-bridge liaison status"):
        done = subprocess.run(["bash", "-c", f"{ACTIVATE} && {command}"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
    restart = line("hermes gateway").split()
    usage = subprocess.run([str(real / "hermes"), *restart[1:2], "--help"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert restart == ["hermes", "gateway", "restart"] and " restart " in usage.stdout


def test_the_agents_line_asks_user_remote_of_the_bridges_project() -> None:
    # the agent's side: coms-cli's form (send <peer> <prompt> --project --name --await),
    # to user-remote, in the project the bridge was started with, waiting past 30 min
    ask = line("coms-cli send")
    start = line("coms-hermes-bridge --project")
    assert ask.split()[:3] == ["coms-cli", "send", "user-remote"]
    project = start.split()[start.split().index("--project") + 1]
    words = ask.split()
    assert words[words.index("--project") + 1] == project and "--await" in words
    assert int(words[words.index("--timeout") + 1]) > 30 * 60 * 1000
    assert json.loads(README.split("The agent prints the answer, `", 1)[1].split("`", 1)[0]) == {
        "kind": "freeform", "text": "yes"}
