"""The liaison in a gateway that pairs strangers instead of dropping them (no
TELEGRAM_ALLOWED_USERS): a stranger's message reaches the plugin, and only the gateway's
own verdict (`_is_user_authorized`) decides; a stranger's answer is never written (X14)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakes import wait_for
from tests.gateway_rig import WAIT, Gateway, running_gateway
from tests.hermes_venv import ensure_hermes_bin

pytestmark = pytest.mark.real_hermes

PAIRING = "Here's your pairing code"  # Hermes' reply to a stranger in a DM


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with running_gateway(tmp_path_factory.mktemp("pairing"), ensure_hermes_bin(),
                         allowlist=False) as gw:
        yield gw


def test_a_strangers_answer_under_pairing_is_left_to_hermes(gateway: Gateway) -> None:
    # X14: the stranger's typed answer goes past the liaison untouched (were it written
    # and skipped, Hermes would never see it); Hermes, after the hook, offers the stranger
    # a pairing code, and no answer file is written
    qid = gateway.qid()
    gateway.question(qid)
    gateway.telegram.send(f"HUB-Q:{qid}: yes", chat_id=777, user_id=777, username="mallory")
    wait_for(lambda: any(PAIRING in t for t in gateway.telegram.texts()), WAIT,
             f"Hermes' pairing reply; gateway log:\n{gateway.tail()}")
    assert gateway.answers() == []
