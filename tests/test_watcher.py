"""WatcherActor: answer files in, verdicts carried out (C7-C10, C15, C20, W21, X6, X7).

The Watcher is started as the tree starts it, with FakeRefs for its
collaborators; its questions_dir and poll_ms come from the settings. Unit tests use a
real directory and real inotify and, where the grace window (C10) matters, a
hand-moved clock. The integration tests at the end use the real clock and write
files the ways the gateway may.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import queue
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import inotify_simple
import pykka
import pytest
from inotify_simple import INotify

from coms_hermes_bridge.actors import watcher as hermes
from coms_hermes_bridge.actors.files import read_at_most
from coms_hermes_bridge.actors.loop import shared_edge
from coms_hermes_bridge.actors.watcher import DEFAULT_REOFFER_S, WatcherActor
from coms_hermes_bridge.messages.commands import (
    AnswerFileSeen,
    DisposeAnswerFile,
    FilesChanged,
    FileSignature,
    LogEvent,
    RejectAnswerFile,
    Rescan,
    SendText,
)
from coms_hermes_bridge.messages.contract import (
    ANSWER_FILE_LIMIT,
    NO_QID,
    UNREADABLE_REASONS,
    Rejected,
    unreadable_note,
)
from coms_hermes_bridge.messages.wire import LogRecord, RejectReason
from tests.fakes import (
    FakeClock,
    FakeRef,
    WiredRig,
    actors_held,
    bridge_config,
    edge_caught_up,
    handled,
    said,
    wait_for,
)

QID = "01HZY3K4M5N6P7Q8R9S0T1V2W3"
NAME = f"{QID}.answer.json"
OTHER = "01HZY3K4M5N6P7Q8R9S0T1V2W4.answer.json"  # another valid answer name, sorted after NAME
AT = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
SLOW_POLL_MS = 60_000.0  # no rescan beat during a unit test; grace is 120 s
ANSWER = json.dumps(
    {"qid": QID, "answer": "yes", "answered_by": "telegram:42", "at": "2025-01-02T03:04:05Z"}
).encode()


def note(reason: RejectReason) -> SendText:
    """X7: what Delivery is told when an answer to the open question QID is refused."""
    return SendText(QID, unreadable_note(QID, reason), "unreadable_note", None)


class Rig(WiredRig[WatcherActor]):
    """A WatcherActor on `directory` (questions_dir and poll_ms in its settings, the
    log's time pinned to AT); `clock` and `reoffer_s` are the Watcher's own options."""

    def __init__(self, directory: Path, *, poll_ms: float, clock: FakeClock | None,
                 reoffer_s: float) -> None:
        self.dir = directory
        self.watcher_clock = clock
        super().__init__(WatcherActor, config=bridge_config(questions_dir=directory, poll_ms=poll_ms),
                         now=lambda: AT, reoffer_s=reoffer_s)

    def start(self, actor_class: type[WatcherActor],
              options: dict[str, Any]) -> pykka.ActorRef[WatcherActor]:
        if self.watcher_clock is not None:  # its own clock, beside the log's
            options = {**options, "clock": self.watcher_clock}
        return super().start(actor_class, options)

    def sync(self) -> None:
        """Wait until the watcher has handled everything told to it so far, and the
        inotify events of every change made before (the test's, and its own meanwhile):
        after it, an absence needs no waiting (`assert_nothing`)."""
        handled(self.ref)
        edge_caught_up()  # their FilesChanged are told by now
        handled(self.ref)

    def seen(
        self, content: bytes | None = None, timeout: float = 5.0,
        version: FileSignature | None = None,
    ) -> AnswerFileSeen:
        """The next AnswerFileSeen (with `content`, or of `version`, when given).

        A file the test writes may be seen twice: empty, at its creation, then whole,
        when it is closed; a test that wants the whole one names it."""
        deadline = time.monotonic() + timeout
        while True:
            seen = self.router.expect(AnswerFileSeen, timeout=max(0.01, deadline - time.monotonic()))
            if (content is None or seen.content == content) and (
                version is None or seen.signature == version
            ):
                return seen

    def logged(self, timeout: float = 5.0) -> LogRecord:
        return self.logger.expect(LogEvent, timeout=timeout).record


def start(
    tmp_path: Path, poll_ms: float = SLOW_POLL_MS, clock: FakeClock | None = None,
    reoffer_s: float = DEFAULT_REOFFER_S,
) -> Rig:
    return Rig(tmp_path / "questions", poll_ms=poll_ms, clock=clock, reoffer_s=reoffer_s)


def signature_of(path: Path) -> FileSignature:
    st = os.stat(path)
    return FileSignature(st.st_ino, st.st_size, st.st_mtime_ns)


def write(path: Path, content: bytes) -> FileSignature:
    path.write_bytes(content)
    return signature_of(path)


def sparse(path: Path, size: int) -> FileSignature:
    with path.open("wb") as file:
        file.truncate(size)
    return signature_of(path)


def mode(path: Path) -> int:
    return os.stat(path).st_mode & 0o777


def untold_change(path: Path) -> FileSignature:
    """Change a file's version in a way inotify is not asked to report (attributes
    only): it stands for an event lost, or made while nothing watched."""
    os.utime(path, ns=(1_000_000_000, 2_000_000_000))
    return signature_of(path)


# -- seeing files ----------------------------------------------------------------


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


def test_rescan_does_not_hand_on_a_file_again_until_it_is_due(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[int] = []
    real = hermes.read_at_most

    def counted(fd: int, limit: int) -> bytes | None:
        reads.append(fd)
        return real(fd, limit)

    monkeypatch.setattr(hermes, "read_at_most", counted)
    clock = FakeClock()
    rig = start(tmp_path, clock=clock, reoffer_s=30)
    rig.sync()
    signature = write(rig.dir / NAME, ANSWER)
    rig.seen(ANSWER)
    rig.sync()
    read_once = len(reads)
    for _ in range(3):
        rig.ref.tell(Rescan())
    rig.sync()
    rig.router.assert_nothing()
    assert len(reads) == read_once  # not re-read, so not re-parsed either
    clock.now += 30  # still there after the re-offer age: its question may have crashed
    rig.ref.tell(Rescan())
    assert rig.seen() == AnswerFileSeen(NAME, ANSWER, signature)
    newer = write(rig.dir / NAME, ANSWER.replace(b'"yes"', b'"no"'))  # a new version goes at once
    assert rig.seen(ANSWER.replace(b'"yes"', b'"no"')).signature == newer


def test_a_rescan_hands_on_a_version_that_changed_without_an_event(
    tmp_path: Path,
) -> None:  # the safety net: an event lost, and the handed version is not the one there
    clock = FakeClock()
    (tmp_path / "questions").mkdir()
    write(tmp_path / "questions" / NAME, ANSWER)  # before the start: no event still to come
    rig = start(tmp_path, clock=clock, reoffer_s=30)
    rig.seen(ANSWER)  # by the start's scan
    rig.ref.tell(Rescan())
    rig.sync()
    rig.router.assert_nothing()  # handed on and not due
    changed = untold_change(rig.dir / NAME)
    rig.ref.tell(Rescan())
    assert rig.seen() == AnswerFileSeen(NAME, ANSWER, changed)


def test_an_inotify_overflow_brings_a_rescan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # events lost, so every file is looked at again
    overflow = threading.Event()

    class OverflowingINotify(INotify):  # type: ignore[misc]
        def read(self, timeout: int | None = None, read_delay: int | None = None) -> list[Any]:
            if overflow.is_set():
                overflow.clear()
                return [inotify_simple.Event(-1, inotify_simple.flags.Q_OVERFLOW, 0, "")]
            return list(super().read(timeout=timeout, read_delay=read_delay))

    monkeypatch.setattr(hermes, "INotify", OverflowingINotify)
    (tmp_path / "questions").mkdir()
    write(tmp_path / "questions" / NAME, ANSWER)  # before the start: no event still to come
    rig = start(tmp_path, reoffer_s=3600)
    rig.seen(ANSWER)
    rig.sync()
    changed = untold_change(rig.dir / NAME)  # no beat comes: only the overflow's rescan
    overflow.set()
    (rig.dir / "unrelated").write_text("")  # an event, so that inotify is read (and overflows)
    assert rig.seen().signature == changed


def test_a_well_named_fifo_socket_or_symlink_is_rejected_after_the_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # C9, C10: never an answer, whatever its name, and never followed or read
    clock = FakeClock()
    rig = start(tmp_path, poll_ms=500, clock=clock)  # grace 1000 ms
    rig.sync()
    names = [f"01HZY3K4M5N6P7Q8R9S0T1V2W{c}.answer.json" for c in "456789"]
    fifo, sock, link, closed_fifo, closed_file, closed_dir = names
    os.mkfifo(rig.dir / fifo)
    short = f"/tmp/chw{os.getpid()}.sock"  # the directory's path is too long to bind in
    bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound.bind(short)
    bound.close()
    os.rename(short, rig.dir / sock)
    (rig.dir / link).symlink_to(tmp_path / "elsewhere.json")
    # Entries that cannot be opened at all (as for a user without the right; the
    # tests run as root, so the refusal is staged): what they are decides.
    real_open = os.open

    def refusing(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if str(path).endswith((closed_fifo, closed_file, closed_dir)):
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing)
    os.mkfifo(rig.dir / closed_fifo)
    write(rig.dir / closed_file, ANSWER.replace(QID.encode(), closed_file[:26].encode()))
    (rig.dir / closed_dir).mkdir()
    rig.ref.tell(Rescan())  # first sighting of each
    rig.sync()
    rig.logger.assert_nothing()  # within the grace: nothing rejected yet,
    rig.router.assert_nothing()  # and nothing handed on as an answer
    clock.now += 1.1
    rig.ref.tell(Rescan())
    records = [rig.logged() for _ in range(4)]
    assert all((r.qid, r.event) == (NO_QID, "answer_rejected") for r in records)
    assert sorted(json.dumps(r.detail, sort_keys=True) for r in records) == sorted(
        json.dumps({"reason": "invalid_path", "file": name}, sort_keys=True)
        for name in (fifo, sock, link, closed_fifo))
    rig.sync()
    rig.logger.assert_nothing()
    assert sorted(os.listdir(rig.dir)) == sorted([closed_file, closed_dir])  # left: tried later
    assert "cannot remove" not in capsys.readouterr().err  # a directory is never tried
    rig.router.assert_nothing()  # nothing here was ever handed on as an answer


def test_a_directory_with_an_answers_name_is_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # C9: not a file the gateway writes, so not ours to judge or remove
    clock = FakeClock()
    rig = start(tmp_path, poll_ms=500, clock=clock)  # grace 1000 ms
    rig.sync()
    (rig.dir / NAME).mkdir()
    rig.ref.tell(Rescan())  # its first sighting
    rig.sync()
    clock.now += 5
    rig.ref.tell(Rescan())
    rig.sync()
    assert (rig.dir / NAME).is_dir() and os.listdir(rig.dir) == [NAME]
    rig.router.assert_nothing()
    rig.logger.assert_nothing()
    assert capsys.readouterr().err == ""


# -- rejection (C9, C10, C20, X7) -----------------------------------------------


@pytest.mark.parametrize(
    ("reason", "error"),
    [("foreign_qid", None), ("invalid_schema", None), ("qid_mismatch", None),
     ("invalid_path", None), ("invalid_qid", None), ("invalid_schema", "answer: missing")],
)
def test_a_rejected_file_is_logged_removed_and_said(
    tmp_path: Path, reason: RejectReason, error: str | None, capsys: pytest.CaptureFixture[str]
) -> None:  # C9, C20; X7: the human hears of it only for a question that is open (X6: a
    # foreign file is rejected at once, and nobody is told)
    rig = start(tmp_path)
    rig.sync()
    signature = write(rig.dir / NAME, ANSWER)
    rig.seen(ANSWER)
    capsys.readouterr()
    rig.ref.tell(RejectAnswerFile(NAME, signature, Rejected(reason, QID, error)))
    record = rig.logged()
    assert (record.qid, record.event) == (QID, "answer_rejected")
    assert record.detail == {"reason": reason, "file": NAME, **({"error": error} if error else {})}
    assert record.at == "2025-01-02T03:04:05.000Z"
    assert not (rig.dir / NAME).exists()
    rig.sync()  # the turn that logged it is over
    assert capsys.readouterr().err == (
        f"coms-hermes-bridge: warning: rejected answer file {NAME}: {reason}"
        + (f" ({error})" if error else "") + "\n")
    if reason in UNREADABLE_REASONS:
        assert rig.delivery.next() == note(reason)
    rig.delivery.assert_nothing()


def test_a_badly_named_file_gone_before_it_is_looked_at_is_forgotten_quietly(
    tmp_path: Path,
) -> None:  # a writer's temporary name, renamed away before its event is read
    rig = start(tmp_path)
    rig.sync()
    with actors_held():  # its events are read once the file is gone
        write(rig.dir / "answer.tmp", ANSWER)
        (rig.dir / "answer.tmp").unlink()
    rig.sync()
    rig.supervisor.assert_nothing()  # no crash, so no restart
    rig.router.assert_nothing()
    rig.logger.assert_nothing()


@pytest.mark.parametrize("size", [ANSWER_FILE_LIMIT, ANSWER_FILE_LIMIT + 1])
def test_a_file_is_read_up_to_the_limit_and_past_it_handed_on_unread(
    tmp_path: Path, size: int
) -> None:  # C9, bounded reads: one over the limit is rejected with its size, never read
    rig = start(tmp_path)
    rig.sync()
    signature = sparse(rig.dir / NAME, size)
    over = size > ANSWER_FILE_LIMIT
    assert rig.seen(version=signature) == AnswerFileSeen(
        NAME, None if over else b"\0" * size, signature)
    rig.ref.tell(RejectAnswerFile(NAME, signature, Rejected("invalid_schema", QID)))
    record = rig.logged()
    assert (record.qid, record.event) == (QID, "answer_rejected")
    assert record.detail == {"reason": "invalid_schema", "file": NAME,
                             **({"size": size, "limit": ANSWER_FILE_LIMIT} if over else {})}
    assert not (rig.dir / NAME).exists()


@pytest.mark.parametrize(
    ("name", "reason"),
    [("notes.txt", "invalid_path"), ("01hzy3k4m5n6p7q8r9s0t1v2w3.answer.json", "invalid_qid"),
     ("01HZY3K4M5N6P7Q8R9S0T1V2WI.answer.json", "invalid_qid")],
)
def test_a_bad_name_is_rejected_by_the_watcher_after_the_grace(
    tmp_path: Path, name: str, reason: RejectReason
) -> None:  # C9, C10
    clock = FakeClock()
    rig = start(tmp_path, poll_ms=500, clock=clock)  # grace 1000 ms
    rig.sync()
    (rig.dir / name).write_bytes(b"{}")
    rig.ref.tell(FilesChanged((name,)))
    rig.sync()  # first sighting, at the clock's start
    clock.now += 0.9995
    rig.ref.tell(Rescan())
    rig.sync()
    rig.logger.assert_nothing()
    assert (rig.dir / name).exists()  # maybe a temporary name, about to be renamed
    clock.now += 0.0005  # the grace is over, to the moment
    rig.ref.tell(Rescan())
    record = rig.logged()
    assert (record.qid, record.event) == (NO_QID, "answer_rejected")
    assert record.detail == {"reason": reason, "file": name}
    assert not (rig.dir / name).exists()
    rig.router.assert_nothing()  # a bad name never reaches the router


def test_a_temporary_name_renamed_in_time_is_never_rejected(tmp_path: Path) -> None:  # C10, W21
    clock = FakeClock()
    rig = start(tmp_path, poll_ms=500, clock=clock, reoffer_s=1)
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
    rig.logger.assert_nothing()


def test_a_bad_name_gone_and_back_gets_a_fresh_grace(tmp_path: Path) -> None:  # C10
    clock = FakeClock()
    rig = start(tmp_path, poll_ms=100, clock=clock)  # grace 1000 ms
    rig.sync()
    (rig.dir / "notes.txt").write_bytes(b"x")
    rig.sync()  # first seen: its grace runs
    (rig.dir / "notes.txt").unlink()  # (inotify is not asked to tell of removals)
    rig.ref.tell(FilesChanged(("notes.txt",)))  # a late event for it: looked at, gone, forgotten
    rig.sync()
    clock.now += 5
    (rig.dir / "notes.txt").write_bytes(b"x")
    rig.ref.tell(Rescan())
    rig.sync()
    assert (rig.dir / "notes.txt").exists()  # a new sighting: a new grace
    rig.logger.assert_nothing()


def test_invalid_json_stays_for_the_grace_then_goes_and_only_then_is_noted(
    tmp_path: Path,
) -> None:  # C10, X7
    clock = FakeClock()
    rig = start(tmp_path, poll_ms=100, clock=clock)  # grace 1000 ms
    rig.sync()
    signature = write(rig.dir / NAME, b'{"qid": "01')
    rig.seen(b'{"qid": "01')
    rig.ref.tell(RejectAnswerFile(NAME, signature, Rejected("invalid_json", QID)))
    clock.now += 0.9995
    rig.ref.tell(Rescan())  # held: this version is not sent again within its grace
    rig.ref.tell(RejectAnswerFile(NAME, signature, Rejected("invalid_json", QID)))
    rig.sync()
    rig.router.assert_nothing()
    assert (rig.dir / NAME).exists()
    rig.logger.assert_nothing()
    rig.delivery.assert_nothing()  # perhaps half written: the human is not told yet
    clock.now += 0.0005  # the grace, from the first sighting, is over
    rig.ref.tell(Rescan())  # so it is due: sent again for a fresh verdict
    assert rig.seen() == AnswerFileSeen(NAME, b'{"qid": "01', signature)
    clock.now += 0.02
    rig.ref.tell(RejectAnswerFile(NAME, signature, Rejected("invalid_json", QID)))
    record = rig.logged()
    assert (record.qid, record.event) == (QID, "answer_rejected")
    assert record.detail == {"reason": "invalid_json", "file": NAME}
    assert not (rig.dir / NAME).exists()
    assert rig.delivery.next() == note("invalid_json")


@pytest.mark.parametrize(
    "gone", ["rejected by it", "removed by another", "taken by another", "seen gone"])
def test_a_file_gone_is_forgotten_and_a_new_one_by_its_name_gets_a_fresh_grace(
    tmp_path: Path, gone: str
) -> None:  # C10; C9, X6: a verdict on a file that is gone does nothing
    clock = FakeClock()
    # no beat during the test (its complete rescan would forget the name too); grace 120 s
    rig = start(tmp_path, clock=clock)
    rig.sync()
    old = write(rig.dir / NAME, b"{")
    rig.seen(b"{")
    rig.sync()  # every event of that write handled: the watcher still knows the name
    clock.now += 121  # past the grace of its first sighting
    if gone == "rejected by it":
        rig.ref.tell(RejectAnswerFile(NAME, old, Rejected("invalid_json", QID)))
        assert rig.logged().detail == {"reason": "invalid_json", "file": NAME}
    else:
        os.remove(rig.dir / NAME)  # meanwhile, by someone else (a sibling bridge, say)
        if gone == "removed by another":
            for verdict in (Rejected("invalid_json", QID), Rejected("foreign_qid", QID)):
                rig.ref.tell(RejectAnswerFile(NAME, old, verdict))
        elif gone == "seen gone":  # an event for a name whose file is gone by then
            rig.ref.tell(FilesChanged((NAME,)))
        else:
            rig.ref.tell(DisposeAnswerFile(NAME, old))
        rig.sync()
        rig.logger.assert_nothing()
        rig.delivery.assert_nothing()
    new = write(rig.dir / NAME, b"[")
    rig.seen(b"[")
    rig.ref.tell(RejectAnswerFile(NAME, new, Rejected("invalid_json", QID)))
    rig.sync()
    assert (rig.dir / NAME).exists()  # half written, for all we know: its grace runs
    rig.logger.assert_nothing()


def test_a_verdict_on_an_older_version_re_examines_the_file(tmp_path: Path) -> None:  # C9
    rig = start(tmp_path)
    rig.sync()
    old = write(rig.dir / NAME, b"{}")
    rig.seen(b"{}")
    new = write(rig.dir / NAME, ANSWER)
    rig.ref.tell(RejectAnswerFile(NAME, old, Rejected("invalid_schema", QID)))
    assert rig.seen(ANSWER).signature == new
    rig.sync()
    assert (rig.dir / NAME).read_bytes() == ANSWER
    rig.logger.assert_nothing()
    rig.delivery.assert_nothing()


# -- removal after an accepted answer (C2) --------------------------------------


def test_remove_answer_file_removes_only_the_version_that_was_read(tmp_path: Path) -> None:  # C2
    rig = start(tmp_path)
    rig.sync()
    first = write(rig.dir / NAME, ANSWER)
    rig.seen(ANSWER)
    newer = ANSWER.replace(b'"yes"', b'"no, wait"')
    second = write(rig.dir / NAME, newer)
    assert first != second
    rig.ref.tell(DisposeAnswerFile(NAME, first))
    rig.sync()
    assert (rig.dir / NAME).read_bytes() == newer
    rig.ref.tell(DisposeAnswerFile(NAME, second))
    rig.sync()
    assert not (rig.dir / NAME).exists()
    rig.ref.tell(DisposeAnswerFile(NAME, second))  # gone already: nothing to do
    rig.sync()
    rig.logger.assert_nothing()


def test_only_the_judged_version_is_ever_removed(tmp_path: Path) -> None:  # C9, C2
    # A newer answer renamed over a judged one between the look and the removal (the
    # long property run hit it): the newer one stays, and is judged on its own.
    rig = start(tmp_path)
    rig.sync()
    old = write(rig.dir / NAME, b"{}")
    rig.seen(b"{}")
    new = write(rig.dir / NAME, ANSWER)  # arrives after the verdict's own look
    actor = rig.actor  # white-box: the window
    assert actor._remove(NAME, old) is False
    assert (rig.dir / NAME).read_bytes() == ANSWER
    assert sorted(p.name for p in rig.dir.iterdir()) == [NAME]
    assert rig.seen(ANSWER).signature == new  # and it is looked at
    assert actor._remove(NAME, new) is True and not (rig.dir / NAME).exists()


@pytest.fixture
def refused_unlinks(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """While its one item is True the watcher cannot remove a file (an immutable file,
    say): set it False to let removals through again."""
    refused = [True]
    real = os.unlink

    def unlink(path: str) -> None:
        if refused[0]:
            raise PermissionError(errno.EPERM, "Operation not permitted")
        real(path)

    monkeypatch.setattr(os, "unlink", unlink)
    return refused


def test_a_file_another_bridge_removes_first_is_not_logged_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # C9, X6: the remover alone logs a rejection, even when it wins by a hair
    rig = start(tmp_path)
    rig.sync()
    signature = write(rig.dir / NAME, ANSWER)
    rig.seen(ANSWER)
    real = os.unlink

    def taken_first(path: str) -> None:
        real(path)  # the sibling's removal lands between our look and our own
        real(path)

    monkeypatch.setattr(os, "unlink", taken_first)
    rig.ref.tell(RejectAnswerFile(NAME, signature, Rejected("foreign_qid", QID)))
    rig.sync()
    rig.logger.assert_nothing()
    rig.delivery.assert_nothing()


def test_a_judged_version_that_cannot_go_is_never_offered_again_until_a_restart(
    tmp_path: Path, refused_unlinks: list[bool], capsys: pytest.CaptureFixture[str]
) -> None:  # C2, C15: a version is judged once, so a late file gets one note
    clock = FakeClock()
    rig = start(tmp_path, clock=clock, reoffer_s=30)
    rig.sync()
    signature = write(rig.dir / NAME, ANSWER)
    rig.seen(ANSWER)
    rig.ref.tell(DisposeAnswerFile(NAME, signature))
    rig.sync()
    assert (rig.dir / NAME).exists()
    assert f"watcher: cannot remove {NAME}: [Errno 1] Operation not permitted" in capsys.readouterr().err
    clock.now += 30  # due: a file handed on and not judged would be offered again now
    rig.ref.tell(Rescan())
    rig.sync()
    rig.router.assert_nothing()  # judged once: never offered again
    refused_unlinks[0] = False
    other = write(rig.dir / OTHER, ANSWER)
    rig.seen(ANSWER)
    rig.ref.tell(DisposeAnswerFile(OTHER, other))
    rig.sync()
    assert capsys.readouterr().err == (
        f"coms-hermes-bridge: watcher: removing files from {rig.dir} works again (1 failed attempt(s))\n"
    )
    rig.ref.stop()
    again = start(tmp_path)  # a restart is a start: what is there is looked at afresh
    assert again.seen() == AnswerFileSeen(NAME, ANSWER, signature)
    rig.logger.assert_nothing()


@pytest.mark.parametrize("second", [errno.EPERM, errno.EROFS])
def test_files_that_cannot_go_are_said_once_per_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    second: int,
) -> None:  # bounded logs: a read-only directory of many answers is one line, not one each;
    # but each new reason is news to the operator
    causes = [errno.EPERM, second]

    def unlink(path: str) -> None:
        code = causes.pop(0)
        raise OSError(code, os.strerror(code))

    rig = start(tmp_path, reoffer_s=3600)
    rig.sync()
    other = f"{QID[:-1]}A.answer.json"
    signatures = {name: write(rig.dir / name, ANSWER) for name in (NAME, other)}
    for _ in signatures:
        rig.seen(ANSWER)
    monkeypatch.setattr(os, "unlink", unlink)
    for name, signature in signatures.items():
        rig.ref.tell(DisposeAnswerFile(name, signature))
    rig.sync()
    lines = f"coms-hermes-bridge: watcher: cannot remove {NAME}: [Errno 1] Operation not permitted\n"
    if second == errno.EROFS:
        lines += f"coms-hermes-bridge: watcher: cannot remove {other}: [Errno 30] Read-only file system\n"
    assert capsys.readouterr().err == lines
    assert causes == []  # both were tried


def test_a_new_version_over_a_judged_one_that_could_not_go_is_offered(
    tmp_path: Path, refused_unlinks: list[bool]
) -> None:  # C2: the human's second answer is never held back by the first one's fate
    rig = start(tmp_path, reoffer_s=3600)
    rig.sync()
    signature = write(rig.dir / NAME, ANSWER)
    rig.seen(ANSWER)
    rig.ref.tell(DisposeAnswerFile(NAME, signature))
    rig.sync()
    newer = ANSWER.replace(b'"yes"', b'"no"')
    newer_signature = write(rig.dir / NAME, newer)
    assert rig.seen(newer).signature == newer_signature


def test_a_rejected_file_that_cannot_go_is_neither_logged_nor_noted(
    tmp_path: Path, refused_unlinks: list[bool], capsys: pytest.CaptureFixture[str]
) -> None:  # C9, X6, X7: the remover alone logs (and notes) a rejection; here none removed it
    rig = start(tmp_path)
    rig.sync()
    signature = write(rig.dir / NAME, b"{}")
    rig.seen(b"{}")
    rig.ref.tell(RejectAnswerFile(NAME, signature, Rejected("invalid_schema", QID)))
    rig.sync()
    assert (rig.dir / NAME).exists()
    assert capsys.readouterr().err == (
        f"coms-hermes-bridge: watcher: cannot remove {NAME}: [Errno 1] Operation not permitted\n")
    rig.logger.assert_nothing()
    rig.delivery.assert_nothing()


# -- the directory: private, and it heals (C7) ------------------------------------


def test_start_makes_the_directory_0700_whatever_the_umask(tmp_path: Path) -> None:  # C7
    old = os.umask(0)
    try:
        rig = start(tmp_path)
        rig.sync()
    finally:
        os.umask(old)
    assert rig.dir.is_dir() and mode(rig.dir) == 0o700


def test_start_tightens_a_looser_directory_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "questions"
    directory.mkdir()
    directory.chmod(0o777)
    rig = start(tmp_path)
    rig.sync()
    assert mode(directory) == 0o700
    assert f"{directory} was mode 0777; tightened to 0700" in capsys.readouterr().err


def test_a_directory_that_cannot_be_made_at_start_fails_the_start(tmp_path: Path) -> None:
    (tmp_path / "questions").write_bytes(b"in the way")  # a setup fault: supervision decides
    rig = start(tmp_path)
    failed = rig.supervisor.next()
    assert (failed.child, failed.error) == (
        "watcher", f"NotADirectoryError: {rig.dir} is not a directory")


def test_a_deleted_or_replaced_directory_is_made_again_and_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # C7: kept in being and watched all along, without a restart; one line a heal
    rig = start(tmp_path)
    rig.sync()
    capsys.readouterr()
    healed = (f"coms-hermes-bridge: watcher: {rig.dir} was deleted, moved or no longer "
              "watched; watching it anew (0700)\n")
    for _ in range(3):
        write(rig.dir / "leftover.tmp", b"x")
        shutil.rmtree(rig.dir)  # as an operator's rm -r would
        wait_for(lambda: rig.dir.is_dir() and mode(rig.dir) == 0o700, what="directory back")
        rig.sync()
        assert capsys.readouterr().err == healed
    fresh = tmp_path / "fresh"
    fresh.mkdir(mode=0o700)
    os.rename(fresh, rig.dir)  # replaced by another (empty) directory
    wait_for(lambda: capsys.readouterr().err == healed, what="the replaced line")
    rig.sync()
    signature = write(rig.dir / NAME, ANSWER)  # only inotify can bring it: no rescan beat
    assert rig.seen(ANSWER) == AnswerFileSeen(NAME, ANSWER, signature)
    rig.supervisor.assert_nothing()  # never failed, so never restarted


def test_a_file_written_while_the_watch_is_remade_is_found(tmp_path: Path) -> None:
    rig = start(tmp_path)
    rig.sync()
    shutil.rmtree(rig.dir)
    # Someone makes it again first and writes at once: before the new watch
    # exists or after it, the file must be found either way.
    rig.dir.mkdir(mode=0o755, exist_ok=True)
    signature = write(rig.dir / NAME, ANSWER)
    assert rig.seen(ANSWER) == AnswerFileSeen(NAME, ANSWER, signature)
    wait_for(lambda: mode(rig.dir) == 0o700, what="the directory tightened")
    rig.supervisor.assert_nothing()


def watched_inodes(rig: Rig) -> list[int]:
    """The inodes the watcher's inotify instance watches, as the kernel lists them."""
    inotify = rig.actor._inotify
    assert inotify is not None
    info = Path(f"/proc/self/fdinfo/{inotify.fileno()}").read_text()
    return [int(line.split(" ino:")[1].split()[0], 16)
            for line in info.splitlines() if line.startswith("inotify wd:")]


def test_a_directory_moved_away_is_replaced_and_the_old_one_forgotten(tmp_path: Path) -> None:  # C7
    rig = start(tmp_path)
    rig.sync()
    moved = tmp_path / "moved"
    os.rename(rig.dir, moved)
    wait_for(rig.dir.is_dir, what="a new directory")
    rig.sync()
    write(moved / NAME, ANSWER)  # no longer the questions directory
    write(rig.dir / OTHER, ANSWER)
    assert rig.seen(ANSWER).name == OTHER
    rig.sync()
    while not rig.router.inbox.empty():  # a sighting mid-write, if any, is of OTHER too
        assert rig.router.next().name == OTHER
    assert (moved / NAME).exists()
    assert watched_inodes(rig) == [os.stat(rig.dir).st_ino]  # the old one is not watched


def test_a_watch_the_kernel_ended_is_made_again_and_what_changed_is_looked_at(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # the same directory, no longer watched (IN_IGNORED): watched again at once
    rig = start(tmp_path)
    rig.sync()
    write(rig.dir / NAME, ANSWER)
    rig.seen(ANSWER)
    rig.sync()  # every event of that write handled: only a rescan looks at it again
    changed = untold_change(rig.dir / NAME)
    actor = rig.actor
    assert actor._inotify is not None and actor._wd is not None
    actor._inotify.rm_watch(actor._wd)  # white-box: as the kernel ends a watch
    # looked at again: the version changed while nothing watched
    assert rig.seen() == AnswerFileSeen(NAME, ANSWER, changed)
    rig.sync()
    assert capsys.readouterr().err == (f"coms-hermes-bridge: watcher: {rig.dir} was deleted, "
                                       "moved or no longer watched; watching it anew (0700)\n")
    signature = write(rig.dir / OTHER, ANSWER)  # only a new watch brings it: no beat
    assert rig.seen(ANSWER) == AnswerFileSeen(OTHER, ANSWER, signature)
    rig.supervisor.assert_nothing()


def test_a_directory_that_cannot_be_made_is_retried_not_crashed_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # while running, a fault of the directory is said once and retried at each beat;
    # what someone else put in its place is theirs: never chmodded, never listed
    rig = start(tmp_path)
    rig.sync()
    real_mkdir = os.mkdir
    swapped: list[str] = []

    def mkdir_then_swapped(path: Any, mode: int = 0o777, **kwargs: Any) -> None:
        real_mkdir(path, mode, **kwargs)
        if not swapped and str(path) == str(rig.dir):  # a writer racing the watcher
            swapped.append(str(path))
            os.rmdir(path)
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))

    monkeypatch.setattr(os, "mkdir", mkdir_then_swapped)
    shutil.rmtree(rig.dir)  # the watcher makes it again at once: a file is there by then
    assert said(capsys, "the report") == (
        f"coms-hermes-bridge: watcher: cannot make or watch {rig.dir}: {rig.dir} is not a "
        f"directory; retrying every {SLOW_POLL_MS:g}ms\n")
    for _ in range(3):
        rig.ref.tell(Rescan())  # beats: each tries to make it again, and fails
    rig.sync()
    assert capsys.readouterr().err == ""  # said once; no directory, so nothing to list
    assert swapped == [str(rig.dir)] and rig.dir.is_file()
    assert mode(rig.dir) == 0o644  # someone else's file: left as it is
    rig.dir.unlink()
    rig.ref.tell(Rescan())  # the next beat makes it
    rig.sync()
    assert rig.dir.is_dir() and mode(rig.dir) == 0o700
    assert capsys.readouterr().err == f"coms-hermes-bridge: watcher: watching {rig.dir} again\n"
    write(rig.dir / NAME, ANSWER)  # only the new watch brings it
    rig.seen(ANSWER)
    rig.supervisor.assert_nothing()


