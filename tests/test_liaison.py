"""The liaison plugin's own rules (coms_hermes_bridge/liaison/): what a message answers,
the answer file it writes, and what its hook tells Hermes (X14, C7, C8, W21). The real
gateway runs it in tests/test_liaison_gateway.py."""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import stat
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from coms_hermes_bridge import liaison
from coms_hermes_bridge.liaison.answers import (
    Answer,
    read_answers,
    replied_qid,
    turn_answers,
    write_answer,
)
from coms_hermes_bridge.messages.contract import format_question, late_note
from coms_hermes_bridge.messages.wire import AnswerFile, ParsedPrompt

Q1 = "01HZY5B7R8XK3M9Q2W4E6T8Y0A"
Q2 = "01HZY5B7R8XK3M9Q2W4E6T8Y0B"
BAD = "01HZY5B7R8XK3M9Q2W4E6T8Y0U"  # U is no Crockford digit


@pytest.mark.parametrize(
    ("text", "qid"),
    [
        (format_question(Q1, ParsedPrompt(question="Ship?")), Q1),  # C4's question
        (late_note(Q1), Q1),  # any message of ours that names one question
        (f"[HUB-Q:{Q1}] and [HUB-Q:{Q2}]", None),  # two: ambiguous
        (f"[HUB-Q:{Q1}] and [HUB-Q:{Q1}]", None),  # one, twice: still not exactly one tag
        (f"[HUB-Q:{BAD}]", None),
        (f"[HUB-Q:{Q1.lower()}]", None),
        (f"[HUB-Q:{Q1}] [HUB-Q:nonsense]", None),  # a broken second tag is still a second
        (f"HUB-Q:{Q1}: only the typed form", None),
        ("no marker at all", None),
        ("", None),
        (None, None),
    ],
)
def test_the_question_a_bot_message_names(text: str | None, qid: str | None) -> None:
    # X14: a reply answers the question its bot message carries exactly one tag of
    assert replied_qid(text) == qid


@pytest.mark.parametrize(
    ("text", "replied", "answers"),
    [
        # a reply: the whole text, trimmed at its ends only
        ("  yes, ship it \n", Q1, [(Q1, "yes, ship it")]),
        ("line one\n  line two  \n\nline four", Q1, [(Q1, "line one\n  line two  \n\nline four")]),
        ("héllo 😀 — «ok»\t", Q1, [(Q1, "héllo 😀 — «ok»")]),
        ("   \n\t ", Q1, []),  # empty once trimmed: no answer
        ("", Q1, []),
        # the typed form, with or without a space after the colon
        (f"HUB-Q:{Q1}: 2", None, [(Q1, "2")]),
        (f"HUB-Q:{Q1}:no space", None, [(Q1, "no space")]),
        (f"HUB-Q:{Q1}:\nnext line\n  kept  ", None, [(Q1, "next line\n  kept")]),
        (f"HUB-Q:{Q1}:   ", None, []),
        (f"HUB-Q:{BAD}: yes", None, []),  # bad qid: left to Hermes
        (f"HUB-Q:{Q1.lower()}: yes", None, []),
        (f"HUB-Q:{Q1} yes", None, []),  # no colon after the qid
        (f"hub-q:{Q1}: yes", None, []),  # the marker is upper case, as we write it
        (f" HUB-Q:{Q1}: yes", None, []),  # a line must start with it
        (f"please: HUB-Q:{Q1}: yes", None, []),
        ("just chatting", None, []),
        # several answers in one (merged) event: each runs to the next HUB-Q: line
        (f"HUB-Q:{Q1}: yes\nHUB-Q:{Q2}: no\nreally no", None, [(Q1, "yes"), (Q2, "no\nreally no")]),
        (f"for the reply\nHUB-Q:{Q2}: two", Q1, [(Q1, "for the reply"), (Q2, "two")]),
        (f"before\nHUB-Q:{Q2}: two", None, [(Q2, "two")]),  # no reply: Hermes' text
        (f"HUB-Q:{Q1}: one\nHUB-Q:{BAD}: no qid\nits line\nHUB-Q:{Q2}: two", None,
         [(Q1, "one"), (Q2, "two")]),  # a bad head ends one answer, and the next is whole
        (f"HUB-Q:{Q1}:\nHUB-Q:{Q2}: two", None, [(Q2, "two")]),
        (f"HUB-Q:{Q2}: typed wins\n", Q1, [(Q2, "typed wins")]),  # nothing before: no reply answer
        # CR LF as typed stays inside the answer, its ends trimmed
        (f"HUB-Q:{Q1}: a\r\nb\r\nHUB-Q:{Q2}: c", None, [(Q1, "a\r\nb"), (Q2, "c")]),
    ],
)
def test_the_answers_a_message_carries(
    text: str, replied: str | None, answers: list[tuple[str, str]]
) -> None:
    # X14, W21
    assert read_answers(text, replied).answers == [Answer(q, t) for q, t in answers]


