#!/usr/bin/env python3
"""What one `Edge.spawn` costs when an actor's turn (a callback on the loop) makes it.

The daemon's turns run on the edge's loop, and each response sent and each hermes run
is spawned from one. This spawns N empty coroutines from one loop callback, twice each
way, and prints the cost per spawn until all are done: the thread-safe path
(`asyncio.run_coroutine_threadsafe`, what `spawn` did for every caller) against
`spawn` itself, which creates the task at once on the loop.

Usage: .venv/bin/python scripts/bench_spawn.py [--n 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from coms_hermes_bridge.actors.loop import Edge


async def _nothing() -> None:
    return None


def _burst(edge: Edge, n: int, threadsafe: bool, took: list[float],
           done: threading.Event) -> None:
    began = time.perf_counter()
    left = [n]

    def one(_: Any) -> None:
        left[0] -= 1
        if left[0] == 0:
            took.append(time.perf_counter() - began)
            done.set()

    for _ in range(n):
        future = (asyncio.run_coroutine_threadsafe(_nothing(), edge.loop) if threadsafe
                  else edge.spawn(_nothing()))
        future.add_done_callback(one)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000, help="spawns per burst")
    n = parser.parse_args().n
    edge = Edge("bench")
    best: dict[str, float] = {}
    for threadsafe in (True, False, True, False):
        took: list[float] = []
        done = threading.Event()
        edge.call(_burst, edge, n, threadsafe, took, done)
        if not done.wait(600):
            print("the loop stalled", file=sys.stderr)
            return 1
        name = "thread-safe future" if threadsafe else "Edge.spawn on the loop"
        best[name] = min(best.get(name, took[0]), took[0])
    for name, seconds in best.items():
        print(f"{name}: {seconds / n * 1e6:.1f} us per spawn (best of 2, {n} spawns)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