def test_a_directory_that_cannot_be_watched_is_still_polled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # no inotify watches left: each rescan beat still finds the answers
    refuse = threading.Event()

    class FullINotify(INotify):  # type: ignore[misc]
        def add_watch(self, path: str, mask: int) -> int:
            if refuse.is_set():
                raise OSError(errno.ENOSPC, "No space left on device")
            return int(super().add_watch(path, mask))

    monkeypatch.setattr(hermes, "INotify", FullINotify)
    rig = start(tmp_path)
    rig.sync()
    refuse.set()
    shutil.rmtree(rig.dir)
    assert said(capsys, "the report") == (
        f"coms-hermes-bridge: watcher: cannot make or watch {rig.dir}: [Errno 28] No space "
        f"left on device; retrying every {SLOW_POLL_MS:g}ms\n")
    assert rig.dir.is_dir()  # made, though not watched
    signature = write(rig.dir / NAME, ANSWER)
    rig.ref.tell(Rescan())  # a beat
    assert rig.seen(ANSWER) == AnswerFileSeen(NAME, ANSWER, signature)


def test_a_watch_that_cannot_be_made_again_is_retried_and_each_new_cause_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # the same directory, its watch ended and not to be had: polled, retried, said
    refusal: list[OSError] = []

    class RefusingINotify(INotify):  # type: ignore[misc]
        def add_watch(self, path: str, mask: int) -> int:
            if refusal:
                raise refusal[0]
            return int(super().add_watch(path, mask))

    monkeypatch.setattr(hermes, "INotify", RefusingINotify)
    rig = start(tmp_path, poll_ms=1_234_567.5)  # (never a beat here either)
    rig.sync()
    refusal.append(OSError(errno.ENOSPC, "No space left on device"))
    actor = rig.actor
    assert actor._inotify is not None and actor._wd is not None
    actor._inotify.rm_watch(actor._wd)  # as the kernel ends it
    wait_for(lambda: "No space left on device" in capsys.readouterr().err, what="the first cause")
    rig.ref.tell(Rescan())
    rig.sync()
    assert capsys.readouterr().err == ""  # the same cause: said once
    refusal[0] = OSError(errno.EMFILE, "Too many open files")
    rig.ref.tell(Rescan())
    rig.sync()
    assert capsys.readouterr().err == (
        f"coms-hermes-bridge: watcher: cannot make or watch {rig.dir}: [Errno 24] Too many open "
        "files; retrying every 1234567.5ms\n")  # a new cause is said too; X17: not 1.23457e+06
    refusal.clear()
    rig.ref.tell(Rescan())
    rig.sync()
    assert capsys.readouterr().err == f"coms-hermes-bridge: watcher: watching {rig.dir} again\n"
    signature = write(rig.dir / NAME, ANSWER)  # only the new watch brings it: no beat
    assert rig.seen(ANSWER) == AnswerFileSeen(NAME, ANSWER, signature)


