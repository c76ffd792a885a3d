#!/usr/bin/env python3
"""Chaos: the real daemon SIGKILLed and restarted every 0.5–1 s while askers keep asking.

The daemon promises that an acked question is never lost and says where it may
double something after a crash (docs/operations.md, "What survives what"). The
tests kill it at moments they choose; this kills it at moments nobody chose,
many times over, with prompts, hermes runs, answer files and responses in
flight, and counts what came out.

The world is the tests' own (tests/bridge_process.py): a scratch HOME and
PI_COMS_DIR and the fake `hermes` on PATH, made to take `--hermes-ms` per send
so that kills land mid-send. Askers speak the coms wire from a bounded pool of
client threads and resend an unacked prompt (nack, refused or dropped
connection) with the same msg_id until it is acked, as the pool's client does;
the human is played by a writer that answers each question once, with an answer
file renamed into the questions directory, after the fake hermes has sent it.

It ends when every acked question has its response (and `--min-kills` kills were
made), or at `--deadline`; then it lets the last daemon run `--settle` seconds
unharmed, so that what its start sends again (owed responses, pending questions)
is counted too. It exits 0 only if nothing acked was lost and nothing was doubled
(a question sent to the human twice; an answer received twice, but for the one
resend the delivery promise allows: the same response sent again by the next
start because a kill cut off its ack, counted on a line of its own), and every
question was acked and answered as written; 1 otherwise, naming the qids; 130
when interrupted (the figures so far are printed all the same).

Usage:
  .venv/bin/python scripts/chaos.py [--questions 200] [--seed N] [--deadline 120]
      [--hermes-ms 50] [--kill-min 0.5] [--kill-max 1.0] [--min-kills 0]
      [--askers 4] [--clients 8] [--settle 1.0] [--keep]
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import random
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.bridge_process import Bridge, new_qid
from tests.fakes import Asker, request

QUESTION = re.compile(r"❓ \[HUB-Q:([0-9A-HJKMNP-TV-Z]{26})\]")
REQUEST_TIMEOUT_S = 5.0  # a live daemon acks in milliseconds; a dead one closes at once
MAX_SENDS = 10_000  # per prompt: the deadline ends it first, this bounds it regardless
READY_TIMEOUT_S = 15.0  # for the settling daemon (a start takes about 0.25 s)
POLL_S = 0.01
PROGRESS_EVERY_S = 10.0
PR_SET_PDEATHSIG = 1


def _pdeathsig() -> Callable[[], None]:
    """Resolved in the parent: after fork, in a process with many threads, the child
    should call a function, not look one up (dlopen takes locks another thread may have
    held at the fork)."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def die_with_parent() -> None:
        # A SIGKILLed script runs no `finally`: without this its daemon, which is made
        # to run for ever, would. (The signal comes when the thread that started the
        # daemon ends: the main thread starts every one.)
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)

    return die_with_parent


@dataclass
class Tally:
    """What the run saw: the verdict and the printed figures come from this alone, so
    they can be checked without a daemon."""

    qids: list[str]
    acked: set[str] = field(default_factory=set)
    responses: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    asked: collections.Counter[str] = field(default_factory=collections.Counter)
    expected: dict[str, str] = field(default_factory=dict)  # qid -> the answer written
    written_at: dict[str, float] = field(default_factory=dict)  # qid -> epoch of its rename
    after_answer: collections.Counter[str] = field(default_factory=collections.Counter)
    notes: int = 0
    sends: int = 0
    drops: int = 0
    nacks: collections.Counter[str] = field(default_factory=collections.Counter)
    kills: int = 0
    starts: int = 0
    ready: int = 0
    exits: collections.Counter[int] = field(default_factory=collections.Counter)
    wall_s: float = 0.0
    interrupted: bool = False
    deadline_passed: bool = False


def listed(qids: Iterable[str], counts: dict[str, int] | None = None) -> str:
    """The qids behind a figure: whoever reads a failure needs them to grep the log."""
    names = [f"{q}×{counts[q]}" if counts else q for q in sorted(qids)]
    return f" [{', '.join(names)}]" if names else ""


def sent_again(copies: list[dict[str, Any]]) -> bool:
    """Each copy the same answer, each from another run of the daemon: a start sending a
    response whose ack a kill cut off (docs/operations.md: delivery is at least once;
    the pool's client takes a msg_id's response once). Two in one run, or two answers
    that differ, are a response doubled."""
    answers = {json.dumps([r.get("response"), r.get("error")], sort_keys=True) for r in copies}
    return len(answers) == 1 and len({r.get("sender_session") for r in copies}) == len(copies)


