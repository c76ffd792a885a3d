#!/usr/bin/env python3
"""Cost at scale of the real daemon: N open questions, then N answers at once.

For each size N it starts the bridge in a world of its own (temp HOME and
PI_COMS_DIR, a fast fake `hermes` that exits 0 at once), then:

1. sends N - S prompts from K clients in parallel (acks/s, ms per ack
   p50/p99), S being `--seq` (at most N/2);
2. then the last S prompts one at a time from one client (sequential ms per
   ack near N open: mean, p50, p99), so that N questions are open;
3. waits until every question is delivered (time from the first prompt);
4. pings it (ms, median of 20) and reads its RSS, thread count and CPU time;
5. writes every answer file at once (renamed into the questions directory)
   and waits for every response at the asker's socket (time from the first
   rename to the last response);
6. prints the daemon's CPU time per answer (step 5, until every answer is logged
   and its file removed) and per question over the whole run.

`--compare CMD` runs another bridge command (any program speaking the same
wire and files, e.g. another implementation) through the same steps,
interleaved with ours (ours first on odd repeats, theirs first on even ones),
and prints the ratios ours/theirs of the medians. Process figures (RSS,
threads, CPU) are read from /proc for the pid in the registry entry, i.e. the
daemon itself even when the command is a launcher. Thread count is the
highest seen by a 10 Hz sampler over the run.

`--asker threads` answers the responses with a thread per connection and a
listen backlog of 256 instead of one fast accept loop (see `Asker`).

Usage:
  .venv/bin/python scripts/bench_scale.py --sizes 100,1000 [--clients 16]
      [--seq 200] [--repeat 3] [--asker fast|threads]
      [--compare "tsx /path/to/other-bridge.ts"]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.bridge_process import new_qid
from tests.fakes import Asker, request

ROOT = Path(__file__).resolve().parent.parent
OURS = f"{shlex.quote(sys.executable)} -m coms_hermes_bridge"
PHASE_LIMIT_S = 900.0
TICKS = os.sysconf("SC_CLK_TCK")


class LogTail:
    """Counts events in the daemon's log.ndjson as it grows, without re-reading it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.rest = b""
        self.counts: dict[str, int] = {}

    def poll(self) -> dict[str, int]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return self.counts
        self.offset += len(data)
        lines = (self.rest + data).split(b"\n")
        self.rest = lines.pop()
        for line in lines:
            try:
                event = str(json.loads(line)["event"])
            except (ValueError, KeyError, TypeError):
                continue
            self.counts[event] = self.counts.get(event, 0) + 1
        return self.counts


@dataclass
class Proc:
    """/proc figures of one pid."""

    pid: int

    def status(self, key: str) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
        return 0

    def cpu_s(self) -> float:
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


@dataclass
class Sampler:
    """Highest thread count and RSS of the daemon, sampled at 10 Hz."""

    proc: Proc
    threads: int = 0
    rss_kib: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Sampler:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                self.threads = max(self.threads, self.proc.status("Threads"))
                self.rss_kib = max(self.rss_kib, self.proc.status("VmRSS"))
            except OSError:
                return

    def stop(self) -> None:
        self._stop.set()


def wait(condition: Callable[[], bool], what: str, limit: float = PHASE_LIMIT_S) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up waiting for {what} after {limit:g}s")
        time.sleep(0.01)


def pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


def ask(endpoint: str, asker: Asker, qid: str, i: int) -> float:
    """One prompt, one ack; the ms it took."""
    envelope = asker.prompt_envelope(f"Benchmark question {i}?", qid, sender_name="bench")
    started = time.perf_counter()
    reply = request(endpoint, envelope, timeout=60.0)
    took = (time.perf_counter() - started) * 1000
    if reply != {"type": "ack", "msg_id": qid}:
        raise RuntimeError(f"prompt {qid} not acked: {reply!r}")
    return took