def test_a_directory_that_cannot_be_listed_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # never a silent drop: a rescan that sees nothing says why
    rig = start(tmp_path)
    rig.sync()
    capsys.readouterr()

    def refused(path: Any) -> Any:
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(os, "scandir", refused)
    rig.ref.tell(Rescan())
    rig.sync()
    assert capsys.readouterr().err == (
        f"coms-hermes-bridge: watcher: cannot list {rig.dir}: "
        f"[Errno 13] Permission denied: '{rig.dir}'\n"
    )


# -- the watch itself: inotify lost, events that cost no rescan ------------------


def test_a_failed_inotify_read_is_said_and_the_next_rescan_listens_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # a broken read is not retried in a busy loop; the beat finds what came meanwhile
    broken = threading.Event()

    class BrokenINotify(INotify):  # type: ignore[misc]
        def read(self, timeout: int | None = None, read_delay: int | None = None) -> list[Any]:
            if broken.is_set():
                raise OSError(errno.EIO, "Input/output error")
            return list(super().read(timeout=timeout, read_delay=read_delay))

    monkeypatch.setattr(hermes, "INotify", BrokenINotify)
    rig = start(tmp_path)
    rig.sync()
    capsys.readouterr()
    broken.set()
    signature = write(rig.dir / NAME, ANSWER)  # an event, so that inotify is read
    assert "OSError(5, 'Input/output error')" in said(capsys, "the fault")
    rig.sync()
    rig.router.assert_nothing()
    broken.clear()
    rig.ref.tell(Rescan())  # a beat: it is listed, and the watcher listens again
    assert rig.seen(ANSWER) == AnswerFileSeen(NAME, ANSWER, signature)
    other = write(rig.dir / OTHER, ANSWER)  # only inotify can bring it: no rescan beat
    assert rig.seen(ANSWER, version=other).name == OTHER
    rig.supervisor.assert_nothing()


