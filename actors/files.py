"""Private places on disk, whatever the umask: the conversation is the user's, and an
answer file another user could write is a forged answer. Everything the bridge owns is
made 0700/0600 here; looser modes found are tightened with one stderr line."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from ulid import ULID

from .loop import report

DIR_MODE = 0o700
FILE_MODE = 0o600
BRIDGE_DIR_NAME = "hermes-bridge"


def read_at_most(fd: int, limit: int) -> bytes | None:
    """Up to `limit` bytes from `fd`; None if there are more (the file grew past it)."""
    chunks: list[bytes] = []
    got = 0
    while got <= limit:
        chunk = os.read(fd, limit + 1 - got)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        got += len(chunk)
    return None


def private_dir(path: Path, *, tighten: bool = True) -> bool:
    """Make `path` and missing parents 0700; tighten `path` if looser (existing parents may
    be shared, and stay). NotADirectoryError when something else is in its place. True
    when this call made `path` (not another process meanwhile)."""
    missing: list[Path] = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    made = False
    for directory in reversed(missing):
        try:
            os.mkdir(directory, DIR_MODE)
        except FileExistsError:
            continue  # made meanwhile by someone else; judged below if it is ours
        if directory == path:
            made = True  # its mode is set below, through the very directory
        else:
            os.chmod(directory, DIR_MODE)  # mkdir's mode passed through the umask
    if os.path.islink(path):
        return made  # an operator's link to a directory elsewhere: never chmod through it
    try:
        # the very directory is judged and tightened, whatever is swapped in meanwhile
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except NotADirectoryError:
        raise NotADirectoryError(f"{path} is not a directory") from None
    try:
        if made:
            os.fchmod(fd, DIR_MODE)  # mkdir's mode passed through the umask
        current = stat.S_IMODE(os.fstat(fd).st_mode)
        if tighten and current & ~DIR_MODE & 0o777:
            os.fchmod(fd, current & DIR_MODE)
            report(f"{path} was mode {current:04o}; tightened to {current & DIR_MODE:04o}")
    finally:
        os.close(fd)
    return made


def tighten_mode(path: Path, mode: int) -> None:
    """Drop group/other bits beyond `mode` from an existing path, saying so once."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        return  # never chmod through a link someone else may have planted
    current = stat.S_IMODE(st.st_mode)
    if current & ~mode & 0o777:
        os.chmod(path, current & mode)
        report(f"{path} was mode {current:04o}; tightened to {current & mode:04o}")


def open_private(path: Path, flags: int) -> int:
    """os.open a file of ours: created 0600 (a umask only removes bits), and an
    existing one found looser is tightened with one stderr line. Returns the fd."""
    fd = os.open(path, flags | os.O_CLOEXEC, FILE_MODE)
    try:
        current = stat.S_IMODE(os.fstat(fd).st_mode)
        if current & 0o077:
            os.fchmod(fd, current & FILE_MODE)
            report(f"{path} was mode {current:04o}; tightened to {current & FILE_MODE:04o}")
    except OSError:
        os.close(fd)
        raise
    return fd


def bridge_dir(path: Path) -> None:
    """The log's and state's directory, made 0700; tightened only when it is the bridge's
    own (`…/hermes-bridge`), not one `--questions-dir` chose, which may be shared."""
    private_dir(path, tighten=path.name == BRIDGE_DIR_NAME)


def read_regular(path: Path, limit: int) -> bytes | None:
    """A regular file's bytes; None when it is anything else, cannot be opened, or holds
    more than `limit` bytes. A FIFO or device planted there never stalls the reader."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        return read_at_most(fd, limit) if stat.S_ISREG(st.st_mode) and st.st_size <= limit \
            else None
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int = FILE_MODE, *, replace: bool = True) -> None:
    """Readers never see half a file (W5, C8): a fsynced temp file, renamed over `path`.
    `replace=False`: a file already there stays, and FileExistsError says so."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{ULID()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if replace:
            os.replace(tmp, path)
            return
        if not link_new(tmp, path):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path))
    except BaseException:  # the file's edge: no temporary file is left, whatever stopped it
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    with contextlib.suppress(OSError):  # the file is in place under its own name
        tmp.unlink()


def link_new(src: str | Path, dst: str | Path) -> bool:
    """Give `src`'s file the name `dst` unless one is there; True if it now has it. A hard
    link never replaces (a rename would); without links, a check then a rename. The
    caller removes `src`."""
    try:
        os.link(src, dst)
    except FileExistsError:
        return False
    except FileNotFoundError:  # no `src` (or no directory for `dst`): never "taken"
        raise
    except OSError:  # a filesystem without hard links
        os.lstat(src)  # FileNotFoundError too, as a link would say
        if os.path.lexists(dst):
            return False
        os.rename(src, dst)
    return True
