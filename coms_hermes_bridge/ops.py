"""The operator's verbs, through the doors anyone else uses (the state file read-only, an
answer file, a cancel on the socket): safe while the daemon runs, most work while it is down."""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ulid import ULID

from .actors.config import BridgeConfig
from .actors.files import private_dir, write_atomic
from .actors.loop import utc_now
from .actors.peer import MODEL
from .actors.registry import IdentityError, agents_dir, is_live, read_entry, validate_project
from .actors.responses import send_envelope
from .actors.state_view import Failed, Snapshot, knows_qid, read_snapshot, state_files
from .actors.store import CLOSED_MEMORY
from .messages.commands import QuestionSpec
from .messages.contract import OPERATOR, answer_name, delivery_failure, first_line, iso, map_answer
from .messages.wire import (
    AnswerFile,
    CancelEnvelope,
    MappedAnswer,
    RegistryEntry,
    fit_line,
    has_lone_surrogate,
)

CANCEL_TIMEOUT_S = 5.0  # for the bridge's ack, and again for the question to close
LOG_TAIL_BYTES = 256 * 1024  # how much of log.ndjson `status` reads (closes, failures)
TERMINAL_EVENTS = ("answered", "cancelled", "timeout")
MAX_ANSWER_CHARS = 16_000  # a Telegram message is at most 4096


class OpsError(Exception):
    """What went wrong, in one line for the operator."""


BRIDGE_KEYS = ("name", "pid", "endpoint", "started_at", "heartbeat_at")  # status --json


def running_bridge(config: BridgeConfig, now: datetime | None = None) -> RegistryEntry | None:
    """The project's live bridge: the one named `config.name`, else any (a restart may have
    taken `user-remote2`)."""
    found = _live_bridges(agents_dir(config.coms_dir, config.project), now or utc_now())
    return next((entry for entry in found if entry.name == config.name),
                found[0] if found else None)


def _live_bridges(directory: Path, now: datetime) -> list[RegistryEntry]:
    try:
        entries = [read_entry(path) for path in sorted(directory.glob("*.json"))]
    except OSError:  # glob raises when a directory on the way cannot be searched
        return []
    return [entry for entry in entries
            if entry is not None and entry.model == MODEL and is_live(entry, now)]


def _snapshot(config: BridgeConfig, closed_limit: int = CLOSED_MEMORY) -> Snapshot:
    try:
        return read_snapshot(config.state_path, closed_limit)
    except FileNotFoundError:
        return Snapshot((), ())
    except OSError as exc:
        raise OpsError(str(exc)) from exc


def _from_log(log_path: Path, closed: set[str], failed: set[str]
              ) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """From the tail of log.ndjson (bounded; older ones stay unknown): when each closed qid
    closed, and each failed one's asker and error (its `question_received` and
    `delivery_error` records)."""
    times: dict[str, str] = {}
    details: dict[str, dict[str, Any]] = {qid: {} for qid in failed}
    if not closed and not failed:
        return times, details
    try:
        with open(log_path, "rb") as log:
            size = log.seek(0, os.SEEK_END)
            log.seek(max(0, size - LOG_TAIL_BYTES))
            tail = log.read(LOG_TAIL_BYTES)
    except OSError:
        return times, details
    for raw in tail.splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(raw)
            if not isinstance(record, dict):
                continue
            qid, event, detail = record.get("qid"), record.get("event"), record.get("detail")
            if qid in closed and event in TERMINAL_EVENTS and isinstance(record.get("at"), str):
                times[qid] = record["at"]
            elif qid in details and isinstance(detail, dict):
                if event == "question_received" and isinstance(detail.get("from"), str):
                    details[qid]["asker"] = detail["from"]
                elif event == "delivery_error" and isinstance(detail.get("error"), str):
                    details[qid].setdefault("error", detail["error"])  # the question's own
    return times, details


def status(config: BridgeConfig, closed_limit: int) -> dict[str, Any]:
    """The `status --json` object: open questions oldest first, closed ones and the
    deliveries failed within the hour (X11) newest first."""
    snapshot = _snapshot(config, closed_limit)
    now = time.time()
    times, details = _from_log(config.log_path, {qid for qid, _ in snapshot.closed},
                               {row.qid for row in snapshot.failed})
    bridge = running_bridge(config)
    return {
        "project": config.project,
        "state_path": str(config.state_path),
        "bridge": None if bridge is None else {key: getattr(bridge, key) for key in BRIDGE_KEYS},
        "open": [{
            "qid": spec.qid,
            "asker": spec.prompt.sender_name,
            "state": spec.state or "new",
            "age_s": round(max(0.0, now - (spec.deadline - spec.timeout_ms / 1000)), 3),
            "time_left_s": round(max(0.0, spec.deadline - now), 3),
            "question": first_line(spec.parsed.question),
            "options": [option.title for option in spec.parsed.options],
        } for spec in snapshot.open],
        "closed": [{"qid": qid, "state": state, "closed_at": times.get(qid)}
                   for qid, state in snapshot.closed],
        "failed": [_failure(row, details[row.qid]) for row in snapshot.failed],
    }


def _failure(row: Failed, logged: dict[str, Any]) -> dict[str, Any]:
    error = logged.get("error")
    code, said = delivery_failure(error) if error is not None else (None, None)
    return {"qid": row.qid, "at": iso(datetime.fromtimestamp(row.at, UTC)),
            "asker": logged.get("asker"), "exit_status": code, "error": said}