def test_the_rescan_beat_is_due_poll_ms_after_a_rescan(tmp_path: Path) -> None:  # C10
    # a day's beat: a slip of one part in a thousand is a minute and a half
    rig = start(tmp_path, poll_ms=86_400_000)
    rig.sync()
    beat = rig.actor._beat  # white-box: the timer armed by the start's rescan
    assert beat is not None and not beat.cancelled()
    assert abs(beat.when() - shared_edge().loop.time() - 86_400) < 5.0


def test_reading_inotify_on_the_loop_never_waits(tmp_path: Path) -> None:
    # the loop runs every actor's turns: a read with nothing to read returns at once, and
    # tells nothing
    me = FakeRef("watcher")
    with INotify() as inotify:
        inotify.add_watch(str(tmp_path), inotify_simple.flags.CREATE)
        reader = threading.Thread(target=WatcherActor._events, args=(inotify, me), daemon=True)
        reader.start()
        reader.join(timeout=5)
        waited = reader.is_alive()
        (tmp_path / "wake").touch()  # frees a reader that waits, so the test ends
        reader.join(timeout=5)
    assert not waited
    assert me.inbox.empty()


def test_file_events_cost_no_rescan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # only the end of the watch, lost events, or the beat cost a look at every file
    rescans: list[bool] = []
    real_rescan = WatcherActor._rescan

    def rescan(self: WatcherActor) -> None:
        rescans.append(True)
        real_rescan(self)

    monkeypatch.setattr(WatcherActor, "_rescan", rescan)
    rig = start(tmp_path)
    rig.sync()
    assert rescans == [True]  # the start's
    for n in range(5):
        write(rig.dir / f"01HZY3K4M5N6P7Q8R9S0T1V2W{n}.answer.json", ANSWER)
        rig.seen(ANSWER)
    rig.sync()
    assert rescans == [True]