def run_once(command: str, n: int, clients: int, seq: int, threaded: bool) -> dict[str, float]:
    """One daemon through the whole scenario; its figures by name."""
    base = Path(tempfile.mkdtemp(prefix="bsc", dir="/tmp"))
    home, coms, bindir = base / "h", base / "c", base / "bin"
    for d in (home, coms, bindir):
        d.mkdir()
    os.symlink(shutil.which("true") or "/bin/true", bindir / "hermes")  # the fast fake hermes
    # threads: a thread per connection and a backlog of 256, as a peer written that way
    # has: its backlog fills when many responses come at once. fast: one loop, deep backlog.
    asker = Asker(base / "asker.sock", threaded=threaded, backlog=256 if threaded else 4096)
    env = {k: v for k, v in os.environ.items() if k != "PI_COMS_TIMEOUT_MS"}
    env.update(HOME=str(home), PI_COMS_DIR=str(coms), PYTHONPATH=str(ROOT),
               PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}")
    argv = [*shlex.split(command), "--timeout", "3600000"]
    daemon = subprocess.Popen(argv, cwd=str(ROOT), env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    entry_path = coms / "projects" / "default" / "agents" / "user-remote.json"
    questions = home / ".pi" / "coms" / "hermes-bridge" / "questions"
    log = LogTail(home / ".pi" / "coms" / "hermes-bridge" / "log.ndjson")
    out: dict[str, float] = {}
    try:
        wait(lambda: entry_path.exists() and daemon.poll() is None, "the registry entry", 60)
        entry = json.loads(entry_path.read_text())
        endpoint, proc = str(entry["endpoint"]), Proc(int(entry["pid"]))
        sampler = Sampler(proc).start()
        cpu0 = proc.cpu_s()
        seq = min(seq, n // 2)
        parallel = n - seq
        qids = [new_qid() for _ in range(n)]

        # 1. N - S prompts from K clients in parallel
        started = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            acks = list(pool.map(lambda i: ask(endpoint, asker, qids[i], i), range(parallel)))
        parallel_s = time.perf_counter() - started
        out["par_acks_per_s"] = parallel / parallel_s
        out["par_ack_p50_ms"] = statistics.median(acks)
        out["par_ack_p99_ms"] = pct(acks, 99)

        # 2. toward N open, one client, one prompt at a time
        seq_acks = [ask(endpoint, asker, qids[i], i) for i in range(parallel, n)]
        if seq_acks:
            out["seq_ack_ms"] = statistics.fmean(seq_acks)
            out["seq_ack_p50_ms"] = statistics.median(seq_acks)
            out["seq_ack_p99_ms"] = pct(seq_acks, 99)

        # 3. every question delivered
        wait(lambda: log.poll().get("delivered", 0) >= n, "every delivery")
        out["delivered_s"] = time.perf_counter() - started

        # 4. ping and process figures at N open
        pings = []
        for _ in range(20):
            t = time.perf_counter()
            pong = request(endpoint, {"type": "ping", "msg_id": new_qid()})
            pings.append((time.perf_counter() - t) * 1000)
        out["ping_ms"] = statistics.median(pings)
        out["queue_depth"] = float(pong["agent_card"]["queue_depth"])
        out["rss_mib"] = proc.status("VmRSS") / 1024

        # 5. every answer at once
        questions.mkdir(parents=True, exist_ok=True)
        staged = []
        for qid in qids:
            tmp = base / f"{qid}.tmp"
            tmp.write_text(json.dumps({"qid": qid, "answer": "yes", "answered_by":
                                       "telegram:bench", "at": "2026-11-30T12:01:00.000Z"}))
            staged.append((tmp, questions / f"{qid}.answer.json"))
        cpu_answers = proc.cpu_s()
        started = time.perf_counter()
        for tmp, target in staged:
            os.rename(tmp, target)
        wait(lambda: asker.count() >= len(qids), "every response")
        out["answers_s"] = max(asker.arrivals.values()) - started
        # the first one tells a poll's wait from the work: the rest is the work
        out["first_answer_s"] = min(asker.arrivals.values()) - started
        if asker.errors:
            raise RuntimeError(f"{len(asker.errors)} responses carried errors, e.g. "
                               f"{next(iter(asker.errors.values()))!r}")

        # 6. CPU per answer (from the first rename until every answer is logged and its
        # file removed: all the work the answers cost), the whole run's per question
        wait(lambda: log.poll().get("answered", 0) >= n and not any(questions.iterdir()),
             "every answer logged and its file removed")
        cpu_end = proc.cpu_s()
        out["cpu_ms_per_answer"] = (cpu_end - cpu_answers) * 1000 / len(qids)
        out["cpu_ms_per_q"] = (cpu_end - cpu0) * 1000 / len(qids)
        sampler.stop()
        out["threads_max"] = float(sampler.threads)
        out["rss_max_mib"] = sampler.rss_kib / 1024
        # every answer was on time and valid: any of these is a fault in the daemon
        counts = log.poll()
        out["late_answers"] = float(counts.get("late_answer", 0))
        out["rejected_answers"] = float(counts.get("answer_rejected", 0))
        return out
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=10)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        asker.close()
        shutil.rmtree(base, ignore_errors=True)


FIGURES = [
    ("par_acks_per_s", "parallel acks/s", "{:.0f}"),
    ("par_ack_p50_ms", "parallel ms/ack p50", "{:.2f}"),
    ("par_ack_p99_ms", "parallel ms/ack p99", "{:.2f}"),
    ("seq_ack_ms", "sequential ms/ack (mean)", "{:.2f}"),
    ("seq_ack_p50_ms", "sequential ms/ack p50", "{:.2f}"),
    ("seq_ack_p99_ms", "sequential ms/ack p99", "{:.2f}"),
    ("delivered_s", "all delivered, s", "{:.2f}"),
    ("ping_ms", "ping at N open, ms", "{:.2f}"),
    ("queue_depth", "queue_depth at N open", "{:.0f}"),
    ("first_answer_s", "first answer back, s", "{:.3f}"),
    ("answers_s", "N answers back, s", "{:.2f}"),
    ("rss_mib", "RSS at N open, MiB", "{:.0f}"),
    ("rss_max_mib", "RSS peak, MiB", "{:.0f}"),
    ("threads_max", "threads (peak)", "{:.0f}"),
    ("cpu_ms_per_answer", "daemon CPU/answer, ms", "{:.3f}"),
    ("cpu_ms_per_q", "daemon CPU/question, ms", "{:.2f}"),
    ("late_answers", "late_answer events (want 0)", "{:.0f}"),
    ("rejected_answers", "answer_rejected events (want 0)", "{:.0f}"),
]


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for run in runs for k in run}
    return {k: statistics.median(run[k] for run in runs if k in run) for k in keys}


