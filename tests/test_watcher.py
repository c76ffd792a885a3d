"""WatcherActor: answer files in, verdicts carried out (C7-C10, C15, C20, W21).

Unit tests use a real directory and real inotify with fake collaborators and,
where the grace window (C10) matters, a hand-moved clock. The integration
tests at the end use the real clock and write files the ways the gateway may.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pykka
import pytest
from fakes import FakeRef, wait_for

from coms_hermes_bridge.actors.watcher import WatcherActor
from coms_hermes_bridge.messages.commands import (
    AnswerFileSeen,
    DisposeAnswerFile,
    FilesChanged,
    FileSignature,
    LogEvent,
    RemoveAnswerFile,
    Rescan,
    SendText,
)
from coms_hermes_bridge.messages.contract import NO_QID, Late, Rejected, late_note
from coms_hermes_bridge.messages.model import LogRecord, RejectReason, State

QID = "01HZY3K4M5N6P7Q8R9S0T1V2W3"
NAME = f"{QID}.answer.json"
AT = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
SLOW_POLL_MS = 60_000.0  # no rescan beat during a unit test; grace is 120 s
ANSWER = json.dumps(
    {"qid": QID, "answer": "yes", "answered_by": "telegram:42", "at": "2025-01-02T03:04:05Z"}
).encode()


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Rig:
    def __init__(self, directory: Path, poll_ms: float, clock: Clock | None) -> None:
        self.dir = directory
        self.router = FakeRef("router")
        self.logger = FakeRef("logger")
        self.delivery = FakeRef("delivery")
        self.supervisor = FakeRef("supervisor")
        extra: dict[str, Any] = {"clock": clock} if clock is not None else {}
        self.ref = WatcherActor.start(
            supervisor=self.supervisor,
            router=self.router,
            logger=self.logger,
            delivery=self.delivery,
            questions_dir=directory,
            poll_ms=poll_ms,
            now=lambda: AT,
            **extra,
        )

    def sync(self) -> None:
        """Wait until the watcher has handled everything told to it so far."""
        self.ref.ask(FilesChanged(()))

    def seen(self, content: bytes | None = None, timeout: float = 5.0) -> AnswerFileSeen:
        """The next AnswerFileSeen (with `content`, when given)."""
        deadline = time.monotonic() + timeout
        while True:
            seen = self.router.expect(AnswerFileSeen, timeout=max(0.01, deadline - time.monotonic()))
            if content is None or seen.content == content:
                return seen

    def logged(self, timeout: float = 5.0) -> LogRecord:
        return self.logger.expect(LogEvent, timeout=timeout).record


def write(path: Path, content: bytes) -> FileSignature:
    path.write_bytes(content)
    st = os.stat(path)
    return FileSignature(st.st_ino, st.st_size, st.st_mtime_ns)


def start(tmp_path: Path, poll_ms: float = SLOW_POLL_MS, clock: Clock | None = None) -> Rig:
    return Rig(tmp_path / "questions", poll_ms, clock)


# -- seeing files ----------------------------------------------------------------


def test_start_creates_the_directory(tmp_path: Path) -> None:  # C7
    rig = start(tmp_path)
    rig.sync()
    assert rig.dir.is_dir()


def test_a_valid_name_goes_to_the_router_with_content_and_signature(tmp_path: Path) -> None:  # C9
    rig = start(tmp_path)
    rig.sync()
    signature = write(rig.dir / NAME, ANSWER)
    assert rig.seen(ANSWER) == AnswerFileSeen(NAME, ANSWER, signature)
    assert (rig.dir / NAME).exists()  # the watcher never judges content itself


def test_a_file_written_while_stopped_is_picked_up_by_the_start_scan(tmp_path: Path) -> None:
    directory = tmp_path / "questions"
    directory.mkdir()
    signature = write(directory / NAME, ANSWER)
    rig = start(tmp_path)
    assert rig.seen() == AnswerFileSeen(NAME, ANSWER, signature)


def test_rescan_sends_every_file_again(tmp_path: Path) -> None:
    rig = start(tmp_path)
    rig.sync()
    signature = write(rig.dir / NAME, ANSWER)
    rig.seen(ANSWER)
    rig.ref.tell(Rescan())
    assert rig.seen() == AnswerFileSeen(NAME, ANSWER, signature)


def test_anything_but_a_regular_file_is_ignored(tmp_path: Path) -> None:
    rig = start(tmp_path)
    rig.sync()
    (rig.dir / NAME).mkdir()
    (rig.dir / f"{'1' * 26}.answer.json").symlink_to(tmp_path / "elsewhere.json")
    rig.ref.tell(Rescan())
    rig.sync()
    rig.router.quiet(0.2)
    rig.logger.quiet(0.0)


# -- rejection (C9, C10) --------------------------------------------------------


@pytest.mark.parametrize(
    "reason", ["foreign_qid", "invalid_schema", "qid_mismatch", "invalid_path", "invalid_qid"]
)
def test_a_rejected_file_is_logged_and_removed(tmp_path: Path, reason: RejectReason) -> None:  # C9, C20
    rig = start(tmp_path)
    rig.sync()
    signature = write(rig.dir / NAME, ANSWER)
    rig.seen(ANSWER)
    rig.ref.tell(DisposeAnswerFile(NAME, signature, Rejected(reason, QID)))
    record = rig.logged()
    assert (record.qid, record.event) == (QID, "answer_rejected")
    assert record.detail == {"reason": reason, "file": NAME}
    assert record.at == "2025-01-02T03:04:05.000Z"
    assert not (rig.dir / NAME).exists()


@pytest.mark.parametrize(
    ("name", "reason"),
    [("notes.txt", "invalid_path"), ("01hzy3k4m5n6p7q8r9s0t1v2w3.answer.json", "invalid_qid"),
     ("01HZY3K4M5N6P7Q8R9S0T1V2WI.answer.json", "invalid_qid")],
)
def test_a_bad_name_is_rejected_by_the_watcher_after_the_grace(
    tmp_path: Path, name: str, reason: RejectReason
) -> None:  # C9, C10
    clock = Clock()
    rig = start(tmp_path, poll_ms=500, clock=clock)  # grace 1000 ms
    rig.sync()
    (rig.dir / name).write_bytes(b"{}")
    rig.ref.ask(FilesChanged((name,)))  # first sighting, at the clock's start
    clock.now += 0.9
    rig.ref.tell(Rescan())
    rig.sync()
    rig.logger.quiet(0.1)
    assert (rig.dir / name).exists()  # maybe a temporary name, about to be renamed
    clock.now += 0.2
    rig.ref.tell(Rescan())
    record = rig.logged()
    assert (record.qid, record.event) == (NO_QID, "answer_rejected")
    assert record.detail == {"reason": reason, "file": name}
    assert not (rig.dir / name).exists()
    rig.router.quiet(0.0)  # a bad name never reaches the router


def test_a_temporary_name_renamed_in_time_is_never_rejected(tmp_path: Path) -> None:  # C10, W21
    clock = Clock()
    rig = start(tmp_path, poll_ms=500, clock=clock)
    rig.sync()
    temp = rig.dir / ".answer.tmp"
    temp.write_bytes(ANSWER)
    rig.ref.tell(Rescan())
    rig.sync()
    os.rename(temp, rig.dir / NAME)
    rig.seen(ANSWER)
    clock.now += 5
    rig.ref.tell(Rescan())
    rig.seen(ANSWER)
    rig.sync()
    assert all(e.record.event != "answer_rejected" for e in rig.logger.seen)
    rig.logger.quiet(0.0)


def test_invalid_json_stays_for_the_grace_then_goes(tmp_path: Path) -> None:  # C10
    clock = Clock()
    rig = start(tmp_path, poll_ms=100, clock=clock)  # grace 1000 ms
    rig.sync()
    signature = write(rig.dir / NAME, b'{"qid": "01')
    rig.seen()
    rig.ref.tell(DisposeAnswerFile(NAME, signature, Rejected("invalid_json", QID)))
    clock.now += 0.99
    rig.ref.tell(DisposeAnswerFile(NAME, signature, Rejected("invalid_json", QID)))
    rig.sync()
    assert (rig.dir / NAME).exists()
    rig.logger.quiet(0.1)
    clock.now += 0.02
    rig.ref.tell(DisposeAnswerFile(NAME, signature, Rejected("invalid_json", QID)))
    record = rig.logged()
    assert (record.qid, record.event) == (QID, "answer_rejected")
    assert record.detail == {"reason": "invalid_json", "file": NAME}
    assert not (rig.dir / NAME).exists()


def test_the_grace_starts_again_for_a_new_file_after_removal(tmp_path: Path) -> None:  # C10
    clock = Clock()
    rig = start(tmp_path, poll_ms=100, clock=clock)
    rig.sync()
    old = write(rig.dir / NAME, b"{")
    rig.seen(b"{")
    clock.now += 2
    rig.ref.tell(DisposeAnswerFile(NAME, old, Rejected("invalid_json", QID)))
    rig.logged()
    new = write(rig.dir / NAME, b"[")
    rig.seen(b"[")
    rig.ref.tell(DisposeAnswerFile(NAME, new, Rejected("invalid_json", QID)))
    rig.sync()
    assert (rig.dir / NAME).exists()


def test_a_verdict_on_an_older_version_re_examines_the_file(tmp_path: Path) -> None:  # C9
    rig = start(tmp_path)
    rig.sync()
    old = write(rig.dir / NAME, b"{}")
    rig.seen(b"{}")
    new = write(rig.dir / NAME, ANSWER)
    rig.ref.tell(DisposeAnswerFile(NAME, old, Rejected("invalid_schema", QID)))
    rig.ref.tell(DisposeAnswerFile(NAME, old, Late(QID, "answered")))
    assert rig.seen(ANSWER).signature == new
    rig.sync()
    assert (rig.dir / NAME).read_bytes() == ANSWER
    rig.logger.quiet(0.1)
    rig.delivery.quiet(0.0)


def test_a_verdict_on_a_vanished_file_does_nothing(tmp_path: Path) -> None:
    rig = start(tmp_path)
    rig.sync()
    signature = write(rig.dir / NAME, ANSWER)
    rig.seen()
    (rig.dir / NAME).unlink()
    rig.ref.tell(DisposeAnswerFile(NAME, signature, Rejected("foreign_qid", QID)))
    rig.ref.tell(DisposeAnswerFile(NAME, signature, Late(QID, "answered")))
    rig.sync()
    rig.logger.quiet(0.1)
    rig.delivery.quiet(0.0)


# -- late answers (C15) ---------------------------------------------------------


@pytest.mark.parametrize("state", ["answered", "cancelled", "timeout"])
def test_a_late_answer_is_logged_removed_and_noted(tmp_path: Path, state: State) -> None:  # C15
    rig = start(tmp_path)
    rig.sync()
    signature = write(rig.dir / NAME, ANSWER)
    rig.seen(ANSWER)
    rig.ref.tell(DisposeAnswerFile(NAME, signature, Late(QID, state)))
    rig.ref.tell(DisposeAnswerFile(NAME, signature, Late(QID, state)))  # a duplicate sighting
    record = rig.logged()
    assert (record.qid, record.event, record.detail) == (QID, "late_answer", {"state": state})
    assert not (rig.dir / NAME).exists()
    assert rig.delivery.next() == SendText(QID, late_note(QID), "late_note", None)
    rig.sync()
    rig.logger.quiet(0.1)
    rig.delivery.quiet(0.0)


# -- removal after an accepted answer (C2) --------------------------------------


def test_remove_answer_file_removes_only_the_version_that_was_read(tmp_path: Path) -> None:  # C2
    rig = start(tmp_path)
    rig.sync()
    first = write(rig.dir / NAME, ANSWER)
    rig.seen(ANSWER)
    newer = ANSWER.replace(b'"yes"', b'"no, wait"')
    second = write(rig.dir / NAME, newer)
    assert first != second
    rig.ref.ask(RemoveAnswerFile(NAME, first))
    assert (rig.dir / NAME).read_bytes() == newer
    rig.ref.ask(RemoveAnswerFile(NAME, second))
    assert not (rig.dir / NAME).exists()
    rig.ref.ask(RemoveAnswerFile(NAME, second))  # gone already: nothing to do
    rig.logger.quiet(0.0)


# -- life cycle -----------------------------------------------------------------


def test_stop_is_quick_and_closes_inotify(tmp_path: Path) -> None:
    rig = start(tmp_path, poll_ms=100)
    rig.sync()
    fds = len(os.listdir("/proc/self/fd"))
    began = time.monotonic()
    rig.ref.stop(timeout=2)
    assert time.monotonic() - began < 0.5
    assert len(os.listdir("/proc/self/fd")) < fds
    assert not any(t.name.startswith("watcher-") for t in threading.enumerate())


def test_an_unknown_message_fails_loudly(tmp_path: Path) -> None:
    rig = start(tmp_path)
    rig.ref.tell("hello")
    assert "watcher" in repr(rig.supervisor.next())


# -- integration: the real clock, real writers (C10, W21) -----------------------


class SimulatedRouter:
    """Plays the Supervisor for content it cannot parse: invalid_json, as classify_answer would."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.contents: list[bytes] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._done.is_set():
            try:
                message = self.rig.router.inbox.get(timeout=0.05)
            except queue.Empty:
                continue
            if not isinstance(message, AnswerFileSeen):
                continue
            self.contents.append(message.content)
            try:
                json.loads(message.content)
            except ValueError:
                verdict = Rejected("invalid_json", QID)
                try:
                    self.rig.ref.tell(DisposeAnswerFile(message.name, message.signature, verdict))
                except pykka.ActorDeadError:
                    return

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=1)


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[Rig, SimulatedRouter]]:
    rig = start(tmp_path, poll_ms=100)  # real clock; grace 1000 ms
    rig.sync()
    router = SimulatedRouter(rig)
    yield rig, router
    router.stop()