# -- bounds: reads, names remembered, names looked at ------------------------------


def test_reads_stop_past_the_limit() -> None:  # a file that grows while read
    for size, expected in [(0, b""), (10, b"x" * 10), (100, b"x" * 100), (101, None)]:
        read_end, write_end = os.pipe()
        os.write(write_end, b"x" * size)
        os.close(write_end)
        try:
            assert read_at_most(read_end, 100) == expected
        finally:
            os.close(read_end)


def test_reads_in_pieces_are_joined_and_never_ask_past_one_byte_over_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # bounded: a file read a few bytes at a time is whole, or refused past the limit
    asked: list[tuple[int, int]] = []  # (bytes had, bytes asked for)
    real_read = os.read
    had = [0]

    def read_in_pieces(fd: int, n: int) -> bytes:
        asked.append((had[0], n))
        chunk = real_read(fd, min(n, 3))
        had[0] += len(chunk)
        return chunk

    monkeypatch.setattr(os, "read", read_in_pieces)
    for size, limit, expected in [(10, 10, b"0123456789"), (10, 9, None)]:
        asked.clear()
        had[0] = 0
        read_end, write_end = os.pipe()
        os.write(write_end, b"0123456789"[:size])
        os.close(write_end)
        try:
            assert read_at_most(read_end, limit) == expected
        finally:
            os.close(read_end)
        assert all(got + n == limit + 1 for got, n in asked)