@pytest.mark.parametrize(
    ("text", "replied", "rest"),
    [
        (f"HUB-Q:{Q1}: yes\nHUB-Q:{Q2}: no", None, ""),
        ("for the reply", Q1, ""),
        (f"hello\nHUB-Q:{Q1}: yes", None, "hello"),  # no reply: the chat before is Hermes'
        (f"HUB-Q:{Q1}: one\nHUB-Q:{BAD}: no qid\n  its line\nHUB-Q:{Q2}: two", None,
         f"HUB-Q:{BAD}: no qid\n  its line"),  # the bad head and its lines, as typed
        (f"yes\nHUB-Q:{BAD}: typo", Q1, f"HUB-Q:{BAD}: typo"),
        (f"HUB-Q:{Q1}:  \nHUB-Q:{Q2}: two", None, f"HUB-Q:{Q1}:"),  # an empty answer
        (f"HUB-Q:{BAD}: only junk", None, f"HUB-Q:{BAD}: only junk"),
        ("just chatting\n", None, "just chatting"),
    ],
)
def test_what_answers_nothing_is_the_rest(text: str, replied: str | None, rest: str) -> None:
    # X14: a merged event's text that is no answer (text before the first HUB-Q: line
    # with no reply, a bad qid's line and its own, an empty answer) is left to Hermes
    assert read_answers(text, replied).rest == rest


def test_the_answer_file_is_c8_private_and_renamed_into_place(tmp_path: Path) -> None:
    # C7, C8, W21: exactly four fields, mode 0600, no temporary left behind
    where = tmp_path / "questions"
    path = write_answer(where, Answer(Q1, "ja\nnee 😀"), "telegram:alice", "2026-01-02T03:04:05.678Z")
    assert path == where / f"{Q1}.answer.json"
    assert sorted(p.name for p in where.iterdir()) == [f"{Q1}.answer.json"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(where.stat().st_mode) == 0o700
    assert json.loads(path.read_text(encoding="utf-8")) == {
        "qid": Q1, "answer": "ja\nnee 😀", "answered_by": "telegram:alice",
        "at": "2026-01-02T03:04:05.678Z",
    }
    # the daemon's own model of the file accepts it as written (C8)
    assert AnswerFile.model_validate_json(path.read_bytes()).answer == "ja\nnee 😀"


def test_questions_dir_is_the_recorded_one_else_c7s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # C7: ~/.pi/coms/hermes-bridge/questions unless install recorded another
    monkeypatch.setenv("HOME", str(tmp_path))
    assert liaison.questions_dir(tmp_path) == tmp_path / ".pi/coms/hermes-bridge/questions"
    (tmp_path / "liaison.json").write_text('{"questions_dir": "/srv/q"}', encoding="utf-8")
    assert liaison.questions_dir(tmp_path) == Path("/srv/q")
    (tmp_path / "liaison.json").write_text("not json", encoding="utf-8")
    assert liaison.questions_dir(tmp_path) == tmp_path / ".pi/coms/hermes-bridge/questions"


# -- the hook, with stand-ins for what Hermes hands it --------------------------------

BOT_ID = 777


class Gateway:
    def __init__(self, allowed: set[str]) -> None:
        self.allowed = allowed
        self.asked: list[str] = []

    def _is_user_authorized(self, source: Any) -> bool:
        self.asked.append(source.user_id)
        return str(source.user_id) in self.allowed


class Platform(enum.Enum):  # Hermes' own is an Enum of the same values
    TELEGRAM = "telegram"
    DISCORD = "discord"


def event(text: str, *, reply_text: str | None = None, reply_from: int = BOT_ID,
          user_id: str = "42", username: str | None = "alice", platform: str = "telegram",
          edited: bool = False) -> Any:
    bot = SimpleNamespace(id=BOT_ID)
    reply = (None if reply_text is None else
             SimpleNamespace(text=reply_text, from_user=SimpleNamespace(id=reply_from)))
    raw = SimpleNamespace(reply_to_message=reply, get_bot=lambda: bot,
                          from_user=SimpleNamespace(id=int(user_id), username=username),
                          edit_date=datetime.now() if edited else None)
    source = SimpleNamespace(platform=Platform(platform), user_id=user_id)
    return SimpleNamespace(text=text, raw_message=raw, source=source)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path / ".pi/coms/hermes-bridge/questions"


def files(where: Path) -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text(encoding="utf-8")) for p in sorted(where.glob("*"))} \
        if where.is_dir() else {}