def projects(config: BridgeConfig, now: datetime | None = None) -> list[str]:
    """Every project with a state file here or a live bridge in the registry, sorted."""
    found = set(_named_projects(config))
    moment = now or utc_now()
    try:
        registered = sorted((config.coms_dir / "projects").iterdir())
    except OSError:
        registered = []
    for directory in registered:
        if _live_bridges(directory / "agents", moment):
            found.add(directory.name)
    return sorted(found)


def project_of(config: BridgeConfig, qid: str) -> str:
    """The project whose bridge has `qid` open (a qid is unique), or OpsError saying why."""
    closed: list[tuple[str, str]] = []
    unread: list[str] = []
    for project, path in _named_projects(config).items():
        try:
            known = knows_qid(path, qid, time.time())
        except OSError as exc:  # one unreadable file must not hide the others' questions
            unread.append(str(exc))
            continue
        if known == "open":
            return project
        if known is not None and known != "undelivered":
            closed.append((project, known))
    if closed:
        project, state = closed[0]
        raise OpsError(f"question {qid} is already closed ({state}) in project {project}")
    also = f"; could not read: {'; '.join(unread)}" if unread else ""
    raise OpsError(
        f"no open question {qid} in any project (state files in {config.state_path.parent})"
        + also
    )


def _named_projects(config: BridgeConfig) -> dict[str, Path]:
    """The state files whose names are projects (W2)."""
    found: dict[str, Path] = {}
    for project, path in state_files(config.state_path.parent).items():
        try:
            validate_project(project)
        except IdentityError:
            continue
        found[project] = path
    return found


def find_open(config: BridgeConfig, qid: str) -> QuestionSpec:
    """The open question `qid`, or OpsError saying why there is none."""
    snapshot = _snapshot(config)
    for spec in snapshot.open:
        if spec.qid == qid:
            return spec
    for closed, state in snapshot.closed:
        if closed == qid:
            raise OpsError(f"question {qid} is already closed ({state})")
    raise OpsError(
        f"no open question {qid} in project {config.project} (state file {config.state_path})"
    )


@dataclass(frozen=True)
class Written:
    path: Path
    mapped: MappedAnswer
    bridge: RegistryEntry | None


def answer(config: BridgeConfig, qid: str, text: str, answered_by: str) -> Written:
    """`<qid>.answer.json` as the gateway writes it (C7, C8), atomically (C10), for an open
    question; one already waiting is left alone: the first answer wins."""
    spec = find_open(config, qid)
    if not text.strip():
        raise OpsError("the answer is empty")
    if len(text) > MAX_ANSWER_CHARS:
        raise OpsError(f"the answer is longer than {MAX_ANSWER_CHARS} characters")
    if not answered_by.strip():
        raise OpsError("--by must not be empty")
    for what, value in (("the answer", text), ("--by", answered_by)):
        if has_lone_surrogate(value):  # argv bytes that are not UTF-8 (X12)
            raise OpsError(f"{what} is not valid Unicode (not UTF-8?)")
    body = AnswerFile(qid=qid, answer=text, answered_by=answered_by, at=iso(utc_now()))
    directory = config.questions_dir
    target = directory / answer_name(qid)
    try:
        private_dir(directory, tighten=False)
        write_atomic(target, body.to_json().encode("utf-8"), replace=False)
    except FileExistsError:
        raise OpsError(f"an answer file for {qid} is already waiting: {target}") from None
    except OSError as exc:
        raise OpsError(f"cannot write the answer file in {directory}: {exc}") from exc
    return Written(target, map_answer(text, spec.parsed.options), running_bridge(config))


def cancel(config: BridgeConfig, qid: str) -> RegistryEntry:
    """X15: in the asker's name, as only it may cancel (X2), marked `"by": "operator"` so
    the asker is told; returns once the question has closed."""
    spec = find_open(config, qid)
    asker = spec.prompt.sender_name
    if not asker:
        raise OpsError(f"question {qid} names no asker, so it cannot be cancelled as its asker")
    bridge = running_bridge(config)
    if bridge is None:
        raise OpsError(f"no running bridge is registered for project {config.project}")
    envelope = CancelEnvelope(
        msg_id=str(ULID()),
        from_=asker,
        to=bridge.name,
        created_at=iso(utc_now()),
        ref_msg_id=qid,
    )
    line = fit_line({**envelope.json_body(), "by": OPERATOR}).encode("utf-8")
    reason, _ = send_envelope(bridge.endpoint, line, CANCEL_TIMEOUT_S)
    if reason is not None:
        raise OpsError(f"the bridge at {bridge.endpoint} did not take the cancel: {reason}")
    deadline = time.monotonic() + CANCEL_TIMEOUT_S
    while any(s.qid == qid for s in _snapshot(config, 0).open):
        if time.monotonic() > deadline:
            raise OpsError(f"the bridge acked the cancel, but {qid} is still open")
        time.sleep(0.05)
    state = dict(_snapshot(config).closed).get(qid)
    if state not in (None, "cancelled"):  # an answer or the timeout came first
        raise OpsError(f"{qid} closed as {state} before the cancel reached it")
    return bridge
