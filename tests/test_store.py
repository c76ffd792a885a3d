"""The question store: no question is lost when the daemon dies.

Every open question and how recently closed ones ended must be read back
exactly by a new Store on the same file, as a restarted daemon would, and a
damaged file must never keep the daemon from starting.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from coms_hermes_bridge.actors import store as store_module
from coms_hermes_bridge.actors.state_view import (
    Snapshot,
    StateBusyError,
    knows_qid,
    read_snapshot,
    sibling_of,
    state_files,
)
from coms_hermes_bridge.actors.store import (
    CLOSED_MEMORY,
    SCHEMA_VERSION,
    UNDELIVERED_MEMORY,
    Store,
    UnusableStateError,
)
from coms_hermes_bridge.messages.commands import (
    FileSignature,
    QuestionSpec,
    SendResponse,
    SendText,
)
from coms_hermes_bridge.messages.wire import (
    TERMINAL_STATES,
    ParsedPrompt,
    PromptEnvelope,
    QuestionOption,
    State,
)
from tests.fakes import DISK_ERROR, FailingConnection

QID = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
QID2 = "01HZY3K4M5N6P7Q8R9S0T1V2W3"


def spec(qid: str = QID, state: State | None = None) -> QuestionSpec:
    # Non-ASCII text, outside the BMP too, must survive the file (lone surrogates never
    # reach it: they are refused on the wire, X12).
    return QuestionSpec(
        qid=qid,
        prompt=PromptEnvelope(
            msg_id=qid,
            sender_session="01J9Z8Y7X6W5V4T3S2R1Q0P9NM",
            sender_endpoint="/tmp/asker.sock",
            hops=1.5,
            timestamp="2026-11-30T12:00:00.000Z",
            prompt=json.dumps({"question": "Ship? ✓", "options": ["Approve", "Stop"]}),
            sender_name="builder é",
            conversation_id="c-1",
            response_schema={"type": "object", "required": ["x"]},
            reply_timeout_ms=90_000,
        ),
        parsed=ParsedPrompt(
            question="Ship? ✓",
            context="release 🚀 42",
            options=(
                QuestionOption(title="Approve", description="go"),
                QuestionOption(title="Stop"),
            ),
        ),
        timeout_ms=90_000.0,
        deadline=1_795_000_000.123456,
        state=state,
    )


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "bridge.sqlite"


@pytest.fixture
def store(path: Path) -> Iterator[Store]:
    s = Store.open(path)
    yield s
    s.shutdown()


def reopen(store: Store) -> tuple[list[QuestionSpec], list[tuple[str, State]]]:
    """Read the file back as a restarted daemon would."""
    store.shutdown()
    again = Store.open(store.path)
    try:
        return again.load()
    finally:
        again.shutdown()


def close_new(store: Store, qid: str, state: State | None, **options: Any) -> None:
    """A question opened and closed at once: for what a close leaves behind."""
    store.put_open(spec(qid), owner="q")
    assert store.close(qid, state, owner="q", **options)


def test_open_question_round_trips_through_the_file(store: Store) -> None:
    original = spec(state="delivered")
    store.put_open(original, owner="q")
    opened, closed = reopen(store)
    assert opened == [original]
    assert closed == []


def test_new_file_is_empty_and_parent_is_created(store: Store, path: Path) -> None:
    assert path.parent.is_dir()
    assert store.load() == ([], [])


def test_state_update_survives_restart(store: Store) -> None:
    store.put_open(spec(), owner="q")
    store.set_state(QID, "delivered", owner="q")
    opened, _ = reopen(store)
    assert [s.state for s in opened] == ["delivered"]


def test_state_update_of_unknown_qid_is_a_no_op(store: Store) -> None:
    store.set_state(QID, "delivered", owner="q")
    assert store.load() == ([], [])


def test_open_questions_load_in_insertion_order(store: Store) -> None:
    store.put_open(spec(QID2), owner="q")
    store.put_open(spec(QID), owner="q")
    store.put_open(spec(QID2, state="pending"), owner="q")  # a rewrite keeps its place
    opened, _ = reopen(store)
    assert [(s.qid, s.state) for s in opened] == [(QID2, "pending"), (QID, None)]


def test_a_qid_closed_again_and_a_note_owed_again_become_the_newest(store: Store) -> None:
    # a closed row or owed note written again replaces the old one: it is the newest now
    first, second = "01ARZ3NDEKTSV4RRFFQ69G5FAX", "01ARZ3NDEKTSV4RRFFQ69G5FAY"
    for qid in (first, second, first):
        store.put_open(spec(qid), owner="q")
        store.close(qid, "answered" if qid == second else "timeout", owner="q")
    for note_id in ("a", "b", "a"):
        store.owe_note(SendText(QID, f"note {note_id}", "late_note", note_id=note_id))
    assert read_snapshot(store.path).closed == ((first, "timeout"), (second, "answered"))
    assert [n.note_id for n in store.owed_notes()] == ["b", "a"]
    assert reopen(store)[1] == [(second, "answered"), (first, "timeout")]


@pytest.mark.parametrize("state", TERMINAL_STATES)
def test_close_to_a_terminal_state(store: Store, state: State) -> None:
    store.put_open(spec(), owner="q")
    store.close(QID, state, owner="q")
    assert reopen(store) == ([], [(QID, state)])


def test_close_after_delivery_failure_leaves_no_closed_row(store: Store) -> None:
    store.put_open(spec(), owner="q")
    store.close(QID, None, owner="q")
    assert reopen(store) == ([], [])


def test_closed_qids_keep_their_order_across_restarts(store: Store, path: Path) -> None:
    qids = [f"Q{i}" for i in range(5)]
    states: list[State] = ["answered", "timeout", "cancelled", "answered", "timeout"]
    for qid, state in zip(qids, states, strict=True):
        store.put_open(spec(qid), owner="q")
        store.close(qid, state, owner="q")
    store.shutdown()
    again = Store.open(path)
    close_new(again, "Q5", "cancelled")  # numbering continues after a restart
    _, closed = again.load()
    again.shutdown()
    assert closed == [*zip(qids, states, strict=True), ("Q5", "cancelled")]


def test_closed_memory_is_trimmed_to_the_newest(store: Store) -> None:
    total = CLOSED_MEMORY + 5
    for i in range(total):
        close_new(store, f"Q{i}", "answered")
    _, closed = reopen(store)
    assert len(closed) == CLOSED_MEMORY
    assert closed[0] == ("Q5", "answered")
    assert closed[-1] == (f"Q{total - 1}", "answered")


def test_closed_table_stays_bounded_at_every_close(store: Store) -> None:  # promise 4
    counts = []
    for i in range(CLOSED_MEMORY + 7):
        close_new(store, f"Q{i}", "answered")
        counts.append(rows(store, "closed_questions"))
    assert counts[CLOSED_MEMORY - 1 :] == [CLOSED_MEMORY] * 8


def rows(store: Store, table: str) -> int:
    with sqlite3.connect(store.path) as conn:
        return int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


def test_file_is_private(path: Path) -> None:
    # SQLite makes the -wal and -shm with the main file's mode, whatever the umask
    old = os.umask(0)
    try:
        store = Store.open(path)
        store.put_open(spec(), owner="q")  # a write, so the WAL sidecars exist
    finally:
        os.umask(old)
    try:
        for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            assert stat.S_IMODE(name.stat().st_mode) == 0o600, name
    finally:
        store.shutdown()


def test_sidecars_left_looser_are_tightened_at_open(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Store.open(path).shutdown()
    holder = sqlite3.connect(path)  # another writer, as a killed daemon leaves its sidecars
    with holder:
        holder.execute("INSERT INTO meta VALUES ('x', 'y')")
    sidecars = [Path(f"{path}-wal"), Path(f"{path}-shm")]
    for name in sidecars:
        name.chmod(0o644)
    try:
        Store.open(path).shutdown()
    finally:
        holder.close()
    assert capsys.readouterr().err == "".join(
        f"coms-hermes-bridge: {name} was mode 0644; tightened to 0600\n" for name in sidecars)


def test_wal_mode_is_on(store: Store, path: Path) -> None:
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        conn.close()


def refused(path: Path, why: str) -> None:
    """Store.open refuses the file at `path` in the one line the daemon says, and leaves
    it exactly as it was: whatever it holds stays for the operator (promise 1)."""
    kept = path.read_bytes() if stat.S_ISREG(os.lstat(path).st_mode) else None
    with pytest.raises(UnusableStateError) as raised:
        Store.open(path)
    assert str(raised.value) == (
        f"state file {path} {why}; stop the bridge and move {path} (and its -wal, -shm) aside"
        " to start afresh")
    assert kept is None or path.read_bytes() == kept
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_a_fifo_by_the_state_files_name_is_refused_not_waited_on(path: Path) -> None:
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    done: list[bool] = []
    opening = threading.Thread(target=lambda: done.append(refused(path, "is not a regular file")
                                                          is None), daemon=True)
    opening.start()
    opening.join(10.0)
    assert not opening.is_alive(), "Store.open waited on the FIFO"
    assert done == [True] and stat.S_ISFIFO(os.lstat(path).st_mode)


def test_unparseable_row_is_dropped_on_load(
    store: Store, path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store.put_open(spec(QID), owner="q")
    store.put_open(spec(QID2), owner="q")
    conn = sqlite3.connect(path)
    conn.execute("UPDATE open_questions SET prompt = '{not json' WHERE qid = ?", (QID,))
    conn.commit()
    conn.close()
    opened, _ = reopen(store)
    assert [s.qid for s in opened] == [QID2]
    assert f"dropped open question {QID!r}" in capsys.readouterr().err


def test_unwritable_directory_raises_oserror(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError, match="state database"):
        Store.open(blocker / "bridge.sqlite")


def test_shutdown_is_idempotent_and_later_writes_are_refused(store: Store) -> None:
    store.shutdown()
    store.shutdown()
    with pytest.raises(sqlite3.ProgrammingError):
        store.put_open(spec(), owner="q")


def test_writes_from_many_threads(store: Store) -> None:
    def work(n: int) -> None:
        for i in range(20):
            qid = f"T{n}-{i}"
            store.put_open(spec(qid), owner="q")
            store.set_state(qid, "delivered", owner="q")
            store.close(qid, "answered", owner="q")

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    opened, closed = reopen(store)
    assert opened == []
    assert len(closed) == 80


def test_writes_survive_a_killed_process(path: Path) -> None:
    # The daemon dies without shutdown(): what it committed must still be there.
    script = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from coms_hermes_bridge.actors.store import Store\n"
        "from tests.test_store import QID, QID2, spec\n"
        "store = Store.open(Path(sys.argv[1]))\n"
        "store.put_open(spec(QID, state='delivered'), owner='q')\n"
        "store.put_open(spec(QID2), owner='q')\n"
        "store.close(QID2, 'timeout', owner='q')\n"
        "os._exit(0)\n"
    )
    root = Path(__file__).resolve().parent.parent
    subprocess.run([sys.executable, "-c", script, str(path)], cwd=root, check=True, timeout=30)
    store = Store.open(path)
    try:
        assert store.load() == ([spec(QID, state="delivered")], [(QID2, "timeout")])
    finally:
        store.shutdown()


def test_owed_response_survives_until_sent(store: Store) -> None:
    # a response decided before a crash is resent after it, not lost
    owed = SendResponse(spec().prompt, {"kind": "freeform", "text": "yes \ud800"}, None, "q1")
    store.put_open(spec(), owner="q1")
    assert store.close(QID, "answered", owner="q1", response=owed)
    store.shutdown()
    again = Store.open(store.path)
    try:
        assert again.outbox() == [owed]
        again.settle(QID, "someone else")  # not that question's: stays owed
        assert again.outbox() == [owed]
        again.settle(QID, "q1")
        assert again.outbox() == []
    finally:
        again.shutdown()


def owe_many(store: Store, count: int) -> list[str]:
    """`count` answered questions whose responses are owed, one owner each."""
    owners = []
    for i in range(count):
        qid = f"01ARZ3NDEKTSV4RRFFQ69G5F{i:02d}"
        owner = f"q{i}"
        store.put_open(spec(qid), owner=owner)
        store.close(qid, "answered", owner=owner,
                    response=SendResponse(spec(qid).prompt, "yes", None, owner))
        owners.append(owner)
    return owners


def test_a_settle_is_committed_at_once(store: Store) -> None:
    owe_many(store, 1)
    store.settle("01ARZ3NDEKTSV4RRFFQ69G5F00", "q0")
    assert rows(store, "outbox") == 0


def test_a_settle_keyed_by_another_owner_leaves_the_response_owed(store: Store) -> None:
    owe_many(store, 1)
    store.settle("01ARZ3NDEKTSV4RRFFQ69G5F00", "q9")  # an older question's, same qid
    assert rows(store, "outbox") == 1


def test_a_settle_after_shutdown_is_refused_and_the_response_stays_owed(store: Store) -> None:
    owe_many(store, 1)
    store.shutdown()
    with pytest.raises(sqlite3.ProgrammingError):  # too late to be recorded: the Peer says it
        store.settle("01ARZ3NDEKTSV4RRFFQ69G5F00", "q0")
    assert rows(store, "outbox") == 1  # sent again at the next start


def test_a_settle_the_file_fails_under_raises_to_its_caller(store: Store) -> None:
    owe_many(store, 1)
    store._conn = FailingConnection(store._conn, commit=DISK_ERROR)  # type: ignore[arg-type]
    with pytest.raises(sqlite3.OperationalError, match="disk I/O error"):
        store.settle("01ARZ3NDEKTSV4RRFFQ69G5F00", "q0")  # the Peer says it; it stays owed
    assert rows(store, "outbox") == 1


def test_a_response_owed_without_an_owner_is_settled_without_one(store: Store) -> None:
    store.put_open(spec(), owner="q")
    store.close(QID, "answered", owner="q", response=SendResponse(spec().prompt, "yes", None, None))
    with sqlite3.connect(store.path) as conn:  # as an older version's close without one wrote it
        conn.execute("UPDATE outbox SET owner = ''")
    conn.close()
    assert [r.owner for r in store.outbox()] == [None]
    store.settle(QID)
    assert store.outbox() == []


class _FailingClose(sqlite3.Connection):
    """A connection whose close fails (a disk error as the WAL is checkpointed)."""

    def close(self) -> None:
        super().close()
        raise sqlite3.OperationalError("disk I/O error")


def test_a_close_that_fails_is_said_and_shutdown_finishes(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Store.open(path).shutdown()
    conn = sqlite3.connect(path, factory=_FailingClose, isolation_level=None,
                           check_same_thread=False)
    store = Store(path, conn)
    store.shutdown()
    assert capsys.readouterr().err == (
        f"coms-hermes-bridge: state database {path}: could not close cleanly:"
        " OperationalError('disk I/O error')\n"
    )
    store.shutdown()  # and it is closed: said once
    assert capsys.readouterr().err == ""


def test_a_response_owed_with_text_that_is_not_unicode_is_dropped_and_said(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:  # X12: what could not be sent on the wire is not sent from the file either
    store.put_open(spec(), owner="q")
    store.close(QID, "error", owner="q", response=SendResponse(spec().prompt, None, "boom", "q"))
    with sqlite3.connect(store.path) as conn:
        conn.execute("UPDATE outbox SET error = CAST(X'626fed' AS TEXT)")
    assert store.outbox() == []
    assert capsys.readouterr().err == (
        f"coms-hermes-bridge: state database {store.path}: dropped a response owed for"
        f" '{QID}': ValueError('text that is not valid Unicode')\n"
    )
    assert rows(store, "outbox") == 0  # gone, so said once


def test_an_open_row_that_no_longer_reads_is_no_spec_and_is_said(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    store.put_open(spec(), owner="q")
    with sqlite3.connect(store.path) as conn:
        conn.execute("UPDATE open_questions SET state = 'bogus'")
    assert store.open_spec(QID, "q") is None
    assert capsys.readouterr().err == (
        f"coms-hermes-bridge: state database {store.path}: cannot read open question"
        f" '{QID}': ValueError(\"unknown state 'bogus'\")\n"
    )


def test_delivery_failure_owes_its_error_response_without_a_closed_row(store: Store) -> None:
    # C18: state back to none, but the asker is still owed the error
    owed = SendResponse(spec().prompt, None, "hermes send failed (3): chat not found", "q")
    store.put_open(spec(), owner="q")
    store.close(QID, None, owner="q", response=owed)
    assert store.load() == ([], [])
    assert store.outbox() == [owed]


def test_the_answer_file_used_is_remembered(store: Store) -> None:
    sig = FileSignature(inode=11, size=99, mtime_ns=123456789)
    store.put_open(spec(), owner="q")
    store.close(QID, "answered", owner="q", answer_file=(f"{QID}.answer.json", sig))
    store.put_open(spec(QID2), owner="q")
    store.close(QID2, "timeout", owner="q")
    assert store.closed(QID) == ("answered", (f"{QID}.answer.json", sig))
    assert store.closed(QID2) == ("timeout", None)  # closed without an answer
    with sqlite3.connect(store.path) as conn:  # and none is written (older versions read it)
        assert conn.execute("SELECT answer_file FROM closed_questions WHERE qid = ?",
                            (QID2,)).fetchone() == (None,)
    assert store.closed("01HZY3K4M5N6P7Q8R9S0T1V2ZZ") is None  # never seen


def test_a_damaged_memory_of_the_answer_file_is_no_answer_file(store: Store) -> None:
    # the file then looks late (a note to the human) rather than the daemon failing
    store.put_open(spec(), owner="q")
    store.close(QID, "answered", owner="q", answer_file=(f"{QID}.answer.json", FileSignature(1, 2, 3)))
    with sqlite3.connect(store.path) as conn:
        conn.execute("UPDATE closed_questions SET answer_file = '[\"x\", 1]'")
    conn.close()
    assert store.closed(QID) == ("answered", None)
    with sqlite3.connect(store.path) as conn:  # a state no version writes: not a closed qid
        conn.execute("UPDATE closed_questions SET state = 'bogus'")
    conn.close()
    assert store.closed(QID) is None


def test_rows_are_guarded_by_owner(store: Store) -> None:
    # a question replaced by a repeated qid must not touch its successor's row
    store.put_open(spec(), owner="old")
    store.put_open(spec(state="pending"), owner="new")
    store.set_state(QID, "delivered", owner="old")
    assert not store.close(QID, "timeout", owner="old")
    specs, closed = store.load()
    assert [s.state for s in specs] == ["pending"] and closed == []
    store.set_state(QID, "delivered", owner="new")
    assert store.close(QID, "answered", owner="new")
    assert store.load() == ([], [(QID, "answered")])


def test_a_state_is_written_for_its_owner_only(store: Store) -> None:
    # C19 resumed after a restart: the owner's write lands, a stale actor's does not
    store.put_open(spec(), owner="q")
    assert store.set_state(QID, "delivered", owner="q") is True
    assert not store.set_state(QID, "pending", owner="old")
    assert [s.state for s in store.load()[0]] == ["delivered"]


def test_a_note_run_by_hermes_is_owed_no_more_and_the_others_still_are(store: Store) -> None:
    # C13, C17: a note stays owed until hermes has run it, and only that one goes
    first = SendText(QID, "cancelled", "cancel_note", note_id="a")
    second = SendText(QID2, "timed out", "timeout_note", note_id="b")
    store.owe_note(first)
    store.owe_note(second)
    store.note_sent("a")
    assert store.owed_notes() == [second]
    assert not store.send_owed("note:a") and store.send_owed("note:b")


def test_close_of_a_row_that_is_gone_is_refused_with_an_owner(store: Store) -> None:
    # a stale actor closing after its successor already did must not write over it
    store.put_open(spec(), owner="new")
    assert store.close(QID, None, owner="new")
    assert not store.close(QID, "timeout", owner="old")
    assert store.load() == ([], [])
    assert not store.set_state(QID, "delivered", owner="old")

def test_a_state_file_that_cannot_be_made_says_why(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(path: Path, flags: int) -> int:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(store_module, "open_private", refuse)
    with pytest.raises(OSError) as raised:
        Store.open(path)
    assert str(raised.value) == (
        f"cannot create state database {path}: [Errno 13] Permission denied")
    monkeypatch.undo()

    def failing_disk(conn: sqlite3.Connection) -> str | None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(store_module, "_schema_problem", failing_disk)  # made, then failing
    with pytest.raises(OSError) as raised:
        Store.open(path)
    assert str(raised.value) == f"cannot create state database {path}: disk I/O error"


def test_a_state_file_that_cannot_be_read_says_why(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Store.open(path).shutdown()
    with pytest.raises(OSError) as raised:
        knows_qid(path.with_name("gone.sqlite3"), QID, 0.0)
    assert str(raised.value) == (
        f"cannot read state database {path.with_name('gone.sqlite3')}: [Errno 2] No such file"
        f" or directory: '{path.with_name('gone.sqlite3')}'")
    real = sqlite3.connect

    def refuse(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        if kwargs.get("uri"):
            raise sqlite3.OperationalError("unable to open database file")
        return real(*args, **kwargs)

    monkeypatch.setattr(store_module.sqlite3, "connect", refuse)
    for read in (lambda: read_snapshot(path), lambda: knows_qid(path, QID, 0.0)):
        with pytest.raises(OSError) as raised:
            read()
        assert str(raised.value) == (
            f"cannot open state database {path}: unable to open database file")


# -- what a sibling's state says (X6) and failed deliveries (X11) -------------------


def test_a_failed_delivery_is_remembered_for_an_hour(store: Store) -> None:  # X11
    store.put_open(spec(), owner="q")
    store.close(QID, None, owner="q", undelivered_at=1000.0)
    assert store.undelivered(QID, 1000.0 + 3600)
    assert not store.undelivered(QID, 1000.0 + 3601)
    assert not store.undelivered(QID2, 1000.0)
    assert store.load() == ([], [])  # C19: no state, no closed row


def test_the_memory_of_failed_deliveries_is_bounded(store: Store) -> None:  # X11
    qids = [f"01ARZ3NDEKTSV4RRFFQ6{n:06d}" for n in range(UNDELIVERED_MEMORY + 5)]
    for n, qid in enumerate(qids):
        close_new(store, qid, None, undelivered_at=5000.0 + n)
    assert not store.undelivered(qids[4], 6000.0) and store.undelivered(qids[5], 6000.0)
    close_new(store, QID, None, undelivered_at=5000.0 + 3600 + 10)  # an hour on: the early go
    with sqlite3.connect(store.path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM undelivered").fetchone()[0] < UNDELIVERED_MEMORY


def test_knows_qid_reads_what_a_state_file_says(path: Path) -> None:  # X6
    s = Store.open(path)
    s.put_open(spec(), owner="q")
    s.put_open(spec(QID2), owner="r")
    s.close(QID2, "timeout", owner="r")
    close_new(s, "01ARZ3NDEKTSV4RRFFQ69G5FAX", None, undelivered_at=100.0)
    try:  # while its owner runs (WAL: the reader never waits)
        assert knows_qid(path, QID, 100.0) == "open"
        assert knows_qid(path, QID2, 100.0) == "timeout"
        assert knows_qid(path, "01ARZ3NDEKTSV4RRFFQ69G5FAX", 100.0) == "undelivered"
        assert knows_qid(path, "01ARZ3NDEKTSV4RRFFQ69G5FAX", 100.0 + 3601) is None
        assert knows_qid(path, "01ARZ3NDEKTSV4RRFFQ69G5FAY", 100.0) is None
    finally:
        s.shutdown()
    assert knows_qid(path, QID, 100.0) == "open"  # and when it is down


def test_sibling_of_names_the_other_project_and_never_ourselves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # X6
    ours, theirs = tmp_path / "state-a.sqlite3", tmp_path / "state-b.sqlite3"
    for p, qid in ((ours, QID), (theirs, QID2)):
        s = Store.open(p)
        s.put_open(spec(qid), owner="q")
        s.shutdown()
    assert sibling_of(ours, QID2, time.time()) == "b"
    assert sibling_of(ours, QID, time.time()) is None  # our own is not a sibling's
    assert sibling_of(theirs, QID, time.time()) == "a"
    (tmp_path / "state-c.sqlite3").write_bytes(b"not a database at all, " * 100)
    assert sibling_of(ours, "01ARZ3NDEKTSV4RRFFQ69G5FAX", time.time()) is None
    assert capsys.readouterr().err == (
        "coms-hermes-bridge: warning: cannot tell whether project c owns 01ARZ3NDEKTSV4RRFFQ69G5FAX:"
        f" cannot read state database {tmp_path / 'state-c.sqlite3'}: file is not a database\n")


def test_a_reminder_is_marked_and_owed_in_one_step_and_goes_with_its_question(
    store: Store,
) -> None:  # X9
    store.put_open(spec(), owner="q")
    note = SendText(QID, "⏰ still waiting", "remind_note", note_id=f"remind:{QID}")
    assert not store.remind(note, "someone else")  # not their row: nothing written
    assert store.owed_notes() == [] and not store.load()[0][0].reminded
    assert store.remind(note, "q")
    assert store.owed_notes() == [note] and store.send_owed(f"note:remind:{QID}")
    assert store.load()[0][0].reminded  # a restart does not decide it again
    assert store.open_spec(QID, "q").reminded  # type: ignore[union-attr]
    store.close(QID, "answered", owner="q")
    assert store.owed_notes() == [] and not store.send_owed(f"note:remind:{QID}")


def test_a_busy_siblings_file_counts_as_knowing_and_is_waited_on_briefly(tmp_path: Path) -> None:
    # X6: never delete another bridge's answer because its file was locked for a moment,
    # and never hold the actors' thread for long on it
    ours = tmp_path / "state-a.sqlite3"
    Store.open(ours).shutdown()
    locked = sqlite3.connect(tmp_path / "state-b.sqlite3", isolation_level=None)
    try:
        locked.execute("CREATE TABLE open_questions (qid TEXT)")
        locked.execute("BEGIN EXCLUSIVE")
        started = time.monotonic()
        assert sibling_of(ours, QID, time.time()) == "b"
        assert time.monotonic() - started < 2.0  # the short busy timeout, not the 5 s one
        with pytest.raises(StateBusyError) as raised:
            knows_qid(tmp_path / "state-b.sqlite3", QID, time.time(), busy_s=0.01)
        assert str(raised.value) == (
            f"state database {tmp_path / 'state-b.sqlite3'} is busy: database is locked")
    finally:
        locked.close()
    assert sibling_of(ours, QID, time.time()) is None


def test_a_fifo_or_a_strangers_file_by_a_state_name_is_never_opened(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # X6: SQLite's open of a FIFO would block the actors' thread for ever
    ours = tmp_path / "state-a.sqlite3"
    Store.open(ours).shutdown()
    fifo = tmp_path / "state-b.sqlite3"
    os.mkfifo(fifo)
    started = time.monotonic()
    assert sibling_of(ours, QID, time.time()) is None
    assert time.monotonic() - started < 2.0
    assert f"cannot tell whether project b owns {QID}: state database {fifo} is not a " \
           "regular file of ours" in capsys.readouterr().err


# -- read_snapshot: what `status` and the operator tools read (never writing) ------


def test_a_snapshot_reads_open_questions_in_arrival_order_and_closed_newest_first(
    path: Path,
) -> None:
    s = Store.open(path)
    third = "01ARZ3NDEKTSV4RRFFQ69G5FAX"
    try:
        s.put_open(spec(QID2), owner="q2")
        s.put_open(spec(QID, state="delivered"), owner="q1")
        s.put_open(spec(third), owner="q3")
        s.close(third, "cancelled", owner="q3")
        s.put_open(spec("01ARZ3NDEKTSV4RRFFQ69G5FAY"), owner="q4")
        s.close("01ARZ3NDEKTSV4RRFFQ69G5FAY", "answered", owner="q4")
        before = path.read_bytes()
        # while its owner runs (WAL: the reader never waits, and writes nothing)
        assert read_snapshot(path) == Snapshot(
            (spec(QID2), spec(QID, state="delivered")),
            (("01ARZ3NDEKTSV4RRFFQ69G5FAY", "answered"), (third, "cancelled")),
        )
        assert read_snapshot(path, closed_limit=1).closed == (
            ("01ARZ3NDEKTSV4RRFFQ69G5FAY", "answered"),)
        assert read_snapshot(path, closed_limit=-5).closed == ()
        assert path.read_bytes() == before
    finally:
        s.shutdown()


def test_a_snapshot_skips_rows_that_do_not_parse_and_repairs_nothing(path: Path) -> None:
    s = Store.open(path)
    s.put_open(spec(QID), owner="q1")
    s.put_open(spec(QID2), owner="q2")
    s.put_open(spec("01ARZ3NDEKTSV4RRFFQ69G5FAX"), owner="q3")
    s.shutdown()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE open_questions SET prompt = 'not json' WHERE qid = ?", (QID,))
        conn.execute("UPDATE open_questions SET parsed = X'7b7d' WHERE qid = ?", (QID2,))
        conn.execute("INSERT INTO closed_questions (qid, state) VALUES ('x', 'bogus')")
        conn.execute("INSERT INTO closed_questions (qid, state) VALUES (X'3031', 'answered')")
    conn.close()
    # not JSON (ValueError), not text (TypeError): skipped, each
    assert read_snapshot(path) == Snapshot((spec("01ARZ3NDEKTSV4RRFFQ69G5FAX"),), ())
    with sqlite3.connect(path) as conn:  # left for the daemon's next start to repair
        assert conn.execute("SELECT COUNT(*) FROM open_questions").fetchone()[0] == 3
        assert conn.execute("SELECT COUNT(*) FROM closed_questions").fetchone()[0] == 2
    conn.close()


def test_a_snapshot_of_no_file_an_empty_file_and_a_file_that_is_no_database(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "missing.sqlite3"
    with pytest.raises(FileNotFoundError, match=f"^no state database at {missing}$"):
        read_snapshot(missing)
    assert not missing.exists()  # not created by looking
    empty = tmp_path / "empty.sqlite3"
    empty.write_bytes(b"")
    assert read_snapshot(empty) == Snapshot((), ())  # created, never written
    half = tmp_path / "half.sqlite3"
    _sql(half, "CREATE TABLE open_questions (qid TEXT)")
    with pytest.raises(UnusableStateError, match=f"^state file {half} has schema none, "):
        read_snapshot(half)  # `status` refuses it as the daemon does
    garbage = tmp_path / "garbage.sqlite3"
    garbage.write_bytes(b"not a database at all, " * 100)
    with pytest.raises(OSError, match=f"^cannot read state database {garbage}: file is not a database$"):
        read_snapshot(garbage)


# -- an unusable state file: why, said exactly, and where it went ------------------


def _sql(path: Path, *statements: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    with conn:
        for statement in statements:
            conn.execute(statement)
    conn.close()


def _ours(path: Path) -> None:
    Store.open(path).shutdown()


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda p: _sql(p, "CREATE TABLE open_questions (qid TEXT)"), "has schema none"),
        (lambda p: _sql(p, "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)"),
         "has schema none"),
        (lambda p: (_ours(p), _sql(p, "UPDATE meta SET value = 'abc'")), "has schema abc"),
        (lambda p: (_ours(p), _sql(p, "UPDATE meta SET value = '5'")), "has schema 5"),
        (lambda p: (_ours(p), _sql(p, "UPDATE meta SET value = '99'")), "has schema 99"),
        (lambda p: _sql(p, "CREATE TABLE t (x, y)", "CREATE INDEX i ON t (x)",
                        *(f"INSERT INTO t VALUES ({n}, {-n})" for n in range(1, 6)),
                        "PRAGMA writable_schema = ON",  # the index claims another column
                        "UPDATE sqlite_master SET sql = 'CREATE INDEX i ON t (y)'"
                        " WHERE name = 'i'"),  # 5 findings, the first three said
         "is damaged: row 1 missing from index i; row 2 missing from index i; row 3 missing"
         " from index i"),
        (lambda p: p.write_bytes(b"this is not a database\x00\xff" * 100),
         "is damaged: file is not a database"),
    ],
)
def test_each_reason_a_state_file_is_refused_is_said_exactly(
    path: Path, make: Callable[[Path], object], why: str
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    make(path)
    refused(path, f"{why}, this bridge reads {SCHEMA_VERSION}" if "schema" in why else why)


def test_a_state_file_locked_by_another_process_is_said_as_such(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Store.open(path).shutdown()
    monkeypatch.setattr(store_module, "_BUSY_TIMEOUT_S", 0.05)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA journal_mode=DELETE")
    holder.execute("BEGIN EXCLUSIVE")  # not even a reader gets in
    try:
        with pytest.raises(OSError) as raised:
            Store.open(path)
    finally:
        holder.rollback()
        holder.close()
    assert not isinstance(raised.value, UnusableStateError)
    assert str(raised.value) == (
        f"state database {path} is locked by another process: database is locked")


@pytest.mark.parametrize(
    ("damage", "shown", "error"),
    [
        ("qid = X'3031'", "b'01'", "TypeError('qid is bytes')"),
        ("qid = CAST(X'3031eda080' AS TEXT)", "'01\\udced\\udca0\\udc80'",
         "ValueError('qid is not valid Unicode')"),
        ("prompt = X'7b7d'", None, "TypeError('prompt and parsed must be text')"),
        ("parsed = X'7b7d'", None, "TypeError('prompt and parsed must be text')"),
        ("parsed = CAST(X'7b227175657374696f6e223a2261ff227d' AS TEXT)", None,
         "ValueError('parsed is not valid Unicode')"),
        ("timeout_ms = 'soon'", None, "TypeError('timeout_ms and deadline must be numbers')"),
        ("deadline = 'later'", None, "TypeError('timeout_ms and deadline must be numbers')"),
        ("state = 'bogus'", None, "ValueError(\"unknown state 'bogus'\")"),
    ],
)
def test_each_way_an_open_row_fails_to_parse_is_said_and_the_row_dropped(
    store: Store, path: Path, capsys: pytest.CaptureFixture[str], damage: str,
    shown: str | None, error: str,
) -> None:  # one bad question never keeps the others from resuming
    store.put_open(spec(QID), owner="q")
    store.put_open(spec(QID2), owner="q")
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(f"UPDATE open_questions SET {damage} WHERE qid = ?", (QID,))
    conn.close()
    capsys.readouterr()
    opened, _ = reopen(store)
    assert opened == [spec(QID2)]
    qid = shown if shown is not None else repr(QID)
    assert capsys.readouterr().err == (
        f"coms-hermes-bridge: state database {path}: dropped open question {qid}: {error}\n")
    assert reopen(Store.open(path)) == ([spec(QID2)], [])  # deleted: said once, not each start


def test_a_bad_row_is_read_and_dropped_in_one_step(
    store: Store, path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # a row rewritten between the read that found it bad and its delete would be deleted
    # unread: no other writer may get in between
    store.put_open(spec(QID), owner="q")
    store.put_open(spec(QID2), owner="q")
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE open_questions SET state = 'bogus' WHERE qid = ?", (QID,))
    conn.close()
    real = store_module._spec
    refused: list[str] = []

    def repaired_meanwhile(qid: object, *row: object) -> QuestionSpec:
        if qid == QID:  # another writer tries to mend the row the start just read
            other = sqlite3.connect(path, timeout=0)
            try:
                with other:
                    other.execute("UPDATE open_questions SET state = NULL WHERE qid = ?", (QID,))
            except sqlite3.OperationalError as exc:
                refused.append(str(exc))
            finally:
                other.close()
        return real(qid, *row)

    monkeypatch.setattr(store_module, "_spec", repaired_meanwhile)
    capsys.readouterr()
    assert store.load() == ([spec(QID2)], [])
    assert refused == ["database is locked"]
    assert capsys.readouterr().err == (
        f"coms-hermes-bridge: state database {path}: dropped open question {QID!r}:"
        " ValueError(\"unknown state 'bogus'\")\n")
    assert rows(store, "open_questions") == 1


def test_a_bad_closed_row_and_a_bad_owed_note_are_said_and_dropped(
    store: Store, path: Path, capsys: pytest.CaptureFixture[str],
) -> None:  # one bad row never keeps the others; said once, with why
    store.put_open(spec(QID), owner="q")
    store.close(QID, "answered", owner="q")
    store.put_open(spec(QID2), owner="q")
    store.close(QID2, "timeout", owner="q")
    store.owe_note(SendText(QID, "ℹ late", "late_note", note_id="n1"))
    store.owe_note(SendText(QID2, "ℹ late", "late_note", note_id="n2"))
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE closed_questions SET state = 'bogus' WHERE qid = ?", (QID,))
        conn.execute("UPDATE notes SET purpose = 'gossip' WHERE id = 'n1'")
    conn.close()
    capsys.readouterr()
    assert reopen(store) == ([], [(QID2, "timeout")])
    reopened = Store.open(path)
    try:
        assert reopened.owed_notes() == [SendText(QID2, "ℹ late", "late_note", note_id="n2")]
        assert capsys.readouterr().err == (
            f"coms-hermes-bridge: state database {path}: dropped closed question {QID!r}:"
            " ValueError(\"bad state 'bogus'\")\n"
            f"coms-hermes-bridge: state database {path}: dropped a note owed for {QID!r}:"
            " ValueError('not a note hermes can send')\n")
        assert reopened.load() == ([], [(QID2, "timeout")])  # deleted: said once
        assert reopened.owed_notes() == [SendText(QID2, "ℹ late", "late_note", note_id="n2")]
        assert capsys.readouterr().err == ""
    finally:
        reopened.shutdown()


def test_a_note_kept_in_the_store_must_have_an_id(store: Store) -> None:
    with pytest.raises(ValueError, match=r"^a note kept in the store needs a note_id$"):
        store.owe_note(SendText(QID, "ℹ note", "late_note"))


def test_a_claim_on_a_question_not_open_is_refused(store: Store) -> None:
    store.put_open(spec(), owner="a")
    assert store.claim(QID, "b") is True
    assert store.open_spec(QID, "b") is not None
    assert store.claim(QID2, "b") is False  # no row: nobody answers for it


def test_only_state_dash_project_dot_sqlite3_names_a_projects_state_file(tmp_path: Path) -> None:
    for name in ("state-a.sqlite3", "state-.sqlite3", "state-b.sqlite", "other-c.sqlite3",
                 "state-d.sqlite3-wal", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    assert state_files(tmp_path) == {"a": tmp_path / "state-a.sqlite3"}
    assert state_files(tmp_path / "missing") == {}


@pytest.mark.parametrize(
    ("exc", "busy"),
    [
        (sqlite3.OperationalError("database is locked"), True),
        (sqlite3.OperationalError("database table is locked"), True),
        (sqlite3.OperationalError("database is busy"), True),
        (sqlite3.OperationalError("disk I/O error"), False),
        (sqlite3.DatabaseError("database is locked"), False),  # not a lock: damage
    ],
)
def test_only_a_lock_counts_as_busy(exc: sqlite3.Error, busy: bool) -> None:
    # a busy file is someone else's at work, not a damaged one
    assert store_module._is_busy(exc) is busy


class _NoWal(sqlite3.Connection):
    """A connection on a filesystem where WAL cannot be made (no shared memory, as on
    some network mounts): asking for WAL leaves the journal mode as it was."""

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if " ".join(sql.lower().split()) == "pragma journal_mode=wal":  # as SQLite reads it
            return super().execute("PRAGMA journal_mode")
        return super().execute(sql, *args)


def test_a_file_without_wal_is_said_and_still_kept(
    path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # restart-safe on any filesystem: the journal SQLite could make, said once
    real = sqlite3.connect
    monkeypatch.setattr(store_module.sqlite3, "connect",
                        lambda *a, **k: real(*a, **k, factory=_NoWal))
    store = Store.open(path)
    try:
        store.put_open(spec(), owner="q")
        assert [s.qid for s in store.load()[0]] == [QID]
    finally:
        store.shutdown()
    assert capsys.readouterr().err == (
        f"coms-hermes-bridge: state database {path}: WAL mode unavailable "
        "(journal mode ('delete',))\n"
    )


# -- each write committed before it returns ------------------------------------------


def _committed(path: Path) -> list[str]:
    """The open qids another connection sees: what a restart would read."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return [row[0] for row in conn.execute("SELECT qid FROM open_questions ORDER BY qid")]