def test_a_reply_to_our_question_is_answered_and_skipped(home: Path) -> None:
    # X14: written, then {"action": "skip"} so no agent turn follows
    gateway = Gateway({"42"})
    question = format_question(Q1, ParsedPrompt(question="Ship?"))
    result = liaison.on_gateway_dispatch(event=event(" yes ", reply_text=question),
                                         gateway=gateway, session_store=None)
    assert result == {"action": "skip", "reason": f"hub-liaison answered {Q1}"}
    [(name, body)] = files(home).items()
    assert name == f"{Q1}.answer.json"
    assert (body["qid"], body["answer"], body["answered_by"]) == (Q1, "yes", "telegram:alice")
    datetime.fromisoformat(body["at"])
    assert gateway.asked == ["42"]


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda: event("yes", reply_text=f"❓ [HUB-Q:{Q1}] Ship?", reply_from=5), "a human's"),
        (lambda: event("yes", reply_text="an ordinary bot message"), "no tag"),
        (lambda: event("hello there"), "no marker"),
        (lambda: event(f"HUB-Q:{BAD}: yes"), "bad qid"),
        (lambda: event(f"HUB-Q:{Q1}:  "), "empty answer"),
        (lambda: event(f"HUB-Q:{Q1}: yes", platform="discord"), "not Telegram"),
        (lambda: event(f"HUB-Q:{Q1}: yes", user_id="99"), "not authorized"),
    ],
)
def test_everything_else_is_left_to_hermes(home: Path, make: Any, why: str) -> None:
    # X14: None, and nothing written
    assert liaison.on_gateway_dispatch(event=make(), gateway=Gateway({"42"})) is None, why
    assert files(home) == {}, why


def test_answers_with_text_that_answers_nothing_leave_that_text_to_hermes(home: Path) -> None:
    # X14: the answers are written; the rest goes on to Hermes as the message's text, so
    # a slip (a bad qid) is seen by Hermes, not dropped
    result = liaison.on_gateway_dispatch(
        event=event(f"HUB-Q:{Q1}: yes\nHUB-Q:{BAD}: typo"), gateway=Gateway({"42"}))
    assert result == {"action": "rewrite", "text": f"HUB-Q:{BAD}: typo"}
    assert files(home)[f"{Q1}.answer.json"]["answer"] == "yes"


