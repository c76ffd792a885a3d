"""A busy chat in the real Hermes gateway (hermes-agent 0.19.0): the human answers while
an agent turn runs in the same chat. Hermes interrupts the turn and replays the answer as
a follow-up turn that never passes pre_gateway_dispatch; the liaison's pre_llm_call hook
writes the answer file from it, once (X14, C7, C8).

The model is tests/llm_fake.py on 127.0.0.1: the turn is held running until the test has
seen Hermes interrupt it, so nothing here depends on timing. A gateway of its own, since a
configured model changes what every other liaison test sees of a message left to Hermes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from coms_hermes_bridge.liaison.markers import answer_prefix
from tests.fakes import wait_for
from tests.gateway_rig import WAIT, Gateway, running_gateway
from tests.hermes_venv import ensure_hermes_bin
from tests.llm_fake import MODEL, REPLY, FakeLLM

pytestmark = pytest.mark.real_hermes

BUSY = "Please write me a long essay."  # the turn the fake model holds running
INTERRUPTED = "Interrupting current task"  # Hermes' busy ack, in interrupt mode


@pytest.fixture(scope="module")
def llm() -> Iterator[FakeLLM]:
    fake = FakeLLM(hold_on=BUSY)
    try:
        yield fake
    finally:
        fake.close()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, llm: FakeLLM) -> Iterator[Gateway]:
    base = tmp_path_factory.mktemp("busy")
    config = (f"model:\n  provider: custom\n  default: {MODEL}\n  base_url: {llm.base_url}\n"
              f"  api_key: fake\n  context_length: 128000\n")
    # a configured provider makes Hermes fetch OpenRouter's model list unless it is cached
    cache = base / "home" / ".hermes" / "cache"
    cache.mkdir(parents=True)
    (cache / "openrouter_model_metadata.json").write_text(
        json.dumps({MODEL: {"context_length": 128000}}), encoding="utf-8")
    with running_gateway(base, ensure_hermes_bin(), config_yaml=config) as gw:
        yield gw


def turn_with(llm: FakeLLM, text: str) -> list[str]:
    """The user messages of the model calls whose newest user message contains `text`."""
    return [m for m in map(llm.last_user_text, llm.requests()) if text in m]


def liaison_lines(gateway: Gateway, qid: str) -> list[str]:
    hermes_log = gateway.home / ".hermes" / "logs" / "gateway.log"
    return [line for line in hermes_log.read_text(errors="replace").splitlines()
            if f"answered {qid}" in line]


def test_an_answer_to_a_busy_chat_is_written_once(
    gateway: Gateway, llm: FakeLLM
) -> None:
    # X14, C7, C8: a turn is running (the model holds its call); the human replies to the
    # question; Hermes interrupts the turn and replays the reply as a follow-up turn past
    # pre_gateway_dispatch; the liaison writes the file from that turn, exactly once
    qid = gateway.qid()
    asked = gateway.question(qid)
    gateway.telegram.send(BUSY)
    wait_for(llm.holding, WAIT, f"the busy turn at the model; gateway log:\n{gateway.tail()}")
    gateway.telegram.send("  2  ", reply_to=asked)
    wait_for(lambda: any(INTERRUPTED in t for t in gateway.telegram.texts()), WAIT,
             f"Hermes interrupting the turn; gateway log:\n{gateway.tail()}")
    llm.release()

    body = gateway.answer_file(qid)
    assert list(body) == ["qid", "answer", "answered_by", "at"]
    assert (body["qid"], body["answer"], body["answered_by"]) == (qid, "2", "telegram:alice")
    assert body["at"].endswith("Z") and len(body["at"]) == 24

    # the follow-up turn reaches the model: Hermes 0.19.0 merges it with the interrupted
    # turn's user message (its "message-alternation" repair) and, in doing so, drops what
    # pre_llm_call added, so the model is not told here (tests/test_liaison.py checks the
    # note the hook returns)
    [follow_up] = wait_for(lambda: turn_with(llm, f"[HUB-Q:{qid}]"), WAIT,
                           f"the follow-up turn at the model; gateway log:\n{gateway.tail()}")
    assert follow_up.endswith(f'{answer_prefix(qid)} <answer>"]\n\n2')
    wait_for(lambda: REPLY in gateway.telegram.texts(), WAIT, "the model's reply to the turn")
    # once: written by the busy-chat hook alone, and never again by a replay
    assert [line.rsplit("hub-liaison: ", 1)[1] for line in liaison_lines(gateway, qid)] == [
        f"answered {qid} for telegram:alice in a busy chat"]
    assert sorted(p.name for p in gateway.questions.iterdir()) == [f"{qid}.answer.json"]
    # what the human sees: Hermes' interrupt notice, then the model's reply; no 👍
    said = gateway.telegram.texts()[1:]
    assert said[0].startswith(f"⚡ {INTERRUPTED}. I'll respond to your message shortly.")
    assert said[1:] == [REPLY]
    assert gateway.telegram.reactions() == []