def no_rejections(rig: Rig) -> bool:
    while True:
        try:
            rig.logger.seen.append(rig.logger.inbox.get_nowait())
        except queue.Empty:
            break
    return all(e.record.event != "answer_rejected" for e in rig.logger.seen)


def test_an_atomically_renamed_answer_arrives_whole(
    tmp_path: Path, live: tuple[Rig, SimulatedRouter]
) -> None:  # W21
    rig, router = live
    outside = tmp_path / "outside.tmp"
    outside.write_bytes(ANSWER)
    os.rename(outside, rig.dir / NAME)
    wait_for(lambda: ANSWER in router.contents, what="the renamed answer")

    other = "01HZY3K4M5N6P7Q8R9S0T1V2W4.answer.json"
    inside = rig.dir / ".hermes-write.tmp"
    with inside.open("wb") as file:
        file.write(ANSWER[:10])
        file.flush()
        time.sleep(0.15)  # let the watcher see the dot-name mid-write
        file.write(ANSWER[10:])
    os.rename(inside, rig.dir / other)
    wait_for(lambda: router.contents.count(ANSWER) >= 2, what="the second renamed answer")
    assert (rig.dir / NAME).exists() and (rig.dir / other).exists()
    assert all(c == ANSWER for c in router.contents)  # never a partial file
    assert no_rejections(rig)


