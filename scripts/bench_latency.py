#!/usr/bin/env python3
"""Answer latency of the real daemon: from an answer file's rename into the
questions directory to the response arriving at the asker's socket.

Runs the daemon with default settings (temp HOME and PI_COMS_DIR, a fake
hermes on PATH), asks N questions one at a time, answers each with an atomic
rename once it is delivered, and prints the median, p95 and max in ms; also
how long each prompt waited for its ack (which comes once it is stored).
Usage: .venv/bin/python scripts/bench_latency.py [--questions 50]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.bridge_process import Bridge


def measure(questions: int) -> tuple[list[float], list[float]]:
    bridge = Bridge()
    try:
        bridge.start()
        latencies = []
        acks = []
        for i in range(questions):
            asked = time.perf_counter()
            qid = bridge.ask(f"Benchmark question {i}?")
            acks.append((time.perf_counter() - asked) * 1000)
            bridge.wait_log("delivered", qid)
            body = {"qid": qid, "answer": "1", "answered_by": "telegram:bench",
                    "at": "2026-11-30T12:00:00.000Z"}
            tmp = bridge.base / f"{qid}.tmp"
            tmp.write_text(json.dumps(body))
            bridge.questions.mkdir(parents=True, exist_ok=True)
            start = time.perf_counter()
            os.rename(tmp, bridge.questions / f"{qid}.answer.json")
            env = bridge.asker.response()
            assert env["msg_id"] == qid and env["error"] is None, env
            latencies.append((bridge.asker.arrivals[qid] - start) * 1000)
        return latencies, acks
    finally:
        bridge.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--questions", type=int, default=50)
    args = parser.parse_args()
    answers, acks = measure(args.questions)
    print(summary("answers (rename to response)", answers))
    print(summary("acks (prompt to ack)", acks))
    return 0


def summary(what: str, samples: list[float]) -> str:
    ms = sorted(samples)
    p95 = ms[min(len(ms) - 1, round(0.95 * len(ms)) - 1)]
    return (
        f"{len(ms)} {what}: median {statistics.median(ms):.2f} ms, "
        f"p95 {p95:.2f} ms, max {ms[-1]:.2f} ms"
    )


if __name__ == "__main__":
    sys.exit(main())