def test_an_edited_answer_writes_nothing_and_says_so(home: Path) -> None:
    # X14: Telegram delivers an edit as a message of its own; the answer as first sent
    # stands, so the edit writes no second file, reaches no agent, and the human is told
    e = event(f"HUB-Q:{Q1}: changed my mind", edited=True)
    message = Message(refuse_reaction=False)
    e.raw_message.set_reaction = message.set_reaction
    e.raw_message.reply_text = message.reply_text

    async def dispatch() -> None:
        assert liaison.on_gateway_dispatch(event=e, gateway=Gateway({"42"})) == {
            "action": "skip", "reason": "hub-liaison answered nothing (an edit)"}
        await asyncio.wait_for(asyncio.gather(*liaison._acks), 5)

    asyncio.run(dispatch())
    assert files(home) == {}
    assert message.done == [("reply", liaison.EDIT_TEXT)]
    # an edit that is no answer is Hermes' as any message is
    assert liaison.on_gateway_dispatch(event=event("typo fixed", edited=True),
                                       gateway=Gateway({"42"})) is None


def test_answered_by_falls_back_to_the_user_id(home: Path) -> None:
    # C8: telegram:<username or user id>
    liaison.on_gateway_dispatch(event=event(f"HUB-Q:{Q1}: ok", username=None), gateway=Gateway({"42"}))
    assert files(home)[f"{Q1}.answer.json"]["answered_by"] == "telegram:42"


def test_a_gateway_without_an_authorization_check_is_said_once_and_left_alone(
    home: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # X14: without the gateway's check nobody may answer; one line in Hermes' log
    monkeypatch.setattr(liaison, "_said_no_authorization", False)
    caplog.set_level(logging.WARNING, logger="hermes_plugins.hub-liaison")
    for _ in range(3):
        assert liaison.on_gateway_dispatch(event=event(f"HUB-Q:{Q1}: ok"), gateway=object()) is None
    assert files(home) == {}
    said = [r.getMessage() for r in caplog.records if "_is_user_authorized" in r.getMessage()]
    assert said == ["hub-liaison: this Hermes gateway has no _is_user_authorized; answers are "
                    "left to Hermes"]


def unwritable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
               caplog: pytest.LogCaptureFixture) -> None:
    """Answers go where no directory can be made (a file is in the way); errors logged."""
    blocked = tmp_path / "file"
    blocked.write_text("not a directory", encoding="utf-8")
    monkeypatch.setattr(liaison, "questions_dir", lambda folder=None: blocked / "questions")
    caplog.set_level(logging.ERROR, logger="hermes_plugins.hub-liaison")


def test_a_write_that_fails_lets_the_message_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # X14: a fault of ours never breaks the gateway: logged, and Hermes gets the message
    unwritable(tmp_path, monkeypatch, caplog)
    assert liaison.on_gateway_dispatch(event=event(f"HUB-Q:{Q1}: ok"), gateway=Gateway({"42"})) is None
    assert any("could not write an answer" in r.getMessage() for r in caplog.records)


def test_register_hooks_both_hooks_and_the_slash_command() -> None:
    # X14: the two hooks, under Hermes' names for them, and /hub
    hooks: list[tuple[str, Any]] = []
    commands: list[tuple[str, Any, str]] = []
    liaison.register(SimpleNamespace(
        register_hook=lambda name, fn: hooks.append((name, fn)),
        register_command=lambda name, fn, description: commands.append((name, fn, description)),
    ))
    assert hooks == [("pre_gateway_dispatch", liaison.on_gateway_dispatch),
                     ("pre_llm_call", liaison.on_llm_call)]
    assert commands == [("hub", liaison.open_questions,
                         "open coms questions of every project on this host")]


def script(path: Path, body: str) -> Path:
    path.write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ('echo "$@"', "status --questions-dir /srv/q"),  # the recorded command and directory
        ("echo oops >&2; exit 1", "oops"),  # what it said, where it said it
        ("exit 3", "coms-hermes-bridge status printed nothing (exit 3)."),
    ],
)
def test_the_slash_command_is_the_bridges_own_status(tmp_path: Path, body: str, said: str) -> None:
    # X14: /hub runs `coms-hermes-bridge status` (no shell) and says what it printed
    command = script(tmp_path / "chb", body)
    (tmp_path / "liaison.json").write_text(
        json.dumps({"questions_dir": "/srv/q", "command": str(command)}), encoding="utf-8")
    assert asyncio.run(liaison.open_questions("", tmp_path)) == said


