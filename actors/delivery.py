"""The DeliveryActor: `hermes send` out (W20, C18), one at a time, in order."""

from __future__ import annotations

import functools
import sqlite3
from collections import deque
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ulid import ULID

from ..messages.commands import (
    Address,
    EarlierSendsEnded,
    HermesRan,
    LogEvent,
    QuestionSpec,
    SendText,
    UnknownMessage,
)
from ..messages.contract import (
    delivery_error,
    format_question,
    is_group_target,
    js_string,
    log_record,
)
from .loop import Spawned, report, shared_edge, tell_quietly, utc_now
from .sends import (
    UNKEPT,
    Outcome,
    finished,
    forget,
    run_send,
    send_key,
    send_paths,
    sends_dir,
    under_way,
    wait_done,
)
from .supervision import PooledChild

if TYPE_CHECKING:
    from .config import BridgeConfig
    from .store import Store


def question_send(spec: QuestionSpec, config: BridgeConfig) -> SendText:
    """The one text a question is asked with, whoever asks for it."""
    text = format_question(spec.qid, spec.parsed, project=config.project,
                           group=is_group_target(config.target))
    return SendText(spec.qid, text, "question")


def judged(outcome: Outcome, send_timeout_ms: float) -> str | None:
    """None when hermes said it sent, else C18's error text."""
    if outcome.error is not None:
        return delivery_error(None, outcome.error)
    result = outcome.result
    if result.returncode is None:
        ms = js_string(send_timeout_ms)  # X17: 1e-7ms, as upstream says
        return delivery_error(None, f"timed out after {ms}ms")
    if result.returncode == 0:
        return None
    return delivery_error(result.returncode, result.stderr, result.stdout)


