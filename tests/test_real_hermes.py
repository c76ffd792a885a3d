"""The real `hermes send` (hermes-agent 0.19.0, in .venv-hermes) under the real daemon,
against a fake Telegram Bot API on 127.0.0.1 (tests/telegram_fake.py).

Each test reads what the human would read in Telegram: the rendered text of every
message that reached the chat, in order, after hermes' own formatting, parse-mode
fallbacks, splitting, retries and media handling. `just test-hermes` runs this group;
`just test` leaves it out (each send costs hermes' start-up, about 2 s).
"""

from __future__ import annotations

import json
import os
import subprocess
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.bridge_process import ROOT, Bridge
from tests.fakes import wait_for
from tests.telegram_fake import TOKEN, FakeTelegram, Tls, make_tls, utf16_len

pytestmark = pytest.mark.real_hermes

HOME_CHAT = "4242"  # TELEGRAM_HOME_CHANNEL: where `--to telegram` (the default) goes
WAIT = 40.0  # seconds: a few hermes runs on a loaded 2-core machine
INSTRUCTION = "\n\n↩ Reply to this message, or type: HUB-Q:{qid}: <answer>"


@pytest.fixture(scope="session")
def hermes_bin() -> Path:
    """The hermes venv's bin, made (or found up to date) by the project's script.

    A venv that cannot be made fails the group: it is never skipped."""
    made = subprocess.run(
        [str(ROOT / "scripts" / "ensure-hermes-venv")],
        capture_output=True, text=True, timeout=900,
    )
    if made.returncode != 0:
        pytest.fail(f"scripts/ensure-hermes-venv failed ({made.returncode}):\n{made.stderr}")
    bin_dir = Path(made.stdout.strip().splitlines()[-1])
    assert (bin_dir / "hermes").is_file(), bin_dir
    return bin_dir