def test_the_slash_command_without_the_bridge_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # X14: one line, never an exception into the gateway
    monkeypatch.setenv("PATH", str(tmp_path))
    assert asyncio.run(liaison.open_questions("", tmp_path)) == (
        "coms-hermes-bridge is not installed where the gateway can run it.")
    (tmp_path / "liaison.json").write_text(json.dumps({"command": str(tmp_path / "gone")}))
    said = asyncio.run(liaison.open_questions("", tmp_path))
    assert said.startswith(f"cannot run {tmp_path / 'gone'}: "), said


class Message:
    """What the ack touches of python-telegram-bot's Message: it records, or refuses."""

    def __init__(self, refuse_reaction: bool) -> None:
        self.refuse_reaction = refuse_reaction
        self.done: list[tuple[str, str]] = []

    async def set_reaction(self, reaction: str) -> bool:
        if self.refuse_reaction:
            raise RuntimeError("Bad Request: REACTION_INVALID")
        self.done.append(("reaction", reaction))
        return True

    async def reply_text(self, text: str) -> None:
        self.done.append(("reply", text))


@pytest.mark.parametrize(
    ("refuse", "done"),
    [(False, [("reaction", "👍")]), (True, [("reply", "👍 Answer passed on.")])],
)
def test_the_answer_is_acknowledged_with_a_reaction_else_one_reply(
    home: Path, refuse: bool, done: list[tuple[str, str]]
) -> None:
    # X14: 👍 on the human's message, in the gateway's loop, after the skip is returned
    e = event(f"HUB-Q:{Q1}: ok")
    message = Message(refuse)
    e.raw_message.set_reaction = message.set_reaction
    e.raw_message.reply_text = message.reply_text

    async def dispatch() -> None:
        assert liaison.on_gateway_dispatch(event=e, gateway=Gateway({"42"})) is not None
        assert message.done == []  # not awaited inside the hook: the gateway never waits
        await asyncio.wait_for(asyncio.gather(*liaison._acks), 5)

    asyncio.run(dispatch())
    assert message.done == done


# -- a busy chat on Hermes 0.19: the adapter's busy-session handler, guarded -------------


class Adapter:
    """What the guard touches of Hermes 0.19's platform adapter: its busy-session handler
    (here recording what reached it) and the setter Hermes itself uses."""

    def __init__(self) -> None:
        self.reached: list[str] = []
        self._busy_session_handler: Any = self.hermes_busy_path

    async def hermes_busy_path(self, event: Any, session_key: str) -> bool:
        self.reached.append(event.text)
        return True

    def set_busy_session_handler(self, handler: Any) -> None:
        self._busy_session_handler = handler


class BusyGateway(Gateway):
    def __init__(self, allowed: set[str], adapter: Any) -> None:
        super().__init__(allowed)
        self.adapters = {Platform.TELEGRAM: adapter}


@pytest.fixture
def said_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(liaison, "_busy_path_said", False)


def busy(adapter: Adapter, e: Any) -> Any:
    """A message in a busy chat, as Hermes' adapter hands it to its busy handler."""
    async def run() -> Any:
        handled = await adapter._busy_session_handler(e, "session")
        await asyncio.wait_for(asyncio.gather(*liaison._acks), 5)
        return handled
    return asyncio.run(run())


def test_a_busy_chats_answer_is_taken_before_hermes_busy_path(
    home: Path, monkeypatch: pytest.MonkeyPatch, said_nothing: None
) -> None:
    # X14: on Hermes 0.19 the first message the gateway dispatches wraps the adapter's
    # busy-session handler, once; an answer there is written and handled (no interrupt,
    # no replayed turn); anything else, and the rest of a message, reach Hermes' path
    monkeypatch.setattr(liaison, "_hermes_version", lambda: "0.19.0")
    adapter = Adapter()
    gateway = BusyGateway({"42"}, adapter)
    for _ in range(2):
        assert liaison.on_gateway_dispatch(event=event("make the chat busy"), gateway=gateway) is None
    assert busy(adapter, event("what now?")) is True
    assert adapter.reached == ["what now?"]  # wrapped once: Hermes' path ran once
    assert busy(adapter, event(f"HUB-Q:{Q1}: ok")) is True
    assert adapter.reached == ["what now?"]
    assert files(home)[f"{Q1}.answer.json"]["answer"] == "ok"
    busy(adapter, event(f"HUB-Q:{Q2}: two\nHUB-Q:{BAD}: typo"))
    busy(adapter, event(f"HUB-Q:{Q1}: a stranger's", user_id="99"))
    assert adapter.reached == ["what now?", f"HUB-Q:{BAD}: typo", f"HUB-Q:{Q1}: a stranger's"]
    assert files(home)[f"{Q2}.answer.json"]["answer"] == "two"
    assert files(home)[f"{Q1}.answer.json"]["answer"] == "ok"


