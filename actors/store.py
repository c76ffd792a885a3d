"""The durable record of open questions (read from outside: actors/state_view.py).

Every effect (an ack, a state, a close, a response or note owed) is written here first,
and each actor rebuilds its work from it at start. SQLite: a close's rows change in one
step, and a crash mid-write needs no journal of ours.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar, cast, get_args

from ..messages.commands import (
    FileSignature,
    QuestionSpec,
    SendResponse,
    SendText,
)
from ..messages.contract import js_number
from ..messages.wire import ParsedPrompt, PromptEnvelope, State, dumps, has_lone_surrogate, loads
from .files import FILE_MODE, bridge_dir, open_private, tighten_mode
from .loop import report

T = TypeVar("T")

# A file of any other version is refused, never converted (`UnusableStateError`).
SCHEMA_VERSION = 6
CLOSED_MEMORY = 1000  # closed qids remembered, at most (C15, X2)

_STATES: frozenset[str] = frozenset(get_args(State))
_SIDECARS = ("-wal", "-shm")
_BUSY_TIMEOUT_S = 5.0

# A table's order is its rowid (an upsert keeps it, INSERT OR REPLACE moves the row last).
_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE open_questions (
    qid TEXT PRIMARY KEY,
    prompt TEXT NOT NULL,
    parsed TEXT NOT NULL,
    timeout_ms REAL NOT NULL,
    deadline REAL NOT NULL,
    state TEXT,
    owner TEXT,
    reminded INTEGER
);
CREATE TABLE closed_questions (qid TEXT PRIMARY KEY, state TEXT NOT NULL, answer_file TEXT);
CREATE TABLE outbox (
    qid TEXT NOT NULL,
    owner TEXT NOT NULL,
    prompt TEXT NOT NULL,
    response TEXT NOT NULL,
    error TEXT,
    PRIMARY KEY (qid, owner)
);
CREATE TABLE notes (id TEXT PRIMARY KEY, qid TEXT NOT NULL, purpose TEXT NOT NULL,
                    text TEXT NOT NULL);
CREATE TABLE undelivered (qid TEXT PRIMARY KEY, at REAL NOT NULL);
CREATE TABLE sent (key TEXT PRIMARY KEY, error TEXT);
"""
# A send's outcome is owed to its question while the question has not moved on, and to a
# note while the note is owed; any other is not kept (and is forgotten at start). Each
# key is found by primary key: a scan per send makes a burst of sends quadratic.
def _owed_sql(key: str) -> str:
    return (f"(EXISTS (SELECT 1 FROM open_questions WHERE substr({key}, 1, 9) = 'question:'"
            f" AND qid = substr({key}, 10) AND (state IS NULL OR state = 'pending'))"
            f" OR EXISTS (SELECT 1 FROM notes WHERE substr({key}, 1, 5) = 'note:'"
            f" AND id = substr({key}, 6)))")


_KEY_OWED = _owed_sql(":key")
_SENT_STALE = f"DELETE FROM sent WHERE NOT {_owed_sql('sent.key')}"
UNDELIVERED_MEMORY_S = 3600.0  # X11: how long a failed delivery is remembered
UNDELIVERED_MEMORY = 1000  # and how many at most
_UNDELIVERED_SQL = "SELECT 1 FROM undelivered WHERE qid = ? AND at >= ?"  # (qid, since)
_NOTE_PURPOSES = ("cancel_note", "late_note", "timeout_note", "undelivered_note", "remind_note")