def table(n: int, repeat: int, ours: dict[str, float], theirs: dict[str, float] | None) -> str:
    head = f"N = {n:,} (median of {repeat})"
    columns = f" {'theirs':>10} {'ours/theirs':>12}" if theirs else ""
    lines = [f"{head:<34} {'ours':>10}{columns}"]
    for key, label, fmt in FIGURES:
        if key not in ours:
            continue
        line = f"  {label:<32} {fmt.format(ours[key]):>10}"
        if theirs is not None and key in theirs:
            ratio = ours[key] / theirs[key] if theirs[key] else float("nan")
            line += f" {fmt.format(theirs[key]):>10} {ratio:>12.2f}"
        lines.append(line)
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default="100,1000", help="comma-separated N (default 100,1000)")
    parser.add_argument("--clients", type=int, default=16, help="parallel clients (default 16)")
    parser.add_argument("--seq", type=int, default=200,
                        help="of the N prompts, how many go last, one at a time (default 200)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per size; medians shown")
    parser.add_argument("--ours", default=OURS, help="our bridge command")
    parser.add_argument("--compare", metavar="CMD", help="another bridge command, interleaved")
    parser.add_argument("--json", metavar="FILE", help="also write every run's figures here")
    parser.add_argument("--asker", choices=("fast", "threads"), default="fast",
                        help="the asker receiving responses: one accept loop (fast) or a "
                             "thread per connection with a backlog of 256 (default fast)")
    args = parser.parse_args()
    sizes = [int(s.replace(",", "").replace("_", "")) for s in args.sizes.split(",") if s]
    record: dict[str, Any] = {"ours": args.ours, "compare": args.compare, "runs": []}
    load = os.getloadavg()
    print(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"{os.cpu_count()} CPUs; clients {args.clients}, seq {args.seq}, "
          f"asker {args.asker}", flush=True)
    for n in sizes:
        ours_runs: list[dict[str, float]] = []
        their_runs: list[dict[str, float]] = []
        for r in range(args.repeat):
            order = [("ours", args.ours, ours_runs)]
            if args.compare:
                theirs = ("theirs", args.compare, their_runs)
                order = [*order, theirs] if r % 2 == 0 else [theirs, *order]
            for name, command, runs in order:
                figures = run_once(command, n, args.clients, args.seq, args.asker == "threads")
                runs.append(figures)
                record["runs"].append({"n": n, "who": name, **figures})
                print(f"  N={n} run {r + 1} {name}: " + ", ".join(
                    f"{k}={v:.3g}" for k, v in sorted(figures.items())), flush=True)
        theirs_median = median_of(their_runs) if their_runs else None
        print(table(n, args.repeat, median_of(ours_runs), theirs_median), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
