#!/usr/bin/env python3
"""Tap to agent through the liaison: from the moment the human's reply to a question is
in the fake Telegram's getUpdates to the moment the response envelope reaches the asker.

Runs what tests/test_liaison_gateway.py runs: the real `hermes gateway run` (hermes-agent
0.19.0 in .venv-hermes) with the plugin `coms-hermes-bridge liaison install` put there,
the daemon asking through the real `hermes send`, and the fake Telegram between them.
For each of N answers, in a chat left idle (the previous answer's 👍 given, the next
question delivered), the human replies "2" to the question; the time counted is the
gateway's poll, the plugin, the answer file, the daemon's pick-up and the envelope.

LLM calls are counted, not assumed. No model is configured, so an agent turn ends in
Hermes' "Provider authentication failed" reply in the chat without a request (Hermes
gives up before dialling); the count of those replies is the count of agent turns, and
a control at the end (one ordinary message) checks that the count does see a turn.
Besides, the gateway's HTTP(S)_PROXY is the fake Telegram's proxy, which records every
CONNECT (the gateway's and `hermes send`'s): a connection to any host but api.telegram.org
would be seen; the Bot API requests inside Telegram's are counted by the fake itself.
A turn or a connection elsewhere during the answers fails the run. Neither: no LLM call,
no token spent.
Usage: .venv/bin/python scripts/bench_liaison.py [--answers 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fakes import wait_for
from tests.gateway_rig import HUMAN, LEFT_TO_HERMES, WAIT, running_gateway
from tests.hermes_venv import ensure_hermes_bin
from tests.telegram_fake import Seen
from tests.test_real_hermes import RealBridge

TELEGRAM = "CONNECT api.telegram.org:443"


def measure(answers: int) -> tuple[list[float], list[str], int, int]:
    """The latencies in ms, every connection the gateway opened out (the CONNECT lines
    its proxy saw), the Bot API requests it made, and the number of Hermes' own replies
    in the chat (agent turns)."""
    hermes_bin = ensure_hermes_bin()
    with tempfile.TemporaryDirectory(prefix="chbl") as tmp, \
            running_gateway(Path(tmp), hermes_bin, all_http_to_proxy=True) as gateway:
        telegram = gateway.telegram
        bridge = RealBridge(hermes_bin, telegram)
        try:
            bridge.start("--questions-dir", str(gateway.questions))
            bridge.log = gateway.questions.parent / "log.ndjson"
            latencies: list[float] = []
            for i in range(answers):
                qid = bridge.ask(json.dumps({"question": f"Benchmark {i}?",
                                             "options": ["Yes", "No"]}))

                def asked(qid: str = qid) -> Seen | None:
                    return next((m for m in telegram.messages()
                                 if m.text.startswith(f"❓ [HUB-Q:{qid}]")), None)

                question = wait_for(asked, WAIT, f"the question {qid} in Telegram")
                bridge.wait_log("delivered", qid, timeout=WAIT)
                start = time.perf_counter()
                [sent] = telegram.send("2", reply_to=question)
                response = bridge.asker.response(timeout=WAIT)
                assert (response["msg_id"], response["response"]) == (
                    qid, {"kind": "selection", "selections": ["No"]}), response
                latencies.append((bridge.asker.arrivals[qid] - start) * 1000)
                # idle again before the next: the 👍 is the plugin's last word
                def thumbed(sent: int = sent) -> bool:
                    return (str(HUMAN), sent, ["👍"]) in telegram.reactions()

                wait_for(thumbed, WAIT, f"the 👍 on answer {i}; gateway log:\n{gateway.tail()}")
            replies = sum(LEFT_TO_HERMES in t for t in telegram.texts())
            connections, requests = telegram.connects(), len(telegram.calls())
            # the control: an ordinary message is an agent turn, and the count sees it
            telegram.send("what's the weather like?")
            gateway.hermes_replies(replies + 1)
            return latencies, connections, requests, replies
        finally:
            bridge.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--answers", type=int, default=20)
    args = parser.parse_args()
    if args.answers < 1:
        parser.error("--answers must be at least 1")
    latencies, connections, requests, agent_turns = measure(args.answers)
    elsewhere = [c for c in connections if c != TELEGRAM]
    print(summary(latencies))
    print(f"connections through the proxy (gateway and hermes send): {len(connections)}, "
          f"all to api.telegram.org:443, carrying {requests} Bot API requests"
          if not elsewhere else f"connections not to Telegram: {elsewhere}")
    print(f"agent turns (Hermes replies in the chat): {agent_turns} "
          "(the control message after them: 1, as it must)")
    llm_calls = len(elsewhere) + agent_turns
    print(f"LLM calls per answer: {llm_calls / len(latencies):g}, "
          f"tokens per answer: {0 if llm_calls == 0 else 'unknown'}")
    return 0 if llm_calls == 0 else 1


def summary(samples: list[float]) -> str:
    """Median, p90 (nearest rank) and max, in ms."""
    ms = sorted(samples)
    p90 = ms[min(len(ms) - 1, max(0, round(0.9 * len(ms)) - 1))]
    return (f"{len(ms)} answers (reply in getUpdates to response at the asker): "
            f"median {statistics.median(ms):.1f} ms, p90 {p90:.1f} ms, max {ms[-1]:.1f} ms")


if __name__ == "__main__":
    sys.exit(main())
