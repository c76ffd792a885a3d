"""The coms registry: who we are in the pool, and which names are taken (W1-W3, W5, W9, W10),
as plain functions over paths and clocks (our entry is the PeerActor's)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import socket
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pydantic import ValidationError
from ulid import ULID

from ..messages.contract import iso
from ..messages.wire import RegistryEntry
from .files import open_private, private_dir, read_regular, write_atomic

_PROJECT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")

ENTRY_LIMIT = 1024 * 1024
"""Bytes of a registry entry we read at most: entries are a few hundred bytes, and a
file past this among them is no entry (read no further)."""
HEARTBEAT_MAX_AGE = timedelta(seconds=90)
HEARTBEAT_MAX_SKEW = timedelta(seconds=5)
PROBE_TIMEOUT_S = 0.25


EXIT_ALREADY_RUNNING = 3
"""The daemon's exit status when its project and name already have a bridge (X13): a
service manager must not restart it (the unit's RestartPreventExitStatus=)."""
_HOLDER_READS = 50  # tries at reading the holder's pid, which it writes just after locking


class IdentityError(ValueError):
    """The operator asked for a project or name the pool would refuse (W2)."""


class AlreadyRunning(Exception):
    """Another bridge holds this project and name (X13); `pid` is its pid, if it said."""

    def __init__(self, path: Path, pid: int | None) -> None:
        super().__init__(path, pid)
        self.path = path
        self.pid = pid


@dataclass(frozen=True)
class PeerIdentity:
    """Everything the peer needs to present itself; fixed for one process run."""

    coms_dir: Path
    project: str
    name: str
    session_id: str
    endpoint: Path
    cwd: str
    pid: int
    started_at: str

    @property
    def agents_dir(self) -> Path:
        return agents_dir(self.coms_dir, self.project)

    @property
    def entry_path(self) -> Path:
        return self.agents_dir / f"{self.name}.json"


def agents_dir(coms_dir: Path, project: str) -> Path:
    return coms_dir / "projects" / project / "agents"


def validate_project(project: str) -> None:
    """W2: the project becomes a directory name, so nothing that could escape it."""
    if not _PROJECT.fullmatch(project) or ".." in project:  # the pattern rules out "/" and "."
        raise IdentityError(f'invalid project name: "{project}"')


def validate_name(name: str) -> None:
    """W2: the name becomes a file name and a routing key; "projects" is reserved."""
    if not _NAME.fullmatch(name) or name == "projects":
        raise IdentityError(f'invalid name: "{name}"')


# -- liveness (W9, W10) -------------------------------------------------------


def pid_alive(pid: int) -> bool | None:
    """None when the pid is no usable pid; EPERM is another user's live process."""
    if pid <= 0:  # 0 and negatives would signal process groups, not a process
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OSError, OverflowError):
        return None
    return True