@pytest.fixture(scope="session")
def tls(hermes_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Tls:
    return make_tls(tmp_path_factory.mktemp("tls"), hermes_bin / "python")


@pytest.fixture
def telegram(tls: Tls) -> Iterator[FakeTelegram]:
    fake = FakeTelegram(tls)
    yield fake
    fake.close()


class RealBridge(Bridge):
    """A Bridge whose PATH holds the real hermes (alone) instead of the fake script,
    with the bot token in ~/.hermes/.env and TELEGRAM_PROXY at the fake Telegram."""

    def __init__(self, hermes_bin: Path, telegram: FakeTelegram) -> None:
        super().__init__()
        self.telegram = telegram
        self.real_bin = self.base / "real-bin"
        self.real_bin.mkdir()
        (self.real_bin / "hermes").symlink_to(hermes_bin / "hermes")
        hermes_home = self.home / ".hermes"
        hermes_home.mkdir()
        (hermes_home / ".env").write_text(
            f"TELEGRAM_BOT_TOKEN={TOKEN}\nTELEGRAM_HOME_CHANNEL={HOME_CHAT}\n", encoding="utf-8"
        )

    def env(self, **extra: str) -> dict[str, str]:
        env = super().env()
        # hermes must see neither this checkout on its import path nor our own settings
        for key in [k for k in env if k.startswith(("HERMES_", "TELEGRAM_"))]:
            del env[key]
        env.pop("PYTHONPATH", None)
        env.update(self.telegram.env())
        env["PATH"] = f"{self.real_bin}{os.pathsep}{os.environ.get('PATH', '')}"
        env.update(extra)
        return env


@pytest.fixture
def bridge(hermes_bin: Path, telegram: FakeTelegram) -> Iterator[RealBridge]:
    b = RealBridge(hermes_bin, telegram)
    yield b
    b.close()


def question(qid: str, text: str, context: str = "From builder @ /work/app",
             options: str = "", *, group: bool = False) -> str:
    """C4 with X4's project line, as the human reads it (in a group, the typed form names
    the bot, X14)."""
    instruction = INSTRUCTION.format(qid=qid)
    if group:
        instruction = instruction.replace("type: ", "type: @<bot name> ")
    return (f"❓ [HUB-Q:{qid}] {text}\n\n📁 Project: default\n\nContext: {context}"
            + options + instruction)


def sends(telegram: FakeTelegram) -> list[tuple[str, int, str | None]]:
    """(method, status, parse_mode) of each Bot API send hermes made."""
    return [(c.method, c.status, c.params.get("parse_mode")) for c in telegram.calls()
            if c.method != "getMe"]


def readable(text: str) -> str:
    """Text as a reader takes it in: invisible format characters (zero-width spaces and
    the like) dropped, compatibility forms folded, case ignored."""
    visible = "".join(c for c in text if unicodedata.category(c) != "Cf")
    return unicodedata.normalize("NFKC", visible).casefold()


def response(bridge: Bridge, qid: str) -> dict[str, Any]:
    env = bridge.asker.response(timeout=WAIT)
    assert env["msg_id"] == qid, env
    return env


# -- every kind of message the bridge sends ---------------------------------------------


def test_plain_question_reaches_the_home_chat_as_plain_text(
    bridge: RealBridge, telegram: FakeTelegram
) -> None:
    # C2, C4, C6, X4: hermes tries HTML (the text holds `<answer>`), Telegram refuses the
    # unknown tag, hermes sends the same text again without a parse mode
    bridge.start()
    qid = bridge.ask("Deploy now? It's 5 < 7 & *safe*")
    bridge.wait_log("delivered", qid, timeout=WAIT)
    [seen] = telegram.messages()
    assert seen.chat_id == HOME_CHAT and seen.upload is None
    assert seen.text == question(qid, "Deploy now? It's 5 < 7 & *safe*")
    assert seen.parse_mode is None
    assert sends(telegram) == [("sendMessage", 400, "HTML"), ("sendMessage", 200, None)]
    assert "Unsupported start tag" in str(telegram.calls()[0].description)
    bridge.answer(qid, " yes ")
    assert response(bridge, qid)["response"] == {"kind": "freeform", "text": "yes"}


def test_json_question_with_context_and_options_to_a_forum_topic(
    bridge: RealBridge, telegram: FakeTelegram
) -> None:
    # C4, C6, C11: context and numbered options; `--to telegram:<chat>:<thread>`
    bridge.start("--to", "telegram:-100123:7")
    prompt = json.dumps({
        "question": "Ship the release?",
        "context": "CI is green (3/3). Coverage: 91%.",
        "options": [{"title": "Approve", "description": "Ship it"}, {"title": "Revise"}, "Stop"],
    })
    qid = bridge.ask(prompt)
    bridge.wait_log("delivered", qid, timeout=WAIT)
    [seen] = telegram.messages()
    assert (seen.chat_id, seen.thread_id) == ("-100123", "7")
    assert seen.text == question(
        qid, "Ship the release?", "CI is green (3/3). Coverage: 91%.",
        "\n\nOptions:\n1. Approve — Ship it\n2. Revise\n3. Stop", group=True,
    )
    bridge.answer(qid, "2")
    assert response(bridge, qid)["response"] == {"kind": "selection", "selections": ["Revise"]}


def test_a_long_question_arrives_as_one_message_cut_by_the_bridge(
    bridge: RealBridge, telegram: FakeTelegram
) -> None:
    # C5: the bridge cuts the context to fit 4096 UTF-16 units (😀 is 2), so hermes has
    # nothing to split: one message, no " (1/2)" parts
    bridge.start()
    prompt = json.dumps({"question": "Read this?", "context": "😀" * 1000 + "x" * 3000,
                         "options": ["Yes", "No"]})
    qid = bridge.ask(prompt)
    bridge.wait_log("delivered", qid, timeout=WAIT)
    [seen] = telegram.messages()
    assert utf16_len(seen.text) == 4096
    assert seen.text.startswith(
        f"❓ [HUB-Q:{qid}] Read this?\n\n📁 Project: default\n\nContext: 😀😀"
    )
    assert seen.text.endswith("xx…\n\nOptions:\n1. Yes\n2. No" + INSTRUCTION.format(qid=qid))
    assert "(1/2)" not in seen.text


def test_cancel_note_then_late_answer_note(bridge: RealBridge, telegram: FakeTelegram) -> None:
    # C13, C15: notes have no `<tag>`, so hermes sends them as MarkdownV2 (escaped) and
    # Telegram shows them word for word
    bridge.start()
    qid = bridge.ask("Are you there?")
    bridge.wait_log("delivered", qid, timeout=WAIT)
    bridge.cancel(qid)
    telegram.wait_messages(2, timeout=WAIT)
    cancel = telegram.messages()[1]
    assert cancel.text == (
        f"✖ [HUB-Q:{qid}] The question was cancelled — it was answered from the console."
    )
    assert cancel.parse_mode == "MarkdownV2"
    bridge.answer(qid, "yes")
    telegram.wait_messages(3, timeout=WAIT)
    assert telegram.texts()[2] == (
        f"ℹ [HUB-Q:{qid}] This question is already closed; the late answer was ignored."
    )
    assert sends(telegram)[2:] == [("sendMessage", 200, "MarkdownV2")] * 2
    bridge.no_response()


def test_timeout_note(bridge: RealBridge, telegram: FakeTelegram) -> None:
    # C17
    bridge.start("--timeout", "3000")
    qid = bridge.ask("Quick one?")
    env = response(bridge, qid)
    assert (env["response"], env["error"]) == (None, "no remote answer within 3000ms")
    telegram.wait_messages(2, timeout=WAIT)
    assert telegram.texts() == [
        question(qid, "Quick one?"),
        f"⌛ [HUB-Q:{qid}] The question timed out after 3000ms.",
    ]


def test_unreadable_answer_note(bridge: RealBridge, telegram: FakeTelegram) -> None:
    # X7: the reason's underscore survives (MarkdownV2 escapes it; the fallback that
    # strips `_` is not taken)
    bridge.start()
    qid = bridge.ask("Which one?")
    bridge.wait_log("delivered", qid, timeout=WAIT)
    bridge.drop(f"{qid}.answer.json", json.dumps({
        "qid": qid, "answer": 5, "answered_by": "telegram:alice", "at": "2026-11-30T12:00:00Z",
    }).encode())
    telegram.wait_messages(2, timeout=WAIT)
    assert telegram.texts()[1] == (
        f"⚠ [HUB-Q:{qid}] Your answer could not be read (invalid_schema); please reply again."
    )
    assert telegram.messages()[1].parse_mode == "MarkdownV2"
    assert bridge.ping()["agent_card"]["queue_depth"] == 1


# -- hermes' faults -----------------------------------------------------------------


def test_chat_not_found_is_the_askers_error(bridge: RealBridge, telegram: FakeTelegram) -> None:
    # C18: hermes exits 1 and says why; the asker gets it at once, nothing reached a chat
    telegram.configure(unknown_chats=("999",))
    bridge.start("--to", "telegram:999")
    qid = bridge.ask("Anyone?")
    env = response(bridge, qid)
    assert env["response"] is None
    assert env["error"] == "hermes send failed (1): hermes send: Telegram send failed: Chat not found"
    assert bridge.wait_log("delivery_error", qid)["detail"] == {"error": env["error"]}
    assert telegram.messages() == []
    assert bridge.ping()["agent_card"]["queue_depth"] == 0


def test_a_429_is_waited_out_and_the_question_arrives_once(
    bridge: RealBridge, telegram: FakeTelegram
) -> None:
    # C2: hermes sleeps `retry_after` and tries again (3 tries in all)
    telegram.configure(too_many=1, retry_after=1)
    bridge.start()
    qid = bridge.ask("Still there?")
    bridge.wait_log("delivered", qid, timeout=WAIT)
    assert telegram.texts() == [question(qid, "Still there?")]
    assert sends(telegram) == [
        ("sendMessage", 429, "HTML"), ("sendMessage", 400, "HTML"), ("sendMessage", 200, None),
    ]
    bridge.no_response()


def test_telegram_answering_after_hermes_gave_up(
    bridge: RealBridge, telegram: FakeTelegram
) -> None:
    # C18: the human has the question, yet hermes timed out (5 s) and exited 1: for the
    # bridge it is a failed delivery, and the asker is told so; X11: when the human
    # answers it all the same, they are told the answer was not passed on
    telegram.configure(delay=7.0)
    bridge.start()
    qid = bridge.ask("Slow network?")
    env = response(bridge, qid)
    assert env["error"] == "hermes send failed (1): hermes send: Telegram send failed: Timed out"
    assert telegram.texts() == [question(qid, "Slow network?")]
    assert bridge.wait_log("delivery_error", qid)["detail"] == {"error": env["error"]}
    telegram.configure()
    bridge.answer(qid, "yes")
    telegram.wait_messages(2, timeout=WAIT)
    assert telegram.texts()[1] == (
        f"ℹ [HUB-Q:{qid}] This question could not be confirmed delivered; its asker was "
        "told it failed, so this answer was not passed on."
    )
    bridge.no_response()


def test_telegram_unreachable(bridge: RealBridge, telegram: FakeTelegram) -> None:
    # C18: a proxy that refuses the tunnel (502; hermes retries twice, 1 s then 2 s) and
    # one that hangs up; each question fails with hermes' words and reaches nobody
    telegram.configure(unreachable="refuse")
    bridge.start()
    refused = bridge.ask("Through a wall?")
    env = response(bridge, refused)
    assert env["error"] == (
        "hermes send failed (1): hermes send: Telegram send failed: httpx.ProxyError: "
        "502 Bad Gateway"
    )
    assert telegram.connects() == ["CONNECT api.telegram.org:443"] * 3
    telegram.configure(unreachable="close")
    dropped = bridge.ask("And now?")
    env = response(bridge, dropped)
    assert env["error"] == (
        "hermes send failed (1): hermes send: Telegram send failed: "
        "httpx.RemoteProtocolError: Server disconnected without sending a response."
    )
    assert len(telegram.connects()) == 4
    assert telegram.calls() == [] and telegram.messages() == []


# -- X8: agent text carries no directive hermes acts on ------------------------------


def test_media_tags_and_directives_in_agent_text_upload_nothing(
    bridge: RealBridge, telegram: FakeTelegram
) -> None:
    # X8: hermes would upload any existing file a `MEDIA:<path>` tag names (any case,
    # spaces after the colon, quoted paths) and obey `[[as_document]]`, and cut the tags
    # out of the text; the bridge must defuse them so that nothing is uploaded, the
    # words stay readable, and the asker still gets its own option title back
    shot, photo = bridge.base / "shot.png", bridge.base / "photo.jpg"
    shot.write_bytes(b"\x89PNG\r\n\x1a\n not really")
    photo.write_bytes(b"\xff\xd8\xff not really")
    title = f"Ship MEDIA:{shot}"
    bridge.start()
    prompt = json.dumps({
        "question": f"Look at MEDIA:{shot} first?",
        "context": f"See Media: '{photo}' and [[as_document]] too.",
        "options": [title, "[[as_document]] Hold"],
    })
    qid = bridge.ask(prompt)
    bridge.wait_log("delivered", qid, timeout=WAIT)
    wait_for(lambda: telegram.messages(), WAIT, "the question")
    uploads = [(c.method, u.field, u.filename) for c in telegram.calls() for u in c.uploads]
    assert uploads == []
    assert {c.method for c in telegram.calls()} == {"sendMessage"}
    [seen] = telegram.messages()
    assert seen.upload is None
    shown = readable(seen.text)
    for words in ("Look at MEDIA", str(shot), "first?", "See Media", str(photo),
                  "as_document", "too.", "Ship MEDIA", "Hold"):
        assert readable(words) in shown, (words, seen.text)
    bridge.answer(qid, "1")
    assert response(bridge, qid)["response"] == {"kind": "selection", "selections": [title]}