def test_the_memory_of_names_is_bounded_and_a_name_forgotten_is_still_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # bounded: TRACK_LIMIT names remembered, the oldest forgotten; a file whose
    # name was forgotten is never left behind when judged, nor fatal
    monkeypatch.setattr(hermes, "TRACK_LIMIT", 2)
    rig = start(tmp_path)
    rig.sync()
    names = [f"01HZY3K4M5N6P7Q8R9S0T1V2W{n}.answer.json" for n in range(3)]
    signatures = []
    for name in names:
        signatures.append(write(rig.dir / name, ANSWER))
        rig.seen(ANSWER)
        rig.sync()
    assert list(rig.actor._tracked) == names[1:]
    rig.ref.tell(DisposeAnswerFile(names[0], signatures[0]))
    rig.sync()
    assert not (rig.dir / names[0]).exists()
    rig.supervisor.assert_nothing()


def test_a_rescan_cut_at_its_limit_says_so_once_and_forgets_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # bounded: a rescan looks at SCAN_LIMIT entries at most
    monkeypatch.setattr(hermes, "SCAN_LIMIT", 3)
    (tmp_path / "questions").mkdir(mode=0o700)
    names = [f"01HZY3K4M5N6P7Q8R9S0T1V2W{n}.answer.json" for n in range(4)]
    for name in names:
        write(tmp_path / "questions" / name, ANSWER)
    rig = start(tmp_path)
    seen = {rig.seen().name for _ in range(3)}
    rig.sync()
    rig.router.assert_nothing()  # the fourth is not looked at (inotify brings new ones)
    assert seen < set(names)
    line = (f"coms-hermes-bridge: watcher: {rig.dir} holds more than 3 entries; "
            "each rescan looks at 3 of them\n")
    assert capsys.readouterr().err == line
    rig.ref.tell(Rescan())
    rig.sync()
    assert capsys.readouterr().err == ""  # said once per episode
    assert set(rig.actor._tracked) >= seen  # a cut listing forgets none of what it missed
    gone = sorted(seen)[0]
    (tmp_path / "questions" / gone).unlink()
    rig.ref.tell(Rescan())  # exactly the limit: a complete listing, which forgets the gone
    [missed] = set(names) - seen
    assert rig.seen().name == missed
    rig.sync()
    assert set(rig.actor._tracked) == seen - {gone} | {missed}
    assert capsys.readouterr().err == ""


