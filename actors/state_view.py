"""Reading state files without the daemon's lock, for the operator's verbs and sibling
bridges (X6): read-only, so nothing changes and a WAL writer is never blocked."""

from __future__ import annotations

import os
import sqlite3
import stat
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..messages.commands import QuestionSpec
from ..messages.wire import State, has_lone_surrogate
from .loop import report
from .store import (
    _BUSY_TIMEOUT_S,
    _UNDELIVERED_SQL,
    CLOSED_MEMORY,
    UNDELIVERED_MEMORY_S,
    UnusableStateError,
    _closed,
    _decode,
    _is_busy,
    _schema_problem,
    _spec,
    _text,
)

# a sibling's file is read in a turn: locked longer than this, it counts as busy
SIBLING_BUSY_S = 0.2
STATE_PREFIX = "state-"
STATE_SUFFIX = ".sqlite3"


def state_files(directory: Path) -> dict[str, Path]:
    """Every project's state file in `directory` (`state-<project>.sqlite3`), by project."""
    found: dict[str, Path] = {}
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return found
    for name in names:
        if name.startswith(STATE_PREFIX) and name.endswith(STATE_SUFFIX):
            project = name[len(STATE_PREFIX) : -len(STATE_SUFFIX)]
            if project:
                found[project] = directory / name
    return found


def _read_only(path: Path, busy_s: float = _BUSY_TIMEOUT_S) -> sqlite3.Connection:
    uri = f"file:{urllib.parse.quote(str(path.absolute()))}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=busy_s)
    except sqlite3.Error as exc:
        raise OSError(f"cannot open state database {path}: {exc}") from exc
    conn.text_factory = _text
    return conn


def knows_qid(path: Path, qid: str, now: float, busy_s: float = _BUSY_TIMEOUT_S) -> str | None:
    """"open", its closed state, or "undelivered" (X11); None when nothing. StateBusyError
    when locked past `busy_s`, OSError when it cannot be read."""
    try:  # a FIFO (or a device) by that name would block SQLite's open for ever
        st = os.lstat(path)
    except OSError as exc:
        raise OSError(f"cannot read state database {path}: {exc}") from exc
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
        raise OSError(f"state database {path} is not a regular file of ours")
    conn = _read_only(path, busy_s)
    try:
        tables = {name for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "open_questions" in tables and conn.execute(
            "SELECT 1 FROM open_questions WHERE qid = ?", (qid,)
        ).fetchone():
            return "open"
        if "closed_questions" in tables:
            row = conn.execute(
                "SELECT state FROM closed_questions WHERE qid = ?", (qid,)
            ).fetchone()
            if row is not None:
                return str(row[0])
        if "undelivered" in tables and conn.execute(
            _UNDELIVERED_SQL, (qid, now - UNDELIVERED_MEMORY_S)
        ).fetchone():
            return "undelivered"
        return None
    except sqlite3.Error as exc:
        if _is_busy(exc):
            raise StateBusyError(f"state database {path} is busy: {exc}") from exc
        raise OSError(f"cannot read state database {path}: {exc}") from exc
    finally:
        conn.close()


def _failed(qid: Any, at: Any) -> Failed:
    """One failed delivery's row; ValueError if it does not parse (X12)."""
    if not (isinstance(qid, str) and isinstance(at, int | float)
            and not has_lone_surrogate(qid)):
        raise ValueError("not a failed delivery")
    return Failed(qid, float(at))


class StateBusyError(OSError):
    """Another process holds the state file locked past the busy timeout: try later."""


def sibling_of(own: Path, qid: str, now: float) -> str | None:
    """The project beside `own` whose state knows `qid` (X6), or None. A busy file knows
    it (leaving a file is safe, deleting another's is not); a damaged one knows nothing."""
    for project, path in state_files(own.parent).items():
        if path == own:
            continue
        try:
            if knows_qid(path, qid, now, SIBLING_BUSY_S) is not None:
                return project
        except StateBusyError:
            return project
        except OSError as exc:
            report(f"cannot tell whether project {project} owns {qid}: {exc}", "warning")
    return None


@dataclass(frozen=True)
class Failed:
    """A delivery that failed within UNDELIVERED_MEMORY_S (X11), at epoch seconds."""

    qid: str
    at: float


@dataclass(frozen=True)
class Snapshot:
    """What a state file says right now: open questions in arrival order, closed newest
    first, failed deliveries newest first."""

    open: tuple[QuestionSpec, ...]
    closed: tuple[tuple[str, State], ...]
    failed: tuple[Failed, ...] = ()


def read_snapshot(path: Path, closed_limit: int = CLOSED_MEMORY) -> Snapshot:
    """The state file now; a bad row is skipped (the daemon's to drop). FileNotFoundError,
    UnusableStateError (another schema), or OSError."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no state database at {path}")
    conn = _read_only(path)
    try:
        why = _schema_problem(conn)
        if why is not None:
            raise UnusableStateError(path, why)
        if conn.execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,):
            return Snapshot((), ())  # created, never written
        specs, _ = _decode(conn.execute(
            "SELECT rowid, qid, prompt, parsed, timeout_ms, deadline, state"
            " FROM open_questions ORDER BY rowid").fetchall(), _spec)
        closed, _ = _decode(conn.execute(
            "SELECT rowid, qid, state FROM closed_questions ORDER BY rowid DESC LIMIT ?",
            (max(0, closed_limit),)).fetchall(), _closed)
        failed, _ = _decode(conn.execute(
            "SELECT rowid, qid, at FROM undelivered WHERE at >= ?"
            " ORDER BY at DESC", (time.time() - UNDELIVERED_MEMORY_S,)).fetchall(), _failed)
        return Snapshot(tuple(specs), tuple(closed), tuple(failed))
    except sqlite3.Error as exc:
        raise OSError(f"cannot read state database {path}: {exc}") from exc
    finally:
        conn.close()