def verdict(t: Tally) -> tuple[list[str], int]:
    """The report's lines and the exit status: 0 only when nothing was lost or doubled
    and every question came back with the answer written for it."""
    answered = {q for q in t.qids if t.responses.get(q)}
    lost = t.acked - answered
    unacked = set(t.qids) - t.acked - answered
    doubles = {q: r for q, r in t.responses.items() if len(r) > 1}
    again = {q: len(r) for q, r in doubles.items() if sent_again(r)}
    twice = {q: len(r) for q, r in doubles.items() if q not in again}
    asked_twice = {q: n for q, n in t.asked.items() if n > 1}
    wrong = {q for q in answered
             if any(r.get("error") is not None
                    or r.get("response") != {"kind": "freeform", "text": t.expected.get(q)}
                    for r in t.responses[q])}
    never_sent = {q for q in t.acked if q not in t.asked}
    lines = [
        f"questions acked: {len(t.acked)} of {len(t.qids)}",
        f"answered: {len(answered)}",
        f"lost: {len(lost)}{listed(lost)}",
        f"answers received twice: {len(twice)}{listed(twice, twice)}",
        f"answers sent again by the next start, a kill having cut off their ack: "
        f"{len(again)}{listed(again, again)}",
        f"questions sent twice: {len(asked_twice)}{listed(asked_twice, asked_twice)}",
        f"kills: {t.kills}",
        f"wall time: {t.wall_s:.1f} s",
        f"never acked nor answered: {len(unacked)}{listed(unacked)}",
        f"wrong or error responses: {len(wrong)}{listed(wrong)}",
        f"acked, never sent to the human: {len(never_sent)}{listed(never_sent)}",
        f"questions sent after their answer was written: {len(t.after_answer)}",
        f"prompt sends: {t.sends} ({t.sends - len(t.qids)} more than one a question; "
        f"{t.drops} dropped or refused, {sum(t.nacks.values())} nacked)",
    ]
    lines += [f"  nack {n}×: {error}" for error, n in t.nacks.most_common()]
    lines += [
        f"daemon starts: {t.starts} ({t.ready} became ready)",
        f"notes sent to the human: {t.notes}",
    ]
    lines += [f"daemon exited by itself with {code}: {n}×" for code, n in sorted(t.exits.items())]
    if t.deadline_passed:
        lines.append("the deadline passed before every acked question was answered")
    if t.interrupted:
        lines.append("interrupted")
    failed = lost or twice or asked_twice or unacked or wrong
    lines.append("verdict: " + ("FAIL" if failed else "ok"))
    return lines, 1 if failed else 0