def test_a_rescan_lists_one_entry_past_its_limit_and_no_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # bounded: a huge directory costs a rescan SCAN_LIMIT entries, plus the one that
    # tells the listing is cut
    monkeypatch.setattr(hermes, "SCAN_LIMIT", 3)
    for n in range(8):  # directories: left alone, so nothing but the listing is counted
        (tmp_path / "questions" / f"d{n}").mkdir(parents=True)
    listed: list[str] = []
    real = os.scandir

    def each(entries: Iterator[os.DirEntry[str]]) -> Iterator[os.DirEntry[str]]:
        for entry in entries:
            listed.append(entry.name)
            yield entry

    @contextlib.contextmanager
    def counted(path: Any) -> Iterator[Iterator[os.DirEntry[str]]]:
        with real(path) as entries:
            yield each(entries)

    monkeypatch.setattr(os, "scandir", counted)
    rig = start(tmp_path)
    rig.sync()
    assert len(listed) == 4
    rig.supervisor.assert_nothing()


def test_a_rescan_goes_on_past_a_file_handed_on_and_not_due(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # a file not handed on yet, after one that was, is still looked at
    real_open = os.open
    refused = [True]

    def refusing(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if refused[0] and str(path).endswith(OTHER):
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing)
    rig = start(tmp_path)
    rig.sync()
    write(rig.dir / NAME, ANSWER)
    rig.seen(ANSWER)
    signature = write(rig.dir / OTHER, ANSWER)  # its sighting cannot read it: not handed on
    rig.sync()
    rig.router.assert_nothing()
    refused[0] = False
    rig.ref.tell(Rescan())
    assert rig.seen() == AnswerFileSeen(OTHER, ANSWER, signature)


# -- several bridges, one directory (X6) ----------------------------------------


def test_a_siblings_file_is_left_alone_and_judged_again_when_due(tmp_path: Path) -> None:  # X6
    # the Router tells nothing back for a sibling's file: handed on, it rests until due
    clock = FakeClock()
    rig = start(tmp_path, clock=clock)
    rig.sync()
    signature = write(rig.dir / NAME, ANSWER)
    rig.seen(ANSWER)
    rig.sync()
    clock.now += DEFAULT_REOFFER_S - 0.1
    rig.ref.tell(Rescan())
    rig.sync()
    assert (rig.dir / NAME).exists()  # however long: its owner may be down
    rig.router.assert_nothing()  # held, so not handed on again meanwhile
    rig.logger.assert_nothing()
    clock.now += 0.1
    rig.ref.tell(Rescan())  # due: judged afresh (the sibling may have forgotten it by now)
    assert rig.seen() == AnswerFileSeen(NAME, ANSWER, signature)
    rig.sync()
    clock.now += 1000 * DEFAULT_REOFFER_S
    rig.ref.tell(Rescan())
    assert rig.seen() == AnswerFileSeen(NAME, ANSWER, signature)
    assert (rig.dir / NAME).exists()
    rig.sync()
    write(rig.dir / NAME, b"{}")  # a new version of a held file is looked at at once
    rig.seen(b"{}")
    rig.sync()
    rig.logger.assert_nothing()


def test_a_siblings_file_its_owner_takes_is_forgotten(tmp_path: Path) -> None:  # X6
    clock = FakeClock()
    rig = start(tmp_path, clock=clock)
    rig.sync()
    write(rig.dir / NAME, ANSWER)
    rig.seen(ANSWER)
    (rig.dir / NAME).unlink()  # the other bridge answered its question with it
    clock.now += DEFAULT_REOFFER_S + 1
    rig.ref.tell(Rescan())
    rig.sync()
    rig.logger.assert_nothing()
    rig.router.assert_nothing()


def test_two_watchers_on_one_directory_log_a_foreign_file_once(tmp_path: Path) -> None:  # X6
    a = start(tmp_path)
    b = start(tmp_path)
    for rig in (a, b):
        rig.sync()
    signature = write(a.dir / NAME, ANSWER)
    a.seen(ANSWER)
    b.seen(ANSWER)
    for rig in (a, b):
        rig.ref.tell(RejectAnswerFile(NAME, signature, Rejected("foreign_qid", QID)))
        rig.sync()
    assert not (a.dir / NAME).exists()
    assert a.logged().detail == {"reason": "foreign_qid", "file": NAME}
    b.logger.assert_nothing()


# -- telling the human (X7) -------------------------------------------------------


@pytest.mark.parametrize("reason", ["invalid_schema", "qid_mismatch"])
def test_an_unreadable_answer_for_an_open_question_is_noted_once_a_minute(
    tmp_path: Path, reason: RejectReason
) -> None:  # X7
    clock = FakeClock()
    rig = start(tmp_path, clock=clock)
    rig.sync()
    for step in (0.0, 59.9, 0.1):
        clock.now += step
        signature = write(rig.dir / NAME, b"{}")
        rig.seen(b"{}")
        rig.ref.tell(RejectAnswerFile(NAME, signature, Rejected(reason, QID)))
        assert rig.logged().detail == {"reason": reason, "file": NAME}
        if step != 59.9:
            assert rig.delivery.next() == note(reason)
        else:
            rig.sync()  # the turn that logged it is over
            rig.delivery.assert_nothing()  # the second refusal within the minute: no second note


def test_the_note_memory_is_bounded(tmp_path: Path) -> None:  # X7: bounded memory
    clock = FakeClock()
    rig = start(tmp_path)  # for its collaborators: the Delivery told is `rig.delivery`
    # never started: the method alone, in this thread
    watcher = WatcherActor(**rig.collaborators(WatcherActor), supervisor=rig.supervisor,
                           clock=clock)
    qids = [f"01HZY3K4M5N6P7Q8R9S{i:07d}" for i in range(hermes.NOTE_MEMORY + 5)]
    for qid in qids:
        watcher._note_unreadable(qid, "invalid_schema")
    assert len(watcher._noted) == hermes.NOTE_MEMORY
    assert rig.delivery.inbox.qsize() == len(qids)
    watcher._note_unreadable(qids[-1], "invalid_schema")  # remembered: not noted again
    assert rig.delivery.inbox.qsize() == len(qids)
    clock.now += hermes.NOTE_INTERVAL_S
    watcher._note_unreadable(qids[-1], "invalid_schema")  # a minute later it is
    assert rig.delivery.inbox.qsize() == len(qids) + 1
    assert len(watcher._noted) == 1  # the expired ones are dropped


# -- life cycle -----------------------------------------------------------------


def test_stop_is_quick_and_closes_inotify(tmp_path: Path) -> None:
    rig = start(tmp_path, poll_ms=100)
    rig.sync()
    fds = len(os.listdir("/proc/self/fd"))
    began = time.monotonic()
    rig.ref.stop(timeout=2)
    assert time.monotonic() - began < 0.5
    wait_for(lambda: len(os.listdir("/proc/self/fd")) < fds, what="inotify closed on the edge")


def test_inotify_that_cannot_be_made_fails_the_start_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # a setup fault: supervision decides; freeing the nothing it holds says nothing
    def exhausted() -> INotify:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(hermes, "INotify", exhausted)
    rig = start(tmp_path)
    failed = rig.supervisor.next()
    assert (failed.child, failed.error) == ("watcher", "OSError: [Errno 24] Too many open files")
    edge_caught_up()
    assert capsys.readouterr().err == ""


def test_freeing_an_inotify_already_closed_is_quiet() -> None:  # release() must not raise
    inotify = INotify()
    inotify.close()
    WatcherActor._unlisten(inotify)  # no ValueError for the closed descriptor


def test_an_unknown_message_fails_loudly(tmp_path: Path) -> None:
    rig = start(tmp_path)
    rig.ref.tell("hello")
    assert rig.supervisor.next().error == "UnknownMessage: watcher does not take str: 'hello'"


# -- integration: the real clock, real writers (C10, W21) -----------------------


class SimulatedRouter:
    """Plays the Router for content it cannot parse: invalid_json, as validate_answer would.
    `contents`: what it was handed, in order; `judged`: what it has told a verdict on."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.contents: list[bytes | None] = []
        self.judged: list[bytes | None] = []
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
                json.loads(message.content or b"")
            except ValueError:
                verdict = Rejected("invalid_json", QID)
                try:
                    self.rig.ref.tell(RejectAnswerFile(message.name, message.signature, verdict))
                except pykka.ActorDeadError:
                    return
                self.judged.append(message.content)

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

    inside = rig.dir / ".hermes-write.tmp"
    with inside.open("wb") as file:
        file.write(ANSWER[:10])
        file.flush()
        rig.sync()  # the watcher has seen the dot-name mid-write
        file.write(ANSWER[10:])
    os.rename(inside, rig.dir / OTHER)
    wait_for(lambda: router.contents.count(ANSWER) >= 2, what="the second renamed answer")
    assert (rig.dir / NAME).exists() and (rig.dir / OTHER).exists()
    assert all(c == ANSWER for c in router.contents)  # never a partial file
    assert no_rejections(rig)


def test_an_answer_written_in_two_steps_arrives_whole(
    live: tuple[Rig, SimulatedRouter]
) -> None:  # C10, W21
    rig, router = live
    path = rig.dir / NAME
    half = ANSWER[: len(ANSWER) // 2]
    with path.open("wb") as file:
        file.write(half)
    wait_for(lambda: half in router.judged, what="the first half judged")
    rig.sync()  # held: that version is in its grace when the gateway writes the rest
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
    wait_for(lambda: not path.exists(), timeout=3, what="the rejection")
    elapsed = time.monotonic() - began  # the grace window is 1 s here
    assert 1.0 <= elapsed < 2.5
    record = rig.logged()
    assert (record.qid, record.event) == (QID, "answer_rejected")
    assert record.detail == {"reason": "invalid_json", "file": NAME}