class DeliveryActor(PooledChild):
    """One send at a time, in order, so a note never overtakes its question in the chat; a
    wedged hermes costs one send timeout. Each runs under a waiter that outlives us
    (actors/sends.py): a stop or crash mid-send neither kills hermes nor sends again."""

    def __init__(self, *, config: BridgeConfig, store: Store, router: Address, logger: Address,
                 supervisor: Address, now: Callable[[], datetime] = utc_now,
                 name: str = "delivery") -> None:
        super().__init__(name, supervisor)
        self.config, self.store, self.router, self.logger, self.now = (
            config, store, router, logger, now)
        self.sends = sends_dir(config.state_path)
        self._jobs: deque[SendText] = deque()
        self._keys: set[str] = set()  # of the jobs queued or running: none is queued twice
        self._running: tuple[SendText, str, Spawned[Outcome]] | None = None
        self._earlier: Spawned[bool] | None = None  # sends an earlier run left under way

    def begin(self) -> None:
        """Sends left under way (by the last run, or before a crash) end before any other
        starts; their outcomes go to the store, where jobs told again find them. Then
        every send the store owes is queued: questions not yet delivered, then notes."""
        running = under_way(self.sends)
        if running:
            report(f"{self.child_name}: waiting for {len(running)} send(s) under way", "info")
            self._earlier = shared_edge().spawn(
                wait_done(running, self.config.send_timeout_ms / 1000 + 10))
            me = self.actor_ref  # (the callback runs on the loop: it only tells)
            self._earlier.add_done_callback(lambda _: tell_quietly(me, EarlierSendsEnded()))
        else:
            self._take_finished()
        specs, _ = self.store.load()
        for spec in specs:
            if spec.state in (None, "pending"):
                self._queue(question_send(spec, self.config))
        for note in self.store.owed_notes():
            self._queue(note)
        self._next()

    def on_receive(self, message: Any) -> None:
        match message:
            case SendText():
                self._queue(message)
                self._next()
            case HermesRan(job=job, error=error):  # of the current job: only it runs
                self._ended(error)
                self._settle(job, error)
                self._next()
            case EarlierSendsEnded():
                self._earlier = None
                self._take_finished()
                self._next()
            case _:
                raise UnknownMessage(self.child_name, message)

    def release(self) -> None:
        for waiting in (self._earlier, self._running[2] if self._running else None):
            if waiting is not None:  # only the waiting stops: hermes runs on
                waiting.cancel()

    def argv(self, text: str) -> list[str]:
        """W20, never through a shell."""
        c = self.config
        profile = ["--profile", c.hermes_profile] if c.hermes_profile else []
        return [c.hermes, *profile, "send", "--to", c.target, text]

    def _take_finished(self) -> None:
        """Into the store, then the files go."""
        done = list(finished(self.sends))
        if not done:
            return
        for outcome, _, _ in done:
            if outcome is not None and not outcome.key.startswith(UNKEPT):
                self.store.record_sent(outcome.key, judged(outcome, self.config.send_timeout_ms))
        for _, lock, path in done:
            forget(lock, path)

    def _queue(self, job: SendText) -> None:
        """A job told again (a restart) while queued or running is not queued twice."""
        key = send_key(job)
        if key is not None:
            if key in self._keys:
                return
            self._keys.add(key)
        self._jobs.append(job)

    def _next(self) -> None:
        while self._running is None and self._earlier is None and self._jobs:
            job = self._jobs.popleft()
            key = send_key(job)
            if self._withdrawn(key):
                self._keys.discard(key or "")
                continue
            known = self.store.sent_outcome(key) if key is not None else None
            if known is not None:  # hermes ran it before a restart: never twice
                self._settle(job, known[0])
                continue
            key = key or f"{UNKEPT}{ULID()}"
            run = shared_edge().spawn(run_send(self.sends, key, self.argv(job.text),
                                               self.config.send_timeout_ms / 1000))
            self._running = job, key, run
            run.add_done_callback(functools.partial(
                self._ran, self.actor_ref, job, self.config.send_timeout_ms))

    @staticmethod
    def _ran(me: Address, job: SendText, send_timeout_ms: float, done: Spawned[Outcome]
             ) -> None:
        """On the loop: only tells (static, so it cannot touch the actor)."""
        if done.cancelled():  # this actor stopped: its successor takes the outcome
            return
        exc = done.exception()
        if exc is None:
            error = judged(done.result(), send_timeout_ms)
        elif isinstance(exc, OSError | ValueError):
            error = delivery_error(None, str(exc))
        else:
            error = delivery_error(None, f"{type(exc).__name__}: {exc}")
        tell_quietly(me, HermesRan(job, error))

    def _ended(self, error: str | None) -> None:
        """Into the store before its files go and before anyone acts on it."""
        assert self._running is not None
        _, key, _ = self._running
        self._running = None
        if not key.startswith(UNKEPT):
            self.store.record_sent(key, error)
        forget(*send_paths(self.sends, key))

    def _withdrawn(self, key: str | None) -> bool:
        """Owed no more (checked just before hermes runs): a question delivered or closed, a
        note run, a reminder whose question closed meanwhile (X9)."""
        if key is None:
            return False
        try:
            return not self.store.send_owed(key)
        except sqlite3.Error as exc:  # the state file's edge: send it (at least once)
            report(f"{self.child_name}: cannot tell whether {key} is owed: {exc!r}")
            return False

    def _settle(self, job: SendText, error: str | None) -> None:
        self._keys.discard(send_key(job) or "")
        if error is not None:
            report(f"{job.purpose} for {job.qid} not delivered: {error}", "error")
        if job.purpose == "question":
            self.router.tell(HermesRan(job, error))
        elif error is not None:  # a note: nobody waits on it, so it is only logged (C20)
            detail = {"phase": job.purpose, "error": error}
            self.logger.tell(LogEvent(log_record(self.now(), job.qid, "delivery_error", detail)))
        if job.note_id is not None:  # hermes ran it (sent, or failed and logged): owed no more
            try:
                self.store.note_sent(job.note_id)
            except sqlite3.Error as exc:  # the state file's edge: it stays owed, sent again
                report(f"could not record the {job.purpose} for {job.qid} as sent: {exc!r}")
