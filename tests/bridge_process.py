"""Drive the real daemon: a process with temp HOME and PI_COMS_DIR, a fake hermes
on PATH, and an asker of our own speaking the coms wire over unix sockets."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

from ulid import ULID

from tests.fakes import Asker, read_ndjson, request, wait_for
from tests.hermes_fake import FakeHermes

ROOT = Path(__file__).resolve().parent.parent


def new_qid() -> str:
    return str(ULID())


class Bridge:
    """One daemon process and its world (HOME, PI_COMS_DIR, fake hermes, asker)."""

    def __init__(self, base: Path | None = None) -> None:
        # Short paths: a unix socket path must stay under 108 bytes.
        self.base = base or Path(tempfile.mkdtemp(prefix="chb", dir="/tmp"))
        self.home = self.base / "h"
        self.coms = self.base / "c"
        self.home.mkdir(exist_ok=True)
        self.hermes = FakeHermes(self.base / "bin")
        self.asker = Asker.beside(self.base)
        self.bridge_dir = self.home / ".pi" / "coms" / "hermes-bridge"
        self.questions = self.bridge_dir / "questions"
        self.log = self.bridge_dir / "log.ndjson"
        self.proc: subprocess.Popen[str] | None = None
        self.stderr_lines: list[str] = []
        self.project = "default"

    # -- process ------------------------------------------------------------

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "PI_COMS_TIMEOUT_MS"}
        env.update(
            HOME=str(self.home),
            PI_COMS_DIR=str(self.coms),
            PATH=f"{self.hermes.directory}{os.pathsep}{env.get('PATH', '')}",
            PYTHONPATH=str(ROOT),
        )
        env.update(extra)
        return env

    def start(
        self,
        *args: str,
        wait: bool = True,
        preexec: Callable[[], None] | None = None,
        command: tuple[str, ...] = (sys.executable, "-m", "coms_hermes_bridge"),
        **env: str,
    ) -> Bridge:
        """`preexec` runs in the child before the daemon starts (e.g. a umask, an rlimit);
        `command` is what starts the daemon (e.g. `scripts/dev run`)."""
        if "--project" in args:  # readiness is the entry in the project's registry (W2, W7)
            self.project = args[list(args).index("--project") + 1]
        self.proc = subprocess.Popen(
            [*command, *args],
            cwd=str(ROOT),
            env=self.env(**env),
            preexec_fn=preexec,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._drain, args=(self.proc,), daemon=True).start()
        if wait:
            self.wait_ready()
        return self

    def _drain(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            self.stderr_lines.append(line.rstrip("\n"))

    def run(self, *args: str, timeout: float = 10.0, **env: str) -> subprocess.CompletedProcess[str]:
        """Run the daemon to completion (for flags that make it exit)."""
        return subprocess.run(
            [sys.executable, "-m", "coms_hermes_bridge", *args],
            cwd=str(ROOT),
            env=self.env(**env),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def verb(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """An operator's verb (status, answer, cancel, doctor) in this world, run in this
        process: its exit status and what it printed. (The command's own process: `run`.)"""
        from coms_hermes_bridge.cli import main

        out, err = io.StringIO(), io.StringIO()
        with mock.patch.dict(os.environ, self.env(**env), clear=True), \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
        return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())

    def entry_path(self, name: str = "user-remote", project: str | None = None) -> Path:
        return self.coms / "projects" / (project or self.project) / "agents" / f"{name}.json"

    def wait_ready(self, name: str = "user-remote", timeout: float = 15.0) -> dict[str, Any]:
        """W7: the registry entry's appearance is readiness."""
        path = self.entry_path(name)

        def ready() -> dict[str, Any] | None:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode}: {self.stderr_lines}")
            try:
                text = path.read_text()
            except FileNotFoundError:  # not yet, or a dead run's entry just pruned (W9)
                return None
            entry: dict[str, Any] = json.loads(text)
            return entry if entry.get("pid") == self.proc.pid else None

        self.entry = wait_for(ready, timeout, "registry entry")
        return self.entry

    @property
    def endpoint(self) -> str:
        return str(self.entry["endpoint"])

    def signal(self, sig: int = signal.SIGTERM, timeout: float = 5.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)

    def close(self) -> None:
        self.kill()
        self.asker.close()
        shutil.rmtree(self.base, ignore_errors=True)

    # -- wire ---------------------------------------------------------------

    def ask(self, text: str, qid: str | None = None, **fields: Any) -> str:
        env = self.asker.prompt_envelope(text, qid, **fields)
        reply = request(self.endpoint, env)
        assert reply == {"type": "ack", "msg_id": env["msg_id"]}, reply
        return str(env["msg_id"])

    @staticmethod
    def cancel_envelope(qid: str, sender: str = "builder") -> dict[str, Any]:
        return {
            "type": "cancel",
            "msg_id": new_qid(),
            "from": sender,
            "to": "user-remote",
            "created_at": "2026-11-30T12:00:05.000Z",
            "ref_msg_id": qid,
        }

    def cancel(self, qid: str, sender: str = "builder") -> dict[str, Any]:
        env = self.cancel_envelope(qid, sender)
        reply: dict[str, Any] = request(self.endpoint, env)
        assert reply == {"type": "ack", "msg_id": env["msg_id"]}, reply
        return reply

    def ping(self) -> dict[str, Any]:
        reply: dict[str, Any] = request(self.endpoint, {"type": "ping", "msg_id": "p1"})
        return reply

    # -- files and log ------------------------------------------------------

    def answer(self, qid: str, text: str, *, name: str | None = None, **fields: Any) -> Path:
        """Write an answer file atomically: a temp file outside the directory, then rename."""
        body = {"qid": qid, "answer": text, "answered_by": "telegram:alice",
                "at": "2026-11-30T12:01:00.000Z", **fields}
        return self.drop(name or f"{qid}.answer.json", json.dumps(body).encode())

    def drop(self, name: str, content: bytes) -> Path:
        self.questions.mkdir(parents=True, exist_ok=True)
        tmp = self.base / f".tmp-{name}"
        tmp.write_bytes(content)
        target = self.questions / name
        os.rename(tmp, target)
        return target

    def log_records(self) -> list[dict[str, Any]]:
        return read_ndjson(self.log)

    def wait_log(
        self, event: str, qid: str | None = None, timeout: float = 10.0,
        where: Callable[[dict[str, Any]], bool] = lambda r: True,
    ) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            for record in self.log_records():
                if record["event"] == event and (qid is None or record["qid"] == qid) and where(record):
                    return record
            return None

        return wait_for(found, timeout, f"log event {event} for {qid}")

    def state_path(self, project: str | None = None) -> Path:
        """The project's own state file."""
        return self.bridge_dir / f"state-{project or self.project}.sqlite3"

    def owed(self, project: str | None = None) -> int:
        """Responses the daemon has decided but not yet seen acked (its outbox)."""
        path = self.state_path(project)
        if not path.exists():
            return 0
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            return int(db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])

    def no_response(self, *others: Asker) -> None:
        """No asker was or will be sent a response for what the daemon decided before the
        decisive event the test waited for in the log: the log line is written after the
        store's commit, a response owed stays in the outbox until its asker acks it, and
        an asker holds a response before it acks. No waiting on the clock. (The ping adds
        a Router turn when the Router answers within 2 s. Not covered: the one response
        never stored, C3's to a prompt whose msg_id is no qid.)"""
        self.ping()
        wait_for(lambda: self.owed() == 0, what="nothing owed to an asker")
        for asker in (self.asker, *others):
            asker.no_response(within=0)

    def events(self, qid: str) -> list[str]:
        return [r["event"] for r in self.log_records() if r["qid"] == qid]

    def sent_texts(self) -> list[str]:
        """What hermes was asked to send, in order (the last argv item)."""
        return [argv[-1] for argv in self.hermes.argvs()]
