"""The real Hermes gateway (`hermes gateway run`, hermes-agent 0.19.0) with the liaison
installed by `coms-hermes-bridge liaison install`, against the fake Telegram: shared by
tests/test_liaison_gateway.py and scripts/bench_liaison.py, so the benchmark measures
the very setup the tests check.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coms_hermes_bridge.messages.contract import format_question
from coms_hermes_bridge.messages.wire import ParsedPrompt, QuestionOption
from tests.bridge_process import ROOT
from tests.fakes import wait_for
from tests.telegram_fake import TOKEN, FakeTelegram, Seen, make_tls

HUMAN = 4242  # the chat and user id of the authorized human
WAIT = 30.0
LEFT_TO_HERMES = "Provider authentication failed"  # Hermes' reply with no model set up


@dataclass
class Gateway:
    telegram: FakeTelegram
    home: Path
    log: Path
    proc: subprocess.Popen[bytes]
    qid_number: int = 0

    @property
    def questions(self) -> Path:
        return self.home / ".pi" / "coms" / "hermes-bridge" / "questions"

    def qid(self) -> str:
        """A fresh qid for each question of the module (Crockford digits only)."""
        self.qid_number += 1
        return f"01HZY5B7R8XK3M9Q2W4E{self.qid_number:06d}"

    def question(self, qid: str, text: str = "Ship it?") -> Seen:
        """The bot's C4 question, as `hermes send` left it in the chat."""
        parsed = ParsedPrompt(question=text, options=(QuestionOption(title="Yes"),))
        return self.telegram.bot_said(format_question(qid, parsed, project="web"))

    def answer_file(self, qid: str) -> dict[str, Any]:
        path = self.questions / f"{qid}.answer.json"
        wait_for(path.exists, WAIT, f"{path.name}; gateway log:\n{self.tail()}")
        assert oct(path.stat().st_mode & 0o777) == "0o600"
        body: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return body

    def answers(self) -> list[str]:
        return sorted(p.name for p in self.questions.glob("*")) if self.questions.is_dir() else []

    def hermes_replies(self, count: int) -> list[str]:
        """Wait for `count` replies of Hermes' own (the liaison sends none), in order."""
        def replies() -> list[str]:
            return [t for t in self.telegram.texts() if LEFT_TO_HERMES in t]
        return wait_for(lambda: replies() if len(replies()) >= count else None, WAIT,
                        f"{count} Hermes replies; gateway log:\n{self.tail()}")

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])


@contextmanager
def running_gateway(base: Path, hermes_bin: Path, *, all_http_to_proxy: bool = False,
                    config_yaml: str | None = None, allowlist: bool = True,
                    ) -> Iterator[Gateway]:
    """A listening gateway in `base` (its HOME, TLS, log), stopped on the way out.

    `all_http_to_proxy` also points HTTP(S)_PROXY at the fake Telegram's proxy, which
    records every CONNECT and refuses all but api.telegram.org: then any request the
    gateway makes elsewhere (an LLM provider, say) is seen, not just attempted in silence.
    With `config_yaml`, Hermes' config.yaml says so (a model for it to call, say). Without
    the `allowlist` (TELEGRAM_ALLOWED_USERS), Hermes pairs strangers instead of dropping
    them: their messages reach the plugins.
    """
    tls = make_tls(base / "tls", hermes_bin / "python")
    telegram = FakeTelegram(tls)
    try:
        home = base / "home"
        (home / ".hermes").mkdir(parents=True, exist_ok=True)
        allowed = f"TELEGRAM_ALLOWED_USERS={HUMAN}\n" if allowlist else ""
        (home / ".hermes" / ".env").write_text(
            f"TELEGRAM_BOT_TOKEN={TOKEN}\n{allowed}TELEGRAM_HOME_CHANNEL={HUMAN}\n",
            encoding="utf-8")
        if config_yaml is not None:
            (home / ".hermes" / "config.yaml").write_text(config_yaml, encoding="utf-8")
        bin_dir = base / "bin"
        bin_dir.mkdir()
        (bin_dir / "hermes").symlink_to(hermes_bin / "hermes")
        # a clean environment: no API keys, nothing of ours, hermes alone on PATH
        env = {"HOME": str(home), "PATH": f"{bin_dir}{os.pathsep}/usr/bin:/bin",
               "LANG": "C.UTF-8", **telegram.env(), "TELEGRAM_FALLBACK_IPS": "149.154.167.220",
               "TIRITH_ENABLED": "false", "HERMES_GATEWAY_LOCK_DIR": str(base / "locks")}
        if all_http_to_proxy:
            for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"):
                env[name] = env[name.lower()] = telegram.proxy_url
        installed = subprocess.run([str(ROOT / ".venv" / "bin" / "coms-hermes-bridge"),
                                    "liaison", "install"], env=env, capture_output=True,
                                   text=True, timeout=120, check=False)
        assert installed.returncode == 0, installed.stdout + installed.stderr
        log = base / "gateway.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([str(bin_dir / "hermes"), "gateway", "run"], env=env,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            telegram.wait_polling(1, 60)  # listening: its first getUpdates
            yield Gateway(telegram, home, log, proc)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    finally:
        telegram.close()