class UnusableStateError(OSError):
    """Damaged, or of another schema: refused in one line saying how to start afresh, and
    never changed, so what it holds stays for the operator."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"state file {path} {why}; stop the bridge and move {path} "
                         "(and its -wal, -shm) aside to start afresh")


def _schema_problem(conn: sqlite3.Connection) -> str | None:
    """Why the file is not of this bridge's schema; None when it is, or holds no table yet."""
    tables = {name for (name,) in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not tables:
        return None
    found = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() \
        if "meta" in tables else None
    version = "none" if found is None else found[0]
    if version == str(SCHEMA_VERSION):
        return None
    return f"has schema {version}, this bridge reads {SCHEMA_VERSION}"


def _is_busy(exc: sqlite3.Error) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and (
        "locked" in str(exc) or "busy" in str(exc)
    )


class Store:
    """One SQLite file (WAL, 0600); every write is committed before its method returns.
    `synchronous=NORMAL`: a crash of the process loses nothing, a power loss may lose the
    last commits (the price of no fsync per change). One connection behind one lock."""

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self.path = path
        self._conn = conn
        self._lock = threading.Lock()
        self._shut = False

    @classmethod
    def open(cls, path: Path) -> Store:
        """UnusableStateError, or OSError when no store can be made at all."""
        path = Path(path)
        try:
            bridge_dir(path.parent)
        except OSError as exc:
            raise OSError(f"cannot create the directory of state database {path}: {exc}") from exc
        return cls(path, _connect(path))

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """Committed, or undone whole. After `shutdown`, sqlite3.ProgrammingError."""
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.commit()
            except BaseException:  # the transaction's edge: undone whole, whatever stopped it
                with suppress(sqlite3.Error):  # a failed COMMIT leaves it open: end it
                    conn.rollback()
                raise

    def put_open(self, spec: QuestionSpec, owner: str) -> None:
        """A repeated qid keeps its place in the order."""
        with self._transaction() as conn:
            conn.execute(
                "INSERT INTO open_questions"
                " (qid, prompt, parsed, timeout_ms, deadline, state, owner, reminded)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (qid) DO UPDATE SET prompt = excluded.prompt,"
                "  parsed = excluded.parsed, timeout_ms = excluded.timeout_ms,"
                "  deadline = excluded.deadline, state = excluded.state,"
                "  owner = excluded.owner, reminded = excluded.reminded",
                (
                    spec.qid,
                    spec.prompt.to_json(),
                    dumps(spec.parsed.model_dump(mode="json")),
                    float(spec.timeout_ms),
                    float(spec.deadline),
                    spec.state,
                    owner,
                    int(spec.reminded),
                ),
            )

    def set_state(self, qid: str, state: State, owner: str) -> bool:
        """Only `owner`'s row (a restarted question's is no longer its predecessor's);
        False when there is none."""
        with self._transaction() as conn:
            done = conn.execute(
                "UPDATE open_questions SET state = ? WHERE qid = ? AND owner = ?",
                (state, qid, owner),
            )
            if done.rowcount > 0 and state != "pending":  # its send's outcome is acted on
                conn.execute("DELETE FROM sent WHERE key = ?", (f"question:{qid}",))
            return done.rowcount > 0

    def close(
        self,
        qid: str,
        state: State | None,
        *,
        owner: str,
        response: SendResponse | None = None,
        answer_file: tuple[str, FileSignature] | None = None,
        note: SendText | None = None,
        undelivered_at: float | None = None,
    ) -> bool:
        """One step: the row goes, the closed row (none for `state` None: never seen, so
        never late), and what is owed (`response`, `note`) until `settle`/`note_sent`.
        `answer_file`: a restart before its removal must not take it for late;
        `undelivered_at`: X11's memory. False, nothing written, if the row is not `owner`'s."""
        with self._transaction() as conn:
            if response is not None:  # the prompt is copied from the row
                conn.execute(
                    "INSERT OR REPLACE INTO outbox (qid, owner, prompt, response, error)"
                    " SELECT qid, owner, prompt, ?, ? FROM open_questions"
                    " WHERE qid = ? AND owner = ?",
                    (dumps(response.response), response.error, qid, owner),
                )
            gone = conn.execute(
                "DELETE FROM open_questions WHERE qid = ? AND owner = ?", (qid, owner)
            )
            if gone.rowcount == 0:  # nothing was copied either
                return False
            # X9: a reminder not yet sent is not sent once the question is closed
            conn.execute("DELETE FROM notes WHERE id = ?", (remind_note_id(qid),))
            conn.execute("DELETE FROM sent WHERE key IN (?, ?)",
                         (f"question:{qid}", f"note:{remind_note_id(qid)}"))
            if note is not None:
                self._owe_note(conn, note)
            if undelivered_at is not None:
                conn.execute(
                    "INSERT OR REPLACE INTO undelivered (qid, at) VALUES (?, ?)",
                    (qid, undelivered_at),
                )
                conn.execute(
                    "DELETE FROM undelivered WHERE at < ? OR qid NOT IN"
                    " (SELECT qid FROM undelivered ORDER BY at DESC LIMIT ?)",
                    (undelivered_at - UNDELIVERED_MEMORY_S, UNDELIVERED_MEMORY),
                )
            if state is None:
                return True
            used = None
            if answer_file is not None:
                name, sig = answer_file
                used = dumps([name, sig.inode, sig.size, sig.mtime_ns])
            conn.execute(
                "INSERT OR REPLACE INTO closed_questions (qid, state, answer_file)"
                " VALUES (?, ?, ?)",
                (qid, state, used),
            )
            _trim_closed(conn)
        return True

    def _owe_note(self, conn: sqlite3.Connection, note: SendText) -> None:
        if note.note_id is None:
            raise ValueError("a note kept in the store needs a note_id")
        conn.execute(
            "INSERT OR REPLACE INTO notes (id, qid, purpose, text) VALUES (?, ?, ?, ?)",
            (note.note_id, note.qid, note.purpose, note.text),
        )

    def owe_note(self, note: SendText) -> None:
        """A note decided on its own (a late answer): kept until `note_sent`."""
        with self._transaction() as conn:
            self._owe_note(conn, note)

    def remind(self, note: SendText, owner: str) -> bool:
        """X9: marked and owed in one step, so a restart neither loses it nor decides it
        twice. False (nothing written) when the row is not `owner`'s."""
        with self._transaction() as conn:
            done = conn.execute(
                "UPDATE open_questions SET reminded = 1 WHERE qid = ? AND owner = ?",
                (note.qid, owner),
            )
            if done.rowcount == 0:
                return False
            self._owe_note(conn, note)
        return True

    def note_sent(self, note_id: str) -> None:
        """hermes has run the note (sent, or failed and logged)."""
        with self._transaction() as conn:
            conn.execute("DELETE FROM notes WHERE id = ?", (note_id,))
            conn.execute("DELETE FROM sent WHERE key = ?", (f"note:{note_id}",))

    def record_sent(self, key: str, error: str | None) -> None:
        """A send's outcome (None: sent, else C18's error), kept until what it was sent for
        acts on it: a restart in between takes it from here instead of sending again."""
        with self._transaction() as conn:
            conn.execute(f"INSERT OR REPLACE INTO sent (key, error) SELECT :key, :error"
                         f" WHERE {_KEY_OWED}", {"key": key, "error": error})

    def send_owed(self, key: str) -> bool:
        """Is the send known as `key` still owed (told again, one acted on is not sent twice)?"""
        with self._transaction() as conn:
            return bool(conn.execute(f"SELECT {_KEY_OWED}", {"key": key}).fetchone()[0])

    def sent_outcome(self, key: str) -> tuple[str | None] | None:
        """The kept outcome (its error, in a tuple), if any."""
        with self._transaction() as conn:
            row = conn.execute("SELECT error FROM sent WHERE key = ?", (key,)).fetchone()
        return None if row is None else (None if row[0] is None else str(row[0]),)

    def owed_notes(self) -> list[SendText]:
        """Notes not yet run by hermes, oldest first."""
        return self._read_or_drop(
            "notes", "a note owed for", _note, "SELECT rowid, qid, id, purpose, text FROM notes"
            " ORDER BY rowid")

    def undelivered(self, qid: str, now: float) -> bool:
        """Did this bridge fail to deliver `qid` within the last UNDELIVERED_MEMORY_S (X11)?"""
        with self._transaction() as conn:
            row = conn.execute(_UNDELIVERED_SQL, (qid, now - UNDELIVERED_MEMORY_S)).fetchone()
        return row is not None

    def open_spec(self, qid: str, owner: str) -> QuestionSpec | None:
        """What a restarted question resumes from; None when closed or undecodable."""
        with self._transaction() as conn:
            row = conn.execute(
                "SELECT qid, prompt, parsed, timeout_ms, deadline, state, reminded"
                " FROM open_questions WHERE qid = ? AND owner = ?",
                (qid, owner),
            ).fetchone()
        if row is None:
            return None
        try:
            return _spec(*row)
        except (TypeError, ValueError, RecursionError) as exc:  # a damaged row
            report(f"state database {self.path}: cannot read open question {qid!r}: {exc!r:.200}")
            return None

    def set_deadline(self, qid: str, deadline: float, owner: str) -> bool:
        """A deadline cut back (a wall clock that had run fast) stays cut after a restart."""
        with self._transaction() as conn:
            done = conn.execute(
                "UPDATE open_questions SET deadline = ? WHERE qid = ? AND owner = ?",
                (deadline, qid, owner),
            )
            return done.rowcount > 0

    def claim(self, qid: str, owner: str) -> bool:
        """`owner` answers for this open question now (restore, restart)."""
        with self._transaction() as conn:
            done = conn.execute(
                "UPDATE open_questions SET owner = ? WHERE qid = ?", (owner, qid)
            )
            return done.rowcount > 0

    def settle(self, qid: str, owner: str | None = None) -> None:
        """The asker was answered (or is gone for good); a crash before this sends the
        response again at the next start (at least once)."""
        with self._transaction() as conn:
            conn.execute("DELETE FROM outbox WHERE qid = ? AND owner = ?", (qid, owner or ""))

    def response_owed(self, qid: str, owner: str) -> bool:
        """Still in the outbox? (Told again after a Peer's restart, it is not sent twice.)"""
        with self._transaction() as conn:
            row = conn.execute("SELECT 1 FROM outbox WHERE qid = ? AND owner = ?",
                               (qid, owner)).fetchone()
        return row is not None

    def outbox(self) -> list[SendResponse]:
        """Responses decided but not yet handed to their askers, oldest first."""
        return self._read_or_drop(
            "outbox", "a response owed for", _owed,
            "SELECT rowid, qid, owner, prompt, response, error FROM outbox ORDER BY rowid")

    def closed(self, qid: str) -> tuple[State, tuple[str, FileSignature] | None] | None:
        """How `qid` ended and the answer file that answered it, if remembered (C15, X2)."""
        with self._transaction() as conn:
            row = conn.execute(
                "SELECT state, answer_file FROM closed_questions WHERE qid = ?", (qid,)
            ).fetchone()
        if row is None or row[0] not in _STATES:
            return None
        try:
            name, inode, size, mtime_ns = json.loads(row[1])
            return row[0], (str(name), FileSignature(int(inode), int(size), int(mtime_ns)))
        except (TypeError, ValueError, RecursionError):  # none, or damaged
            return row[0], None

    def load(self) -> tuple[list[QuestionSpec], list[tuple[str, State]]]:
        """Open questions in arrival order, closed oldest first; a row that no longer
        parses is deleted and said, so it cannot keep the others from resuming."""
        with self._transaction() as conn:
            _trim_closed(conn)
            conn.execute(_SENT_STALE)
        specs = self._read_or_drop(
            "open_questions", "open question", _spec,
            "SELECT rowid, qid, prompt, parsed, timeout_ms, deadline, state, reminded"
            " FROM open_questions ORDER BY rowid")
        closed = self._read_or_drop(
            "closed_questions", "closed question", _closed,
            "SELECT rowid, qid, state FROM closed_questions ORDER BY rowid")
        return specs, closed

    def _read_or_drop(self, table: str, what: str, decode: Callable[..., T], sql: str) -> list[T]:
        """The rows `sql` selects (rowid, then the key), decoded; one that does not decode
        is deleted by rowid (a bad key may not bind) and said once, in the read's transaction."""
        with self._transaction() as conn:
            good, bad = _decode(conn.execute(sql).fetchall(), decode)
            if bad:
                conn.executemany(f"DELETE FROM {table} WHERE rowid = ?",
                                 [(rowid,) for rowid, _, _ in bad])
        for _, key, exc in bad:
            report(f"state database {self.path}: dropped {what} {key!r}: {exc!r:.200}")
        return good

    def shutdown(self) -> None:
        """Safe twice (stop and crash paths both call it); a write after it raises
        sqlite3.ProgrammingError."""
        with self._lock:
            if self._shut:
                return
            self._shut = True
            try:
                self._conn.close()
            except sqlite3.Error as exc:
                report(f"state database {self.path}: could not close cleanly: {exc!r}")


def _trim_closed(conn: sqlite3.Connection) -> None:
    """The closed rows older than the newest CLOSED_MEMORY rowids go."""
    conn.execute("DELETE FROM closed_questions WHERE rowid <="
                 " (SELECT MAX(rowid) FROM closed_questions) - ?", (CLOSED_MEMORY,))


def remind_note_id(qid: str) -> str:
    """X9's one reminder, under a name its close can find."""
    return f"remind:{qid}"


def _text(raw: bytes) -> str:
    """Bytes that are not UTF-8 come back as lone surrogates, refused row by row (X12)
    instead of failing the whole query."""
    return raw.decode("utf-8", "surrogateescape")


def _connect(path: Path) -> sqlite3.Connection:
    """The file in WAL mode with the schema in place, or UnusableStateError, or OSError."""
    try:
        # 0600 before SQLite makes it: the -wal and -shm get the main file's mode.
        # O_NONBLOCK: a FIFO planted by that name is refused, never waited on.
        fd = open_private(path, os.O_CREAT | os.O_RDWR | os.O_NONBLOCK)
        try:
            regular = stat.S_ISREG(os.fstat(fd).st_mode)
        finally:
            os.close(fd)
        for name in (Path(f"{path}{suffix}") for suffix in _SIDECARS):
            tighten_mode(name, FILE_MODE)
    except OSError as exc:
        raise OSError(f"cannot create state database {path}: {exc}") from exc
    if not regular:
        raise UnusableStateError(path, "is not a regular file")
    conn = sqlite3.connect(
        str(path), check_same_thread=False, isolation_level=None, timeout=_BUSY_TIMEOUT_S
    )
    try:
        conn.text_factory = _text
        try:
            rows = conn.execute("PRAGMA integrity_check").fetchall()
            why = _schema_problem(conn) if rows == [("ok",)] else (
                "is damaged: " + "; ".join(str(r[0]) for r in rows[:3]))
        except sqlite3.OperationalError:
            raise
        except sqlite3.DatabaseError as exc:  # "file is not a database", say
            why = f"is damaged: {exc}"
        if why is not None:
            raise UnusableStateError(path, why)
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()
        if str(mode[0]).lower() != "wal":
            report(f"state database {path}: WAL mode unavailable (journal mode {mode!r})")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("BEGIN IMMEDIATE")
        if conn.execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,):  # new
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?)",
                         (str(SCHEMA_VERSION),))
        conn.commit()
    except UnusableStateError:
        conn.close()
        raise
    except sqlite3.Error as exc:
        conn.close()
        if _is_busy(exc):
            raise OSError(f"state database {path} is locked by another process: {exc}") from exc
        raise OSError(f"cannot create state database {path}: {exc}") from exc
    return conn