BAD_NOTE = SendText(QID, "note \ud800", "late_note", note_id="late:1")  # cannot be bound


def test_a_write_is_committed_before_it_returns(store: Store, path: Path) -> None:  # promise 1
    store.put_open(spec(), owner="o")
    assert _committed(path) == [QID]


def test_a_write_that_fails_undoes_only_itself_and_holds_no_lock(
        store: Store, path: Path) -> None:
    store.put_open(spec(), owner="o")
    with pytest.raises(UnicodeEncodeError):
        store.owe_note(BAD_NOTE)
    with contextlib.closing(sqlite3.connect(path, timeout=0)) as other:
        other.execute("BEGIN IMMEDIATE")  # would be "database is locked"
        other.rollback()
    store.owe_note(SendText(QID, "note", "late_note", note_id="late:2"))
    assert _committed(path) == [QID]
    assert [n.note_id for n in store.owed_notes()] == ["late:2"]


@pytest.mark.parametrize("rollback", [None, sqlite3.OperationalError("cannot rollback")])
def test_a_failed_commit_fails_that_write_only(
        store: Store, path: Path, rollback: Exception | None) -> None:
    real = store._conn
    store._conn = FailingConnection(real, commit=DISK_ERROR,  # type: ignore[assignment]
                                    rollback=rollback)
    with pytest.raises(sqlite3.OperationalError, match="disk I/O error"):
        store.put_open(spec(), owner="o")
    store._conn = real
    store.put_open(spec(QID2), owner="o")  # the store goes on
    assert _committed(path) == [QID2]