class NdjsonTail:
    """Reads a file of JSON lines as others append to it, each byte once: the answer
    writer looks many times a second. A line still without its newline waits."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.rest = b""

    def new(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        lines = (self.rest + data).split(b"\n")
        self.rest = lines.pop()
        records: list[dict[str, Any]] = []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
        return records


def question_qid(run: dict[str, Any]) -> str | None:
    """A run of `hermes send` asks the human only when its text opens with the tag;
    notes (late, cancelled, timed out, unreadable) carry the qid too, with another sign."""
    argv = run.get("argv")
    text = argv[-1] if isinstance(argv, list) and argv else ""
    match = QUESTION.match(text) if isinstance(text, str) else None
    return match.group(1) if match else None


class Chaos:
    """One run: the daemon's world, its askers, the human, the killer."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.bridge = Bridge()
        # Our askers answer connections one at a time (bounded threads); the rig's own,
        # a thread per connection, is not used.
        self.bridge.asker.close()
        self.bridge.hermes.configure(sleep=args.hermes_ms / 1000)
        self.askers = [Asker.beside(self.bridge.base, threaded=False, backlog=256)
                       for _ in range(args.askers)]
        self.tally = Tally([new_qid() for _ in range(args.questions)])
        self.started_at = time.monotonic()
        self.deadline = self.started_at + args.deadline
        self.preexec = _pdeathsig()
        self.seen_ready = False

    # -- the askers ---------------------------------------------------------------

    def endpoint(self) -> str | None:
        """Each start has a socket of its own: a client finds it in the registry, and
        the entry of a killed run stays until the next run replaces it."""
        try:
            return str(json.loads(self.bridge.entry_path().read_text())["endpoint"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def answered(self, qid: str, asker: Asker) -> bool:
        return qid in asker.arrivals

    def ask(self, index: int) -> None:
        """One question, resent with the same msg_id until acked: a nack, a refusal or a
        connection cut by a kill says nothing about whether it was stored, and the
        bridge acks an identical resend of a stored one without asking again (X2)."""
        qid = self.tally.qids[index]
        asker = self.askers[index % len(self.askers)]
        envelope = asker.prompt_envelope(f"Chaos question {index}?", qid,
                                         sender_name=f"chaos-{index % len(self.askers)}")
        backoff = random.Random(f"{self.args.seed}-{index}")
        for _ in range(MAX_SENDS):
            if self.stop.is_set() or time.monotonic() > self.deadline:
                return
            if self.answered(qid, asker):
                return  # acked or not, its asker has what it asked for
            endpoint = self.endpoint()
            if endpoint is not None:
                try:
                    reply = request(endpoint, envelope, timeout=REQUEST_TIMEOUT_S)
                except (OSError, ValueError):  # refused, gone, or cut mid-reply
                    reply = None
                with self.lock:
                    self.tally.sends += 1
                    if reply == {"type": "ack", "msg_id": qid}:
                        self.tally.acked.add(qid)
                        return
                    if isinstance(reply, dict) and reply.get("type") == "nack":
                        self.tally.nacks[str(reply.get("error"))] += 1
                    else:
                        self.tally.drops += 1
            self.stop.wait(backoff.uniform(0.05, 0.15))

    # -- the human ----------------------------------------------------------------

    def human(self) -> None:
        """Answers each question once, after hermes has finished sending it (the human
        cannot reply to a message not yet on their phone), however often it is sent."""
        calls = NdjsonTail(self.bridge.hermes.directory / "calls.ndjson")
        ours = set(self.tally.qids)
        while not self.stop.wait(POLL_S):
            for run in calls.new():
                qid = question_qid(run)
                if qid is None or qid not in ours or qid in self.tally.expected:
                    continue
                text = f"answer to {qid}"
                self.bridge.answer(qid, text, answered_by="telegram:chaos")
                with self.lock:
                    self.tally.expected[qid] = text
                    self.tally.written_at[qid] = time.time()

    # -- the killer ---------------------------------------------------------------

    def finished(self, futures: list[Future[None]]) -> bool:
        if not all(f.done() for f in futures):
            return False
        with self.lock:
            acked = set(self.tally.acked)
        return all(any(q in a.arrivals for a in self.askers) for q in acked)

    def alive(self) -> bool:
        proc = self.bridge.proc
        return proc is not None and proc.poll() is None

    def is_ready(self) -> bool:
        proc = self.bridge.proc
        try:
            entry = json.loads(self.bridge.entry_path().read_text())
        except (OSError, ValueError):
            return False
        return proc is not None and isinstance(entry, dict) and entry.get("pid") == proc.pid

    def start(self) -> None:
        self.bridge.start(wait=False, preexec=self.preexec)
        self.tally.starts += 1
        self.seen_ready = False

    def ready_now(self) -> bool:
        """Counts each start once: how many lives got as far as taking prompts."""
        if not self.seen_ready and self.is_ready():
            self.seen_ready = True
            self.tally.ready += 1
        return self.seen_ready

    def one_life(self, futures: list[Future[None]]) -> bool:
        """Start the daemon and kill it 0.5–1 s later (from its start, not its
        readiness: a kill may land in the start too). True when the run is over
        instead: the daemon is then left running."""
        self.start()
        until = time.monotonic() + self.rng.uniform(self.args.kill_min, self.args.kill_max)
        while time.monotonic() < until:
            self.ready_now()
            proc = self.bridge.proc
            if proc is not None and proc.poll() is not None:
                self.tally.exits[proc.returncode] += 1
                return False  # it died by itself: start it again, no kill to count
            if self.finished(futures) and self.tally.kills >= self.args.min_kills:
                return True
            if time.monotonic() > self.deadline:
                self.tally.deadline_passed = True
                return True
            time.sleep(POLL_S)
        self.bridge.kill()
        self.tally.kills += 1
        return False

    def progress(self, last: float) -> float:
        now = time.monotonic()
        if now - last < PROGRESS_EVERY_S:
            return last
        with self.lock:
            acked = len(self.tally.acked)
        answered = sum(len(a.arrivals) for a in self.askers)
        print(f"  {now - self.started_at:5.1f} s: acked {acked}, answered {answered}, "
              f"kills {self.tally.kills}", file=sys.stderr, flush=True)
        return now

    def settle(self) -> None:
        """What the last start sends again (owed responses, pending questions) comes
        after the moment the run looked finished: counted, not cut off."""
        if not self.alive():
            self.start()
        give_up = time.monotonic() + READY_TIMEOUT_S
        while not self.ready_now() and self.alive() and time.monotonic() < give_up:
            time.sleep(POLL_S)
        time.sleep(self.args.settle)

    def run(self) -> int:
        human = threading.Thread(target=self.human, name="chaos-human", daemon=True)
        pool = ThreadPoolExecutor(self.args.clients, thread_name_prefix="chaos-asker")
        try:
            human.start()
            futures = [pool.submit(self.ask, i) for i in range(len(self.tally.qids))]
            last = self.started_at
            while not self.one_life(futures):
                last = self.progress(last)
            if not self.tally.deadline_passed:
                self.settle()
        except KeyboardInterrupt:
            self.tally.interrupted = True
        finally:
            self.stop.set()
            self.bridge.kill()  # first: a client waiting on its reply then gets EOF
            pool.shutdown(wait=True, cancel_futures=True)
            human.join(timeout=5)
        return self.report()

    def report(self) -> int:
        t = self.tally
        t.wall_s = time.monotonic() - self.started_at
        for run in NdjsonTail(self.bridge.hermes.directory / "started.ndjson").new():
            qid = question_qid(run)
            if qid is None:
                t.notes += 1
                continue
            t.asked[qid] += 1
            # The fake stamps its start once its interpreter is up, some 20 ms after the
            # spawn: a send stamped after the answer was written may have been spawned
            # just before it, never long before.
            if run.get("start", 0) > t.written_at.get(qid, float("inf")):
                t.after_answer[qid] += 1
        for asker in self.askers:
            for raw in list(asker.lines):
                try:
                    envelope = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(envelope, dict) and envelope.get("type") == "response":
                    t.responses.setdefault(str(envelope.get("msg_id")), []).append(envelope)
        lines, code = verdict(t)
        a = self.args
        print(f"chaos: {a.questions} questions, seed {a.seed}, kills every "
              f"{a.kill_min:g}–{a.kill_max:g} s, hermes {a.hermes_ms:g} ms a send, "
              f"{a.askers} askers, {a.clients} clients, deadline {a.deadline:g} s")
        print("\n".join(lines))
        if a.keep:
            print(f"kept: {self.bridge.base}")
        return 130 if t.interrupted else code

    def close(self) -> None:
        self.bridge.kill()
        for asker in self.askers:
            asker.close()
        if self.args.keep:
            (self.bridge.base / "daemon-stderr.log").write_text(
                "".join(f"{line}\n" for line in self.bridge.stderr_lines))
        else:
            shutil.rmtree(self.bridge.base, ignore_errors=True)


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # the same cleanup as Ctrl-C: the daemon must not outlive us


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--questions", type=int, default=200, help="questions asked (200)")
    parser.add_argument("--seed", type=int, default=None,
                        help="seeds the kill intervals and the resend jitter (default: drawn, "
                             "and printed)")
    parser.add_argument("--deadline", type=float, default=120.0,
                        help="seconds before it gives up waiting (120)")
    parser.add_argument("--hermes-ms", type=float, default=50.0,
                        help="how long the fake hermes takes to send, beyond its start (50)")
    parser.add_argument("--kill-min", type=float, default=0.5,
                        help="shortest life of a daemon, seconds from its start (0.5)")
    parser.add_argument("--kill-max", type=float, default=1.0,
                        help="longest life of a daemon, seconds from its start (1.0)")
    parser.add_argument("--min-kills", type=int, default=0,
                        help="kill at least this often, even once everything is answered (0)")
    parser.add_argument("--askers", type=int, default=4, help="asker endpoints (4)")
    parser.add_argument("--clients", type=int, default=8,
                        help="threads sending prompts, each one prompt at a time (8)")
    parser.add_argument("--settle", type=float, default=1.0,
                        help="seconds the last daemon runs unharmed at the end (1.0)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the scratch directory (log, state, hermes runs, stderr)")
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)
    if not 0 < args.kill_min <= args.kill_max:
        parser.error("need 0 < --kill-min <= --kill-max")
    if args.questions < 1 or args.askers < 1 or args.clients < 1:
        parser.error("--questions, --askers and --clients must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminated)
    chaos = Chaos(args)
    try:
        return chaos.run()
    finally:
        chaos.close()


if __name__ == "__main__":
    sys.exit(main())
