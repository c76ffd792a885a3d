"""A fake `hermes` executable for tests (W20), shared by actor and end-to-end tests.

The script records each run (argv, pid, start and end times) as one JSON line
and behaves as its config file says, so a test can change what the next run
does without restarting anything. Environment variables override the file:
FAKE_HERMES_EXIT, FAKE_HERMES_SLEEP, FAKE_HERMES_STDERR, FAKE_HERMES_STDOUT,
FAKE_HERMES_SPAWN (1: start a `sleep` grandchild in the same process group),
FAKE_HERMES_FLOOD (bytes of filler written to stderr). `send --list [PLATFORM] --json`
answers as hermes 0.19 does, from the config's `chats` (by default a Telegram with none).
"""

from __future__ import annotations

import json
import stat
import sys
import time
from pathlib import Path
from typing import Any

_SCRIPT = r'''#!{python}
import json, os, subprocess, sys, time

HERE = {here!r}
start = time.time()
try:
    with open(os.path.join(HERE, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
except OSError:
    config = {{}}
for key in ("exit", "sleep", "stderr", "stdout", "spawn", "flood"):
    raw = os.environ.get("FAKE_HERMES_" + key.upper())
    if raw is not None:
        config[key] = raw
child = None
if str(config.get("spawn", "")) in ("1", "true", "True"):
    child = subprocess.Popen(["sleep", "30"]).pid
run = {{"argv": sys.argv[1:], "pid": os.getpid(), "pgid": os.getpgid(0), "child": child,
       "start": start}}
with open(os.path.join(HERE, "started.ndjson"), "a", encoding="utf-8") as f:
    f.write(json.dumps(run) + "\n")
args = sys.argv[1:]
if "send" in args and "--list" in args:
    chats = config.get("chats")
    chats = {{"telegram": []}} if chats is None else chats
    wanted = [a for a in args[args.index("send") + 1:] if not a.startswith("-")][:1]
    found = {{k: v for k, v in chats.items() if k.lower() in [w.lower() for w in wanted] or
             not wanted}}
    if not found:
        config.update(exit=1, stdout="", stderr="hermes send: no targets found for platform "
                      "'%s'. Configured: %s\n" % (wanted[0], ", ".join(sorted(chats)) or "(none)"))
    else:
        config.update(exit=0, stderr="", stdout=json.dumps({{"platforms": found}}) + "\n")
    config["flood"] = 0
time.sleep(float(config.get("sleep", 0)))
flood = int(config.get("flood", 0))
line = b"hermes: something went wrong, and it says so at length\n"
while flood > 0:
    sys.stderr.buffer.write(line[:flood])
    flood -= len(line)
sys.stderr.flush()
sys.stdout.write(str(config.get("stdout", "")))
sys.stderr.write(str(config.get("stderr", "")))
run["end"] = time.time()
with open(os.path.join(HERE, "calls.ndjson"), "a", encoding="utf-8") as f:
    f.write(json.dumps(run) + "\n")
sys.exit(int(config.get("exit", 0)))
'''


class FakeHermes:
    """A `hermes` program in `directory`; put `directory` on PATH or pass `.path`."""

    def __init__(self, directory: Path, python: str = sys.executable, **config: Any) -> None:
        """`python` runs the script (another path to it, where a sandbox hides this one)."""
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "hermes"
        self.path.write_text(_SCRIPT.format(python=python, here=str(directory)), encoding="utf-8")
        self.path.chmod(self.path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        self.configure(**config)

    def configure(
        self,
        *,
        exit: int = 0,
        sleep: float = 0,
        stderr: str = "",
        stdout: str = "",
        spawn: bool = False,
        flood: int = 0,
        chats: dict[str, list[dict[str, Any]]] | None = None,
    ) -> None:
        """What the following runs do: exit code, seconds to sleep, what to print
        (`flood`: that many bytes of filler on stderr before `stderr`); `chats`: hermes'
        channel directory, platform to chats (`{}`: no platform at all)."""
        config = {"exit": exit, "sleep": sleep, "stderr": stderr, "stdout": stdout,
                  "spawn": spawn, "flood": flood, "chats": chats}
        (self.directory / "config.json").write_text(json.dumps(config), encoding="utf-8")

    def _read(self, file: str) -> list[dict[str, Any]]:
        path = self.directory / file
        if not path.exists():
            return []
        lines = path.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def calls(self) -> list[dict[str, Any]]:
        """Runs that finished: argv, pid, pgid, child, start, end (epoch seconds)."""
        return self._read("calls.ndjson")

    def started(self) -> list[dict[str, Any]]:
        """Runs that began, finished or not."""
        return self._read("started.ndjson")

    def argvs(self) -> list[list[str]]:
        return [call["argv"] for call in self.calls()]

    def wait_started(self, count: int = 1, timeout: float = 5.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            runs = self.started()
            if len(runs) >= count:
                return runs
            time.sleep(0.01)
        raise AssertionError(f"fake hermes: {count} run(s) not started within {timeout}s")


def write_fake_hermes(directory: Path, **config: Any) -> FakeHermes:
    """Write a fake hermes into `directory` (see FakeHermes.configure for `config`)."""
    return FakeHermes(directory, **config)