def _spec(
    qid: object,
    prompt: object,
    parsed: object,
    timeout_ms: object,
    deadline: object,
    state: object,
    reminded: object = None,
) -> QuestionSpec:
    """One open question from its row, checked as the wire checks it (X12); ValueError or
    TypeError if it does not parse."""
    if not isinstance(qid, str):
        raise TypeError(f"qid is {type(qid).__name__}")
    if has_lone_surrogate(qid):
        raise ValueError("qid is not valid Unicode")
    if not isinstance(prompt, str) or not isinstance(parsed, str):
        raise TypeError("prompt and parsed must be text")
    if has_lone_surrogate(parsed):  # as written, lone surrogates are escaped: these are bytes
        raise ValueError("parsed is not valid Unicode")
    if not isinstance(timeout_ms, int | float) or not isinstance(deadline, int | float):
        raise TypeError("timeout_ms and deadline must be numbers")
    if state is not None and state not in _STATES:
        raise ValueError(f"unknown state {state!r}")
    return QuestionSpec(
        qid=qid,
        prompt=PromptEnvelope.model_validate(loads(prompt)),
        parsed=ParsedPrompt.model_validate(loads(parsed)),
        timeout_ms=js_number(timeout_ms),  # as the Router made it: 250, not 250.0
        deadline=float(deadline),
        state=cast("State | None", state),
        reminded=bool(reminded),
    )