def test_an_answer_written_in_two_steps_arrives_whole(
    live: tuple[Rig, SimulatedRouter]
) -> None:  # C10, W21
    rig, router = live
    path = rig.dir / NAME
    with path.open("wb") as file:
        file.write(ANSWER[: len(ANSWER) // 2])
    wait_for(lambda: ANSWER[: len(ANSWER) // 2] in router.contents, what="the first half")
    time.sleep(0.3)  # the gateway's pause between its two writes (part of the scenario)
    with path.open("ab") as file:
        file.write(ANSWER[len(ANSWER) // 2 :])
    wait_for(lambda: ANSWER in router.contents, what="the whole answer")
    assert router.contents[0] != ANSWER  # the router did see it half written first
    assert path.read_bytes() == ANSWER
    assert no_rejections(rig)


def test_a_file_that_never_becomes_json_is_rejected_after_the_grace(
    live: tuple[Rig, SimulatedRouter]
) -> None:  # C10
    rig, router = live
    path = rig.dir / NAME
    began = time.monotonic()
    path.write_bytes(b"not json, and never will be")
    wait_for(lambda: router.contents, what="the file to be seen")
    # it must stay for the whole grace window (1 s here): watch it for the first half
    while time.monotonic() - began < 0.5:
        assert path.exists() or time.monotonic() - began >= 1.0, "removed inside the grace"
        time.sleep(0.01)
    record = rig.logged(timeout=3)
    elapsed = time.monotonic() - began
    assert (record.qid, record.event) == (QID, "answer_rejected")
    assert record.detail == {"reason": "invalid_json", "file": NAME}
    assert not path.exists()
    assert 1.0 <= elapsed < 2.5