def endpoint_accepts(endpoint: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether something listens on a unix socket path right now (W11's probe)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(timeout)
        try:
            probe.connect(endpoint)  # "" too fails, with EINVAL
        except (OSError, ValueError):
            return False
    return True


def heartbeat_fresh(heartbeat_at: str | None, now: datetime) -> bool:
    """W9: at most 90 s old and not more than 5 s in the future."""
    if not heartbeat_at:
        return False
    try:
        beat = datetime.fromisoformat(heartbeat_at)
    except ValueError:
        return False
    if beat.tzinfo is None:
        beat = beat.replace(tzinfo=UTC)
    age = now.astimezone(UTC) - beat
    return -HEARTBEAT_MAX_SKEW <= age <= HEARTBEAT_MAX_AGE


def is_live(entry: RegistryEntry, now: datetime) -> bool:
    """W9 exactly: a fresh heartbeat, or else a pid that still exists."""
    if heartbeat_fresh(entry.heartbeat_at, now):
        return True
    return bool(pid_alive(entry.pid))


def crashed_holder(entry: RegistryEntry) -> bool:
    """W10: gone however fresh its heartbeat (else a bridge restarted after SIGKILL would
    come back as `user-remote2`); only for the names we are about to claim."""
    return pid_alive(entry.pid) is False and not endpoint_accepts(entry.endpoint)


def read_entry(path: Path) -> RegistryEntry | None:
    """An entry, or None: gone, not a regular file, past ENTRY_LIMIT, or no entry."""
    data = read_regular(path, ENTRY_LIMIT)
    if data is None:
        return None
    try:
        return RegistryEntry.model_validate_json(data)
    except (ValidationError, ValueError):
        return None


def live_names(directory: Path, now: datetime, claiming: str | None = None) -> set[str]:
    """Names held by live entries, pruning dead ones (W9); a crashed holder (W10) of
    `claiming` or a suffixed `claiming2`, ... holds nothing, so we can take its name over."""
    held: set[str] = set()
    try:
        paths = sorted(directory.glob("*.json"))
    except OSError:
        return held
    for path in paths:
        entry = read_entry(path)
        if entry is None:
            continue
        ours = claiming is not None and _is_claim(claiming, path.stem, entry.name)
        if is_live(entry, now) and not (ours and crashed_holder(entry)):
            held.add(entry.name)
            held.add(path.stem)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
    return held


def _is_claim(requested: str, *names: str) -> bool:
    """Whether every name is `requested` or `requested` with W10's numeric suffix."""
    for name in names:
        suffix = name[len(requested):] if name.startswith(requested) else None
        if suffix is None or not (suffix == "" or (suffix.isdigit() and suffix[0] != "0")):
            return False
    return True


def unique_name(requested: str, held: set[str]) -> str:
    """W10: the requested name, else the first free of name2, name3, ..."""
    if requested not in held:
        return requested
    suffix = 2
    while f"{requested}{suffix}" in held:
        suffix += 1
    return f"{requested}{suffix}"


def resolve_identity(
    coms_dir: Path,
    project: str,
    requested_name: str,
    *,
    cwd: str,
    pid: int,
    now: datetime,
) -> PeerIdentity:
    """Make the places (W1-W3) and claim a unique name (W9, W10); project and name are
    validated already (the lock's path is made of them).

    Every directory made here is 0700 whatever the umask; ones that exist already are the
    pool's, shared with its other peers, and left as they are, bar the root itself (W1).
    """
    private_dir(coms_dir, tighten=False)
    with contextlib.suppress(OSError):
        coms_dir.chmod(0o700)
    directory = agents_dir(coms_dir, project)
    private_dir(directory, tighten=False)
    sockets = coms_dir / "sockets"
    private_dir(sockets, tighten=False)
    name = unique_name(requested_name, live_names(directory, now, requested_name))
    session_id = str(ULID())
    return PeerIdentity(
        coms_dir=coms_dir,
        project=project,
        name=name,
        session_id=session_id,
        endpoint=sockets / f"{session_id}.sock",
        cwd=cwd,
        pid=pid,
        started_at=iso(now),
    )


# -- one bridge per project and name (X13) ------------------------------------


def instance_lock_path(coms_dir: Path, project: str, name: str) -> Path:
    """Keyed on what makes a peer (pool, project, name), not on the state file: two
    `--questions-dir` are still one peer. (`@` is in neither project nor name.)"""
    return coms_dir / "hermes-bridge" / "locks" / f"{project}@{name}.lock"


def take_instance_lock(path: Path) -> int:
    """The lock's fd, held for the process's life (flock: a killed bridge's successor takes
    it at once; O_CLOEXEC: no child keeps it), or AlreadyRunning with the holder's pid."""
    private_dir(path.parent)
    fd = open_private(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        try:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            raise AlreadyRunning(path, _holder(fd)) from None
        finally:
            os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        os.close(fd)
        raise
    return fd


def _holder(fd: int) -> int | None:
    """The pid the holder wrote right after taking the lock (empty: read again a moment)."""
    for _ in range(_HOLDER_READS):
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        if text.isdigit():
            return int(text)
        time.sleep(0.01)
    return None


# -- writing our own entry (W5, W6, W8) ---------------------------------------


def write_entry(path: Path, entry: RegistryEntry) -> None:
    """W5: readers must never see half a file, so write aside and rename over."""
    write_atomic(path, entry.to_file_text().encode("utf-8"))


def remove_entry_if_ours(path: Path, session_id: str) -> bool:
    """W8: remove the entry unless another run has since claimed the name."""
    entry = read_entry(path)
    if entry is None or entry.session_id != session_id:
        return False
    try:
        path.unlink()
    except OSError:
        return False
    return True