def _closed(qid: Any, state: Any) -> tuple[str, State]:
    """One closed question's row; ValueError if it does not parse."""
    if not isinstance(qid, str) or has_lone_surrogate(qid) or state not in _STATES:
        raise ValueError(f"bad state {state!r}")
    return qid, state


def _note(qid: Any, note_id: Any, purpose: Any, text: Any) -> SendText:
    """One owed note's row; ValueError if it does not parse or is not valid Unicode (X12)."""
    if not (isinstance(qid, str) and isinstance(note_id, str) and isinstance(text, str)
            and purpose in _NOTE_PURPOSES and not has_lone_surrogate([note_id, qid, text])):
        raise ValueError("not a note hermes can send")
    return SendText(qid, text, purpose, note_id=note_id)


def _owed(qid: Any, owner: Any, prompt: Any, response: Any, error: Any) -> SendResponse:
    """One owed response's row; whatever the decoder raises if it does not parse."""
    if has_lone_surrogate([qid, owner, response, error]):  # X12, as on the wire
        raise ValueError("text that is not valid Unicode")
    envelope = PromptEnvelope.model_validate(loads(prompt))
    return SendResponse(envelope, loads(response), error, owner or None)


def _decode(rows: list[Any], decode: Callable[..., T]
            ) -> tuple[list[T], list[tuple[Any, Any, Exception]]]:
    """Each row (rowid first) decoded, and the (rowid, key, error) of each that is not."""
    good: list[T] = []
    bad: list[tuple[Any, Any, Exception]] = []
    for rowid, *row in rows:
        try:
            good.append(decode(*row))
        except (TypeError, ValueError, RecursionError) as exc:
            bad.append((rowid, row[0], exc))
    return good, bad