def test_a_close_whose_commit_fails_leaves_the_question_open_for_the_restart(
        store: Store, path: Path) -> None:  # promise 1: the response is not handed over
    store.put_open(spec(), owner="o")
    store._conn = FailingConnection(store._conn, commit=DISK_ERROR)  # type: ignore[assignment]
    with pytest.raises(sqlite3.OperationalError):
        store.close(QID, "answered", owner="o",
                    response=SendResponse(spec().prompt, "yes", None, "o"))
    store.shutdown()
    restarted = Store.open(path)  # what the next start reads: still open, nothing owed
    try:
        assert restarted.load() == ([spec()], [])
        assert restarted.outbox() == []
    finally:
        restarted.shutdown()


def test_a_question_send_is_owed_while_its_question_is_pending_and_no_longer(
    store: Store,
) -> None:
    # promise 1: a send told again after a restart runs only while owed; each key is read
    # by its own row (a scan of every open question per send made 10,000 sends quadratic)
    other = "01HZY3K4M5N6P7Q8R9S0T1V2WB"
    store.put_open(spec(QID), owner="q")
    store.put_open(spec(other, state="delivered"), owner="q2")
    assert store.send_owed(f"question:{QID}")  # never confirmed: pending
    assert store.set_state(QID, "pending", owner="q") and store.send_owed(f"question:{QID}")
    assert not store.send_owed(f"question:{other}")  # delivered: not again
    assert store.set_state(QID, "delivered", owner="q")
    assert not store.send_owed(f"question:{QID}")
    assert not store.send_owed("question:01HZY3K4M5N6P7Q8R9S0T1V2WZ")  # no such question
    assert not store.send_owed(f"note:{QID}") and not store.send_owed(f"other:{QID}")


