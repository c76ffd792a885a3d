"""A busy chat in the real Hermes gateway (hermes-agent 0.19.0): the human answers while
an agent turn runs in the same chat. Hermes hands such a message to its busy-session
path (interrupt the turn and replay the message, or steer it into the turn), never to
pre_gateway_dispatch; the liaison's guard on that path writes the answer file, once, and
no turn ever carries the answer (X14, C7, C8).

The model is tests/llm_fake.py on 127.0.0.1: the turn is held running until the test has
seen the answer handled, so nothing here depends on timing. Gateways of their own, since
a configured model changes what every other liaison test sees of a message left to
Hermes: one in Hermes' default busy mode (interrupt), one in steer mode.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from coms_hermes_bridge.liaison.markers import answer_prefix
from tests.fakes import wait_for
from tests.gateway_rig import HUMAN, WAIT, Gateway, running_gateway
from tests.hermes_venv import ensure_hermes_bin
from tests.llm_fake import MODEL, REPLY, FakeLLM

pytestmark = pytest.mark.real_hermes

BUSY = "Please write me a long essay."  # the turn the fake model holds running
BAD = "01HZY5B7R8XK3M9Q2W4E6T8Y0U"  # U is no Crockford digit


@pytest.fixture(scope="module")
def llm() -> Iterator[FakeLLM]:
    fake = FakeLLM(hold_on=BUSY)
    try:
        yield fake
    finally:
        fake.close()


def model_gateway(base: Path, llm: FakeLLM, extra: str = "") -> Iterator[Gateway]:
    config = (f"model:\n  provider: custom\n  default: {MODEL}\n  base_url: {llm.base_url}\n"
              f"  api_key: fake\n  context_length: 128000\n{extra}")
    # a configured provider makes Hermes fetch OpenRouter's model list unless it is cached
    cache = base / "home" / ".hermes" / "cache"
    cache.mkdir(parents=True)
    (cache / "openrouter_model_metadata.json").write_text(
        json.dumps({MODEL: {"context_length": 128000}}), encoding="utf-8")
    with running_gateway(base, ensure_hermes_bin(), config_yaml=config) as gw:
        yield gw


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, llm: FakeLLM) -> Iterator[Gateway]:
    yield from model_gateway(tmp_path_factory.mktemp("busy"), llm)


@pytest.fixture(scope="module")
def steering(tmp_path_factory: pytest.TempPathFactory, llm: FakeLLM) -> Iterator[Gateway]:
    # Hermes' `/busy steer`, as it saves it: the message is injected into the running turn
    yield from model_gateway(tmp_path_factory.mktemp("steer"), llm,
                             "display:\n  busy_input_mode: steer\n")


def turns_with(llm: FakeLLM, text: str) -> list[str]:
    """The newest user message of each model call that contains `text`."""
    return [m for m in map(llm.last_user_text, llm.requests()) if text in m]


def replies(gateway: Gateway) -> int:
    return gateway.telegram.texts().count(REPLY)


def finish(gateway: Gateway, llm: FakeLLM) -> None:
    """Let the held turn end, then run one more turn in the chat and wait for its reply:
    turns in a chat run one after another, so a turn replayed or steered from the answer
    would have reached the model by then."""
    before = replies(gateway)
    llm.release()
    wait_for(lambda: replies(gateway) > before, WAIT, f"the held turn's reply:\n{gateway.tail()}")
    control = f"control after {gateway.qid_number}"
    gateway.telegram.send(control)
    wait_for(lambda: replies(gateway) > before + 1, WAIT, f"the control's reply:\n{gateway.tail()}")
    assert turns_with(llm, control), "the control turn reached the model"


def busy_chat(gateway: Gateway, llm: FakeLLM) -> None:
    """A turn running in the chat: its model call held."""
    llm.hold()
    gateway.telegram.send(BUSY)
    wait_for(llm.holding, WAIT, f"the busy turn at the model; gateway log:\n{gateway.tail()}")


def liaison_lines(gateway: Gateway, qid: str) -> list[str]:
    hermes_log = gateway.home / ".hermes" / "logs" / "gateway.log"
    return [line.rsplit("hub-liaison: ", 1)[1]
            for line in hermes_log.read_text(errors="replace").splitlines()
            if f"answered {qid}" in line]


def answered_in_a_busy_chat(gateway: Gateway, llm: FakeLLM, qid: str, sent: int,
                            answer: str) -> None:
    """X14's promise for a busy chat: the file, exactly once; the 👍 as in an idle chat;
    nothing of Hermes' busy path (no interrupt or steer notice), and no turn with it."""
    body = gateway.answer_file(qid)
    assert list(body) == ["qid", "answer", "answered_by", "at"]
    assert (body["qid"], body["answer"], body["answered_by"]) == (qid, answer, "telegram:alice")
    assert body["at"].endswith("Z") and len(body["at"]) == 24
    wait_for(lambda: (str(HUMAN), sent, ["👍"]) in gateway.telegram.reactions(), WAIT,
             f"the 👍; gateway log:\n{gateway.tail()}")
    finish(gateway, llm)
    assert turns_with(llm, qid) == []
    assert liaison_lines(gateway, qid) == [f"answered {qid} for telegram:alice in a busy chat"]
    assert f"{qid}.answer.json" in gateway.answers()
    said = " ".join(gateway.telegram.texts())
    assert "Interrupting" not in said and "Steered" not in said and "Queued" not in said