@pytest.mark.parametrize(
    ("version", "adapter"),
    [("0.20.0", Adapter()), ("", Adapter()), ("0.19.0", SimpleNamespace())],
)
def test_another_hermes_keeps_its_busy_path_and_it_is_said_once(
    home: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    said_nothing: None, version: str, adapter: Any
) -> None:
    # X14: private Hermes code only on the version read and only where its names are;
    # otherwise one line in Hermes' log, and pre_llm_call answers from the turn
    monkeypatch.setattr(liaison, "_hermes_version", lambda: version)
    caplog.set_level(logging.WARNING, logger="hermes_plugins.hub-liaison")
    before = getattr(adapter, "_busy_session_handler", None)
    for _ in range(3):
        liaison.on_gateway_dispatch(event=event("hello"), gateway=BusyGateway({"42"}, adapter))
    assert getattr(adapter, "_busy_session_handler", None) == before
    assert [r.getMessage() for r in caplog.records] == [
        f"hub-liaison: Hermes {version or '(unknown version)'} has no busy-session handler "
        "this liaison knows; answers in a busy chat are taken from the agent's turn"]


# -- a busy chat elsewhere: the answer comes back as a turn, seen by pre_llm_call --------

QUESTION = format_question(Q1, ParsedPrompt(question="Ship?"))


def quoted(quote: str, text: str) -> str:
    """The user message of a Telegram reply, as Hermes 0.19.0 words it for the turn."""
    return f'[Replying to: "{quote[:500]}"]\n\n{text}'