@pytest.mark.parametrize("key", [f"question:{QID}", "note:n1"])
def test_a_sends_owed_check_reads_its_own_row_and_never_scans(store: Store, key: str) -> None:
    # --max-open 10,000: the check before each send and the outcome kept after it find the
    # key by primary key; a scan of every open question per send made a burst quadratic
    store.put_open(spec(QID), owner="q")
    run: list[str] = []
    store._conn.set_trace_callback(run.append)
    store.send_owed(key)
    store.record_sent(key, None)
    store._conn.set_trace_callback(None)
    lookups = [sql for sql in run if "open_questions" in sql]
    assert len(lookups) == 2
    for sql in lookups:
        plan = [row[3] for row in store._conn.execute(f"EXPLAIN QUERY PLAN {sql}")]
        assert [step for step in plan if step.startswith("SEARCH")] == [
            "SEARCH open_questions USING INDEX sqlite_autoindex_open_questions_1 (qid=?)",
            "SEARCH notes USING COVERING INDEX sqlite_autoindex_notes_1 (id=?)"]
        assert not [step for step in plan if step.startswith("SCAN") and "CONSTANT" not in step]


def test_a_sends_outcome_is_kept_while_its_question_is_pending_and_goes_when_it_moves_on(
    store: Store,
) -> None:
    # promise 1: a restart mid-send takes hermes' outcome (C18's error exactly) from the
    # store instead of sending again, only while the question has not moved on (C19)
    key, error = f"question:{QID}", "hermes send failed (2): no route"
    store.put_open(spec(state="pending"), owner="q")
    store.record_sent(key, error)
    assert store.sent_outcome(key) == (error,)
    assert not store.set_state(QID, "delivered", owner="old")  # a stale actor moves nothing
    assert store.sent_outcome(key) == (error,)
    assert store.set_state(QID, "pending", owner="q")  # still owed: still kept
    assert store.sent_outcome(key) == (error,)
    assert store.set_state(QID, "delivered", owner="q")
    assert store.sent_outcome(key) is None


def test_a_closed_questions_reminder_outcome_never_stands_for_a_new_ones(store: Store) -> None:
    # X9 with a repeated qid: the first question's reminder was sent; the new question's
    # own reminder is owed and must not be taken for sent
    key = f"note:remind:{QID}"
    note = SendText(QID, "⏰ still waiting", "remind_note", note_id=f"remind:{QID}")
    store.put_open(spec(), owner="q")
    assert store.remind(note, "q")
    store.record_sent(key, None)
    assert store.close(QID, "answered", owner="q")
    store.put_open(spec(), owner="q2")
    assert store.remind(note, "q2")
    assert store.owed_notes() == [note] and store.sent_outcome(key) is None


def test_a_cut_deadline_is_written_for_its_owner_only(store: Store) -> None:
    # C19 resumed after a restart: the owner's cut lands and says so, a stale actor's does not
    store.put_open(spec(), owner="q")
    assert store.set_deadline(QID, 1_700_000_000.5, owner="old") is False
    assert store.set_deadline(QID, 1_700_000_000.25, owner="q") is True
    assert [s.deadline for s in reopen(store)[0]] == [1_700_000_000.25]