def test_a_reply_in_a_busy_chat_is_written_once_and_no_turn_sees_it(
    gateway: Gateway, llm: FakeLLM
) -> None:
    # X14, C7, C8: a turn is running; the human replies to the question; the answer is
    # written and 👍'd while the turn runs on undisturbed, and no turn carries it
    qid = gateway.qid()
    asked = gateway.question(qid)
    busy_chat(gateway, llm)
    [sent] = gateway.telegram.send("  2  ", reply_to=asked)
    answered_in_a_busy_chat(gateway, llm, qid, sent, "2")


def test_the_typed_form_in_a_busy_chat(gateway: Gateway, llm: FakeLLM) -> None:
    # X14: `HUB-Q:<qid>: <answer>` with no reply, while a turn runs
    qid = gateway.qid()
    busy_chat(gateway, llm)
    [sent] = gateway.telegram.send(f"{answer_prefix(qid)} not yet\nmaybe Monday")
    answered_in_a_busy_chat(gateway, llm, qid, sent, "not yet\nmaybe Monday")


def test_an_answer_steered_at_a_busy_chat(steering: Gateway, llm: FakeLLM) -> None:
    # X14: in Hermes' steer mode a message is injected into the running turn (or, with
    # no tool call left to carry it, made the next turn); an answer is taken first
    qid = steering.qid()
    asked = steering.question(qid)
    busy_chat(steering, llm)
    [sent] = steering.telegram.send("Yes", reply_to=asked)
    answered_in_a_busy_chat(steering, llm, qid, sent, "Yes")


def test_text_that_answers_nothing_beside_an_answer_is_the_models_alone(
    gateway: Gateway, llm: FakeLLM
) -> None:
    # X14: an answer and a slip (a bad qid) in one merged event: the answer is written
    # and 👍'd, and the slip, exactly as typed and nothing more, becomes Hermes' turn
    qid = gateway.qid()
    slip = f"HUB-Q:{BAD}: typo\n  its own line"
    sent = gateway.telegram.send(f"{answer_prefix(qid)} yes", slip)
    assert gateway.answer_file(qid)["answer"] == "yes"
    wait_for(lambda: any(r[1] in sent and r[2] == ["👍"] for r in gateway.telegram.reactions()),
             WAIT, "the 👍")
    [turn] = wait_for(lambda: turns_with(llm, BAD), WAIT, f"the slip's turn:\n{gateway.tail()}")
    assert turn == slip
    assert turns_with(llm, qid) == []
