"""The shipped systemd user unit under a real systemd user manager.

Run by tests/test_systemd.py as root inside a private mount namespace
(`unshare -m --propagation private`), so that nothing it mounts is seen outside:

- `/run/systemd/system` on a tmpfs over `/run` makes `systemd --user` believe the
  host booted with systemd (it checks for that directory and nothing else);
- a tmpfs on `/mnt` holds a HOME, XDG_RUNTIME_DIR and this checkout bound in, out
  of `/tmp`, because the unit's PrivateTmp= hides `/tmp` from the service.

Then it installs the unit with `scripts/install_service.py`, drives the service
(start, a question answered, SIGKILL and the restart, stop) and prints what it saw
as one JSON object. The test asserts on that object.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BASE = Path("/mnt")
SRC = BASE / "src"
HOME = BASE / "home"
XDG = BASE / "xdg"
PROJECT = "drill"
UNIT = f"coms-hermes-bridge@{PROJECT}.service"


def run(*argv: str, env: dict[str, str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, check=False)


def wait(condition: Callable[[], Any], what: str, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise SystemExit(json.dumps({"error": f"timed out waiting for {what}"}))


def mount(*argv: str) -> None:
    subprocess.run(["mount", *argv], check=True)


def main(root: str) -> None:
    mount("-t", "tmpfs", "tmpfs", "/run")  # a /run of our own: nothing made on the host
    os.makedirs("/run/systemd/system")
    mount("-t", "tmpfs", "tmpfs", str(BASE))
    SRC.mkdir()
    mount("--bind", root, str(SRC))
    for path in (HOME, XDG, BASE / "bin"):
        path.mkdir(mode=0o700)
    python = str(SRC / ".venv" / "bin" / "python")
    sys.path.insert(0, str(SRC))
    from tests.fakes import Asker, request  # the bound copy, as the unit sees it
    from tests.hermes_fake import FakeHermes

    hermes = FakeHermes(HOME / ".hermes" / "bin", python=python)  # ReadWritePaths=-%h/.hermes
    # What `pipx install .` would give: the package laid out as installed, out of /tmp
    # (the checkout's own editable install points into it, where PrivateTmp= hides it).
    package = BASE / "package"
    subprocess.run([str(SRC / "scripts" / "stage"), str(package)], check=True, cwd=str(SRC))
    launcher = BASE / "bin" / "coms-hermes-bridge"
    launcher.write_text(f"#!{python}\nimport sys\nsys.path.insert(0, {str(package)!r})\n"
                        "from coms_hermes_bridge.cli import main\nsys.exit(main())\n")
    launcher.chmod(0o755)
    env = {"HOME": str(HOME), "XDG_RUNTIME_DIR": str(XDG), "LANG": "C.UTF-8",
           "PATH": f"{hermes.directory}:/usr/local/bin:/usr/bin:/bin"}
    manager = subprocess.Popen(["/lib/systemd/systemd", "--user"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen: dict[str, Any] = {}
    try:
        wait(lambda: (XDG / "systemd" / "private").exists(), "the user manager")
        wait(lambda: run("systemctl", "--user", "is-system-running", env=env).stdout.strip()
             in ("running", "degraded"), "the user manager running")
        done = run(python, str(SRC / "scripts" / "install_service.py"), PROJECT,
                   "--to", "telegram:42", "--timeout", "60000", "--bin", str(launcher), env=env)
        seen["install"] = [done.returncode, done.stdout.splitlines(), done.stderr]
        entry = HOME / ".pi" / "coms" / "projects" / PROJECT / "agents" / "user-remote.json"

        def state() -> dict[str, str]:
            out = run("systemctl", "--user", "show", UNIT, "-p", "ActiveState,SubState,MainPID,"
                      "Result,NRestarts,ExecMainStatus", env=env).stdout
            return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

        def published(pid: str) -> dict[str, Any] | None:
            try:
                body: dict[str, Any] = json.loads(entry.read_text())
            except (OSError, ValueError):
                return None
            return body if str(body.get("pid")) == pid else None

        first = wait(lambda: (s := state())["ActiveState"] == "active" and s, "active")
        seen["started"] = first
        body = wait(lambda: published(first["MainPID"]), "the registry entry")
        asker = Asker.beside(HOME / ".pi")  # PrivateTmp hides /tmp: the asker listens under ~/.pi
        envelope = asker.prompt_envelope("From the unit?")
        seen["ack"] = request(body["endpoint"], envelope)
        wait(lambda: hermes.calls(), "hermes run by the service")
        seen["hermes_argv"] = hermes.argvs()[0][:-1]
        qid = envelope["msg_id"]
        os.kill(int(first["MainPID"]), signal.SIGKILL)  # Restart=on-failure brings it back
        again = wait(lambda: (s := state())["ActiveState"] == "active"
                     and s["MainPID"] not in ("0", first["MainPID"]) and s, "the restart", 30)
        seen["restarted"] = again
        wait(lambda: published(again["MainPID"]), "the entry of the restarted bridge")
        answer = HOME / ".pi" / "coms" / "hermes-bridge" / "questions" / f"{qid}.answer.json"
        tmp = answer.with_name(".answer.tmp")
        tmp.write_text(json.dumps({"qid": qid, "answer": "from systemd",
                                   "answered_by": "telegram:1", "at": "2026-12-01T12:00:00Z"}))
        tmp.rename(answer)
        response = asker.response(timeout=20)
        seen["response"] = [response["msg_id"] == qid, response["response"], response["error"]]
        done = run("systemctl", "--user", "stop", UNIT, env=env)
        seen["stop"] = done.returncode
        seen["stopped"] = state()
        seen["entry_left"] = entry.exists()
        asker.close()
    finally:
        manager.send_signal(signal.SIGTERM)
        try:
            manager.wait(timeout=10)
        except subprocess.TimeoutExpired:
            manager.kill()
        print(json.dumps(seen))


if __name__ == "__main__":
    socket.setdefaulttimeout(10)
    main(sys.argv[1])