@pytest.fixture(autouse=True)
def fresh_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with a gateway that has written nothing and met nobody."""
    monkeypatch.setattr(liaison, "_written", liaison.OrderedDict())
    monkeypatch.setattr(liaison, "_usernames", liaison.OrderedDict())


@pytest.mark.parametrize(
    ("message", "answers"),
    [
        (quoted(QUESTION, "  yes  "), [(Q1, "yes")]),
        (quoted(QUESTION, f"first\nHUB-Q:{Q2}: second"), [(Q1, "first"), (Q2, "second")]),
        (f"HUB-Q:{Q1}: typed, no reply", [(Q1, "typed, no reply")]),
        (quoted("an ordinary message", f"HUB-Q:{Q2}: typed in a reply"), [(Q2, "typed in a reply")]),
        (quoted(f"[HUB-Q:{Q1}] and [HUB-Q:{Q2}]", "yes"), []),  # two tags: ambiguous
        (quoted("an ordinary message", "yes"), []),
        (quoted(QUESTION, "   "), []),
        (f'[Replying to your previous message: "{QUESTION}"]\n\nyes', []),  # not Telegram's
        (f'[Replying to: "{QUESTION}"] yes', []),  # not Hermes' framing
        (f"[HUB-Q:{Q1}] yes, quoted by hand", []),  # a tag typed in the text is no reply
        ("what's the weather like?", []),
        # the quote ends at the first `"]` and blank line; a quote carrying one loses its tail
        (quoted(f'say "x"]\n\n[HUB-Q:{Q1}]', "yes"), []),
    ],
)
def test_the_answers_a_turn_carries(message: str, answers: list[tuple[str, str]]) -> None:
    # X14: a busy chat's answer, read from the turn's user message
    assert turn_answers(message) == [Answer(q, t) for q, t in answers]


def test_a_busy_chats_answer_is_written_once_and_the_model_told(home: Path) -> None:
    # X14, C7, C8: written from the turn, the model told it was delivered; the same turn
    # replayed (an interrupted follow-up) writes nothing more
    said = liaison.on_llm_call(user_message=quoted(QUESTION, " 2 "), platform="telegram",
                               sender_id="42", session_id="s", model="m")
    assert said == {"context": (
        f"[hub-liaison: this message is the human's answer to [HUB-Q:{Q1}]. It has already "
        "been delivered to the coms bridge, which passes it to the agent that asked. Do not "
        "act on it or answer it yourself; at most acknowledge it in one short line.]")}
    [(name, body)] = files(home).items()
    assert name == f"{Q1}.answer.json"
    assert list(body) == ["qid", "answer", "answered_by", "at"]
    assert (body["qid"], body["answer"], body["answered_by"]) == (Q1, "2", "telegram:42")
    (home / name).unlink()  # the bridge took it
    assert liaison.on_llm_call(user_message=quoted(QUESTION, " 2 "), platform="telegram",
                               sender_id="42") == said
    assert files(home) == {}


def test_an_answer_pre_gateway_dispatch_wrote_is_not_written_again(home: Path) -> None:
    # X14: one file per answer, whichever hook sees it first; the username an earlier
    # event of the sender carried (an answer or not) names them in a busy-chat answer
    liaison.on_gateway_dispatch(event=event("make the chat busy"), gateway=Gateway({"42"}))
    liaison.on_gateway_dispatch(event=event(f"HUB-Q:{Q1}: ok", username=None),
                                gateway=Gateway({"42"}))
    (home / f"{Q1}.answer.json").unlink()
    said = liaison.on_llm_call(user_message=f"HUB-Q:{Q1}: ok\nHUB-Q:{Q2}: no",
                               platform="telegram", sender_id="42")
    assert said is not None and f"[HUB-Q:{Q1}], [HUB-Q:{Q2}]" in said["context"]
    assert list(files(home)) == [f"{Q2}.answer.json"]
    assert files(home)[f"{Q2}.answer.json"]["answered_by"] == "telegram:alice"


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"user_message": "hello there", "platform": "telegram"}, "no answer"),
        ({"user_message": f"HUB-Q:{Q1}: yes", "platform": "discord"}, "not Telegram"),
        ({"user_message": f"HUB-Q:{Q1}: yes", "platform": ""}, "the CLI, cron"),
        ({"user_message": [{"type": "text", "text": f"HUB-Q:{Q1}: yes"}],
          "platform": "telegram"}, "multimodal"),
        ({}, "nothing at all"),
    ],
)
def test_every_other_turn_is_left_alone(home: Path, kwargs: dict[str, Any], why: str) -> None:
    # X14: None (nothing added to the turn), and nothing written
    assert liaison.on_llm_call(**kwargs, sender_id="42") is None, why
    assert files(home) == {}, why


def test_a_turns_write_that_fails_leaves_the_turn_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # X14: a fault of ours is logged, the turn runs untold, and a replay tries again
    unwritable(tmp_path, monkeypatch, caplog)
    turn = {"user_message": f"HUB-Q:{Q1}: ok", "platform": "telegram", "sender_id": "42"}
    assert liaison.on_llm_call(**turn) is None
    assert any("could not write an answer" in r.getMessage() for r in caplog.records)
    monkeypatch.setattr(liaison, "questions_dir", lambda folder=None: tmp_path / "questions")
    assert liaison.on_llm_call(**turn) is not None
    assert list(files(tmp_path / "questions")) == [f"{Q1}.answer.json"]


def test_the_memory_is_bounded(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # X14: the newest MEMORY answers are remembered; the oldest is forgotten
    monkeypatch.setattr(liaison, "MEMORY", 2)
    for text in ("a", "b", "c"):
        liaison.on_llm_call(user_message=f"HUB-Q:{Q1}: {text}", platform="telegram",
                            sender_id="42")
    assert list(liaison._written) == [(Q1, "b"), (Q1, "c")]
