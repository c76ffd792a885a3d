"""The liaison plugin in the real Hermes gateway (hermes-agent 0.19.0, `hermes gateway
run`), installed by `coms-hermes-bridge liaison install`, against the fake Telegram
(tests/telegram_fake.py): the human's messages come in through getUpdates, and what
reaches the questions directory, the reactions and Hermes' own replies is read back
(X14, C7, C8, W21).

One gateway serves the whole module (it starts in about a second). Hermes has no model
here: a message the liaison leaves to Hermes gets Hermes' "Provider authentication
failed" reply, which is how a test knows the message went past the plugin untouched.
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

import pytest

from coms_hermes_bridge.messages.contract import format_question
from coms_hermes_bridge.messages.wire import ParsedPrompt, QuestionOption
from tests.bridge_process import ROOT
from tests.fakes import wait_for
from tests.hermes_venv import ensure_hermes_bin
from tests.telegram_fake import TOKEN, FakeTelegram, Seen, make_tls
from tests.test_real_hermes import RealBridge

pytestmark = pytest.mark.real_hermes

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
        return wait_for(lambda: len(replies()) >= count and replies(), WAIT,
                        f"{count} Hermes replies; gateway log:\n{self.tail()}")

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])


@contextmanager
def running_gateway(base: Path, config_yaml: str | None = None) -> Iterator[Gateway]:
    """`hermes gateway run` with the liaison installed, against a fresh fake Telegram; with
    `config_yaml`, Hermes' config.yaml says so (a model for it to call, say)."""
    hermes_bin = ensure_hermes_bin()
    tls = make_tls(base / "tls", hermes_bin / "python")
    telegram = FakeTelegram(tls)
    home = base / "home"
    (home / ".hermes").mkdir(parents=True, exist_ok=True)
    (home / ".hermes" / ".env").write_text(
        f"TELEGRAM_BOT_TOKEN={TOKEN}\nTELEGRAM_ALLOWED_USERS={HUMAN}\n"
        f"TELEGRAM_HOME_CHANNEL={HUMAN}\n", encoding="utf-8")
    if config_yaml is not None:
        (home / ".hermes" / "config.yaml").write_text(config_yaml, encoding="utf-8")
    bin_dir = base / "bin"
    bin_dir.mkdir()
    (bin_dir / "hermes").symlink_to(hermes_bin / "hermes")
    # a clean environment: no API keys, nothing of ours, hermes alone on PATH
    env = {"HOME": str(home), "PATH": f"{bin_dir}{os.pathsep}/usr/bin:/bin", "LANG": "C.UTF-8",
           **telegram.env(), "TELEGRAM_FALLBACK_IPS": "149.154.167.220",
           "TIRITH_ENABLED": "false", "HERMES_GATEWAY_LOCK_DIR": str(base / "locks")}
    installed = subprocess.run([str(ROOT / ".venv" / "bin" / "coms-hermes-bridge"), "liaison",
                                "install"], env=env, capture_output=True, text=True,
                               timeout=120, check=False)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    log = base / "gateway.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(bin_dir / "hermes"), "gateway", "run"], env=env,
                                stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    gw = Gateway(telegram, home, log, proc)
    try:
        telegram.wait_polling(1, 60)  # listening: its first getUpdates
        yield gw
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        telegram.close()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with running_gateway(tmp_path_factory.mktemp("gateway")) as gw:
        yield gw


def test_a_reply_to_the_question_is_written_and_acknowledged(gateway: Gateway) -> None:
    # X14, C7, C8: the replied-to bot message names the question; 👍 on the human's
    # message, and no reply of Hermes' (no agent turn)
    qid = gateway.qid()
    asked = gateway.question(qid)
    [sent] = gateway.telegram.send("  2  ", reply_to=asked)
    body = gateway.answer_file(qid)
    assert list(body) == ["qid", "answer", "answered_by", "at"]
    assert (body["qid"], body["answer"], body["answered_by"]) == (qid, "2", "telegram:alice")
    assert body["at"].endswith("Z") and len(body["at"]) == 24
    wait_for(lambda: (str(HUMAN), sent, ["👍"]) in gateway.telegram.reactions(), WAIT,
             f"the 👍; gateway log:\n{gateway.tail()}")
    assert LEFT_TO_HERMES not in " ".join(gateway.telegram.texts())


def test_the_typed_form_and_exact_text(gateway: Gateway) -> None:
    # X14: `HUB-Q:<qid>: <answer>` needs no reply; the answer is kept as typed (lines,
    # inner spaces, any script, emoji), trimmed at its ends; a user without a username
    # answers as telegram:<user id>
    qid = gateway.qid()
    text = "Ja — bitte 😀\n  zweite Zeile  \n\n日本語 «ok» \u200bend"
    [sent] = gateway.telegram.send(f"HUB-Q:{qid}:   {text}\n\n", username=None)
    body = gateway.answer_file(qid)
    assert (body["answer"], body["answered_by"]) == (text, f"telegram:{HUMAN}")
    wait_for(lambda: (str(HUMAN), sent, ["👍"]) in gateway.telegram.reactions(), WAIT, "the 👍")


