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
from collections.abc import Iterator

import pytest

from coms_hermes_bridge.liaison import EDIT_TEXT
from tests.fakes import wait_for
from tests.gateway_rig import HUMAN, LEFT_TO_HERMES, WAIT, Gateway, running_gateway
from tests.hermes_venv import ensure_hermes_bin
from tests.telegram_fake import BOT, Seen
from tests.test_real_hermes import RealBridge

pytestmark = pytest.mark.real_hermes


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with running_gateway(tmp_path_factory.mktemp("gateway"), ensure_hermes_bin()) as gw:
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


def test_an_edited_answer_writes_no_second_file(gateway: Gateway) -> None:
    # X14: Telegram serves an edit as an edited_message update, and Hermes dispatches it
    # as a message of its own; the answer as first sent stands: the edit writes nothing,
    # reaches no agent, and the human is told in one line
    qid = gateway.qid()
    already = len([t for t in gateway.telegram.texts() if LEFT_TO_HERMES in t])
    [sent] = gateway.telegram.send(f"HUB-Q:{qid}: Tuesday")
    assert gateway.answer_file(qid)["answer"] == "Tuesday"
    wait_for(lambda: (str(HUMAN), sent, ["👍"]) in gateway.telegram.reactions(), WAIT, "the 👍")
    (gateway.questions / f"{qid}.answer.json").unlink()  # the bridge took it
    gateway.telegram.edit(sent, f"HUB-Q:{qid}: Wednesday")
    wait_for(lambda: EDIT_TEXT in gateway.telegram.texts(), WAIT,
             f"the edit refused; gateway log:\n{gateway.tail()}")
    assert f"{qid}.answer.json" not in gateway.answers()
    assert len([t for t in gateway.telegram.texts() if LEFT_TO_HERMES in t]) == already


def test_a_reply_quoting_part_of_the_question_is_its_answer(gateway: Gateway) -> None:
    # X14: a human who quotes only part of the question (not its marker) still answers
    # it: the replied-to message itself names the question, not the quote
    qid = gateway.qid()
    asked = gateway.question(qid, "Ship it tonight?")
    gateway.telegram.send("tomorrow", reply_to=asked, quote="Ship it tonight?")
    assert gateway.answer_file(qid)["answer"] == "tomorrow"


def test_a_long_reply_the_client_split_is_one_answer(gateway: Gateway) -> None:
    # X14: a reply over Telegram's 4,096 characters reaches the bot as two messages,
    # the first a reply; the gateway joins them into one event, and one answer
    qid = gateway.qid()
    asked = gateway.question(qid)
    first, rest = "lang " * 819 + "end.", "And the rest of it."
    assert len(first) > 4000
    gateway.telegram.send(first, rest, reply_to=asked)
    assert gateway.answer_file(qid)["answer"] == f"{first}\n{rest}"


def test_in_a_group_the_typed_form_mentions_the_bot(gateway: Gateway) -> None:
    # X14: in a group Telegram hands the bot only what mentions it or replies to it; the
    # question text says to type `@<bot name> HUB-Q:<qid>: …`, and the gateway strips
    # the mention before the liaison reads the message
    qid = gateway.qid()
    gateway.telegram.send(f"@{BOT['username']} HUB-Q:{qid}: from the team",
                          chat_id=-1001234567890)
    assert gateway.answer_file(qid)["answer"] == "from the team"


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