def test_two_answers_in_one_event(gateway: Gateway) -> None:
    # X14: a reply and a typed answer sent together reach the gateway as one merged
    # event; the text before the first HUB-Q: line answers the replied-to question
    first, second = gateway.qid(), gateway.qid()
    asked = gateway.question(first)
    gateway.telegram.send("yes, the first", f"HUB-Q:{second}: no\nnot the second",
                          reply_to=asked)
    assert gateway.answer_file(first)["answer"] == "yes, the first"
    assert gateway.answer_file(second)["answer"] == "no\nnot the second"


def test_what_is_not_an_answer_is_left_to_hermes(gateway: Gateway) -> None:
    # X14: an unrelated message, a bad qid, an empty answer and a reply to a message
    # naming no question each go to Hermes as if the liaison were not there
    before = gateway.answers()
    already = len([t for t in gateway.telegram.texts() if LEFT_TO_HERMES in t])
    not_ours = gateway.telegram.bot_said("An ordinary message from Hermes.")
    messages = ["what's the weather like?", "HUB-Q:01HZY5B7R8XK3M9Q2W4E6T8Y0U: yes",
                f"HUB-Q:{gateway.qid()}:   "]
    for n, text in enumerate(messages, start=1):
        gateway.telegram.send(text)
        gateway.hermes_replies(already + n)  # one at a time: no merged event
    gateway.telegram.send("yes", reply_to=not_ours)
    gateway.hermes_replies(already + len(messages) + 1)
    assert gateway.answers() == before


def test_an_unauthorized_sender_writes_nothing(gateway: Gateway) -> None:
    # X14: only the gateway's authorized users answer. Hermes' Telegram adapter drops a
    # stranger's message before any hook runs (it logs so); the liaison's own check of
    # the gateway's verdict is the second lock (tests/test_liaison.py)
    qid = gateway.qid()
    gateway.telegram.send(f"HUB-Q:{qid}: yes", chat_id=777, user_id=777, username="mallory")
    hermes_log = gateway.home / ".hermes" / "logs" / "gateway.log"
    wait_for(lambda: "Blocked unauthorized user 777" in hermes_log.read_text(errors="replace"),
             WAIT, f"Hermes refusing user 777; gateway log:\n{gateway.tail()}")
    assert f"{qid}.answer.json" not in gateway.answers()


def test_the_whole_loop_from_agent_to_human_and_back(gateway: Gateway) -> None:
    # X14, W20, W21, C11: the daemon asks through the real `hermes send`, the human
    # replies to the question in Telegram, the gateway's liaison writes the answer file
    # and the daemon maps it and answers the asking agent
    bridge = RealBridge(ensure_hermes_bin(), gateway.telegram)
    try:
        bridge.start("--questions-dir", str(gateway.questions))
        bridge.log = gateway.questions.parent / "log.ndjson"  # beside its questions dir
        qid = bridge.ask(json.dumps({"question": "Deploy?", "options": ["Yes", "No"]}))

        def asked() -> Seen | None:
            return next((m for m in gateway.telegram.messages()
                         if m.text.startswith(f"❓ [HUB-Q:{qid}] Deploy?")), None)

        question = wait_for(asked, WAIT, f"the question {qid} in Telegram")
        [sent] = gateway.telegram.send("2", reply_to=question)
        response = bridge.asker.response(timeout=WAIT)
        assert (response["msg_id"], response["response"]) == (
            qid, {"kind": "selection", "selections": ["No"]})
        assert bridge.wait_log("answered", qid, timeout=WAIT)["qid"] == qid
        wait_for(lambda: (str(HUMAN), sent, ["👍"]) in gateway.telegram.reactions(), WAIT, "the 👍")
    finally:
        bridge.close()


def test_the_slash_command_lists_the_open_questions(gateway: Gateway) -> None:
    # X14: /hub in Telegram answers with `coms-hermes-bridge status` for every project
    # on the host (the command install recorded, the questions dir it recorded). The
    # bridge here registers in a coms dir of its own, so the gateway's status, reading
    # the state beside the questions dir, sees its question but not the bridge
    bridge = RealBridge(ensure_hermes_bin(), gateway.telegram)
    try:
        bridge.start("--project", "hubcmd", "--questions-dir", str(gateway.questions))
        bridge.log = gateway.questions.parent / "log.ndjson"
        qid = bridge.ask("Which way now?")
        bridge.wait_log("delivered", qid, timeout=WAIT)
        gateway.telegram.send("/hub")

        def listed() -> str | None:
            return next((m.text for m in gateway.telegram.messages()
                         if "bridge for project hubcmd: not running" in m.text), None)

        text = wait_for(listed, WAIT, f"the /hub answer; gateway log:\n{gateway.tail()}")
        block = text.split("bridge for project hubcmd: not running\n", 1)[1].splitlines()
        assert block[0] == "open questions: 1"
        assert block[2].split()[:3] == [qid, "builder", "delivered"]
        assert block[2].endswith("Which way now?")
    finally:
        bridge.close()
