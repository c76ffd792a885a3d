"""Private directories whatever the umask, and never a chmod of what is not ours."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from coms_hermes_bridge.actors import files
from coms_hermes_bridge.actors.files import bridge_dir, private_dir, write_atomic
from tests.fakes import in_forked_child


def mode(path: Path) -> int:
    return os.lstat(path).st_mode & 0o777


@pytest.mark.parametrize("umask", [0o000, 0o277])  # 0o277: mkdir alone would give 0500
def test_missing_directories_are_made_0700_whatever_the_umask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, umask: int
) -> None:
    made: list[int] = []  # each directory's mode the moment it exists: never open to others
    real_mkdir = os.mkdir

    def watched(path: Path, *args: int) -> None:
        real_mkdir(path, *args)
        made.append(mode(path))

    monkeypatch.setattr(files.os, "mkdir", watched)
    old = os.umask(umask)
    try:
        private_dir(tmp_path / "a" / "b")
    finally:
        os.umask(old)
        monkeypatch.undo()
    assert (mode(tmp_path / "a"), mode(tmp_path / "a" / "b")) == (0o700, 0o700)
    assert len(made) == 2 and not any(m & 0o077 for m in made)


def test_a_looser_directory_is_tightened_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "q"
    target.mkdir()
    target.chmod(0o775)
    assert private_dir(target) is False  # there already: not made by this call
    assert mode(target) == 0o700
    assert capsys.readouterr().err == f"coms-hermes-bridge: {target} was mode 0775; tightened to 0700\n"
    private_dir(target)  # already private: nothing more to say
    assert capsys.readouterr().err == ""
    assert private_dir(tmp_path / "new") is True  # made here: the caller may say 0700
    link = tmp_path / "link"
    link.symlink_to(target)
    assert private_dir(link) is False  # an operator's link: found, not made


def test_an_existing_parent_is_left_alone(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    private_dir(tmp_path / "q")
    assert mode(tmp_path) == 0o755


def test_something_else_in_its_place_is_refused_and_not_touched(tmp_path: Path) -> None:
    target = tmp_path / "q"
    target.write_bytes(b"")
    target.chmod(0o644)
    with pytest.raises(NotADirectoryError, match="is not a directory"):
        private_dir(target)
    assert mode(target) == 0o644


def test_a_link_to_a_directory_is_not_chmodded_through(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    real.chmod(0o755)
    (tmp_path / "q").symlink_to(real)
    private_dir(tmp_path / "q")
    assert mode(real) == 0o755


def test_a_parent_made_meanwhile_by_another_is_left_to_it_and_the_rest_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another bridge making the same directories at the same moment: the one it made is
    found, not failed on, and left as it made it; ours below it are still made 0700."""
    real_mkdir = os.mkdir

    def another_first(path: Path, mode: int = 0o777) -> None:
        if path == tmp_path / "a":
            real_mkdir(path, 0o755)  # the other process wins the race for this one
        real_mkdir(path, mode)

    monkeypatch.setattr(files.os, "mkdir", another_first)
    private_dir(tmp_path / "a" / "b" / "c")
    monkeypatch.undo()
    assert [mode(tmp_path / p) for p in ("a", "a/b", "a/b/c")] == [0o755, 0o700, 0o700]


def test_a_directory_swapped_for_a_link_meanwhile_is_not_chmodded_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The very directory is judged: one replaced by a link to elsewhere after it was
    checked is refused, and the link's target keeps its mode."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    elsewhere.chmod(0o755)
    target = tmp_path / "q"
    target.mkdir()
    target.chmod(0o755)
    real_islink = os.path.islink

    def then_swapped(path: str | Path) -> bool:
        found = real_islink(path)
        if Path(path) == target:
            target.rmdir()
            target.symlink_to(elsewhere)
        return found

    monkeypatch.setattr(files.os.path, "islink", then_swapped)
    with pytest.raises(NotADirectoryError, match="is not a directory"):
        private_dir(target)
    monkeypatch.undo()
    assert mode(elsewhere) == 0o755


def test_only_the_bridges_own_directory_is_tightened(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Log and state live in `…/hermes-bridge`, the bridge's own; a `--questions-dir` the
    operator chose may be shared, and keeps its mode."""
    own, chosen = tmp_path / "hermes-bridge", tmp_path / "questions"
    for directory in (own, chosen):
        directory.mkdir()
        directory.chmod(0o755)
        bridge_dir(directory)
    assert (mode(own), mode(chosen)) == (0o700, 0o755)
    assert capsys.readouterr().err == f"coms-hermes-bridge: {own} was mode 0755; tightened to 0700\n"


def test_a_terminal_planted_where_a_file_is_read_never_becomes_the_readers(tmp_path: Path) -> None:
    """A daemon is a session leader without a terminal (so under systemd): a terminal read
    by mistake for a file must not become its controlling terminal, whose hangup would
    then end it. A forked session leader reads one and says whether it now has a terminal."""
    leader, follower = os.openpty()
    terminal = Path(os.ttyname(follower))
    os.close(follower)
    # here too, unchanged by it (no session leader): a mutation run sees only the calls a
    # test makes in its own process, and would not know this test reaches read_regular
    assert files.read_regular(tmp_path / "none", 100) is None

    def lead_a_session_and_read() -> tuple[bytes | None, str]:
        os.setsid()
        got = files.read_regular(terminal, 100)
        try:
            os.close(os.open("/dev/tty", os.O_RDONLY))
        except OSError:
            return got, "no terminal"
        return got, "a terminal"

    said = in_forked_child(lead_a_session_and_read)
    os.close(leader)
    assert said == repr((None, "no terminal"))


def test_a_write_never_goes_through_whatever_holds_its_temporary_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The temporary file is always a new one: a link planted at its name (were the name
    guessed) fails the write instead of carrying the data to the link's target."""
    monkeypatch.setattr(files, "ULID", lambda: "GUESSED")
    victim = tmp_path / "victim"
    victim.write_bytes(b"kept")
    (tmp_path / f".a.json.{os.getpid()}.GUESSED.tmp").symlink_to(victim)
    with pytest.raises(FileExistsError):
        write_atomic(tmp_path / "a.json", b"data")
    assert victim.read_bytes() == b"kept"
    assert not (tmp_path / "a.json").exists()


@pytest.mark.parametrize("hard_links", [True, False])
def test_a_write_that_must_not_replace_keeps_the_file_there(  # C8
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hard_links: bool,
) -> None:
    """The operator's answer never replaces the gateway's, even one written a moment
    before: the file appears whole or not at all, and no temporary name is left behind,
    on a filesystem without hard links too."""
    if not hard_links:
        def no_links(src: object, dst: object, **kwargs: object) -> None:
            raise OSError(errno.EPERM, "Operation not permitted")
        monkeypatch.setattr(files.os, "link", no_links)
    target = tmp_path / "a.json"
    write_atomic(target, b"first", replace=False)
    assert target.read_bytes() == b"first"
    with pytest.raises(FileExistsError) as refused:
        write_atomic(target, b"second", replace=False)
    assert (refused.value.errno, refused.value.strerror) == (errno.EEXIST, "File exists")
    assert str(target) in (refused.value.filename, refused.value.filename2)
    assert target.read_bytes() == b"first"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]
    assert target.stat().st_mode & 0o777 == 0o600
    write_atomic(target, b"third")  # by default it replaces
    assert target.read_bytes() == b"third"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


@pytest.mark.parametrize("hard_links", [True, False])
def test_a_file_already_gone_is_an_error_never_a_name_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hard_links: bool,
) -> None:
    """A caller that lost its file to another process (a bridge sharing the directory)
    must not take the name's file for a newer one: the two mean different things."""
    if not hard_links:
        def no_links(src: object, dst: object, **kwargs: object) -> None:
            raise OSError(errno.EPERM, "Operation not permitted")
        monkeypatch.setattr(files.os, "link", no_links)
    there = tmp_path / "b"
    there.write_bytes(b"there")
    with pytest.raises(FileNotFoundError):
        files.link_new(tmp_path / "a", there)
    assert there.read_bytes() == b"there"
    assert [p.name for p in tmp_path.iterdir()] == ["b"]
    (tmp_path / "a").write_bytes(b"new")
    assert files.link_new(tmp_path / "a", tmp_path / "c") is True
    assert (tmp_path / "c").read_bytes() == b"new"

def test_a_temp_file_that_cannot_be_removed_changes_no_outcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Removing the temporary name is tidying: a write that succeeded still succeeds,
    and one that failed raises its own error, not the tidying's."""
    def stuck(self: Path, missing_ok: bool = False) -> None:
        raise OSError(errno.EBUSY, "Device or resource busy")

    monkeypatch.setattr(Path, "unlink", stuck)
    target = tmp_path / "a.json"
    write_atomic(target, b"first", replace=False)
    assert target.read_bytes() == b"first"

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(files.os, "fsync", failing)
    with pytest.raises(OSError) as failed:
        write_atomic(tmp_path / "b.json", b"second")
    assert failed.value.errno == errno.EIO


def test_a_file_that_cannot_be_tightened_fails_its_open_and_keeps_no_fd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # files are private whatever the umask: one we cannot make so is not used
    path = tmp_path / "state"
    path.write_text("")
    path.chmod(0o644)

    def refused(fd: int, mode: int) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(files.os, "fchmod", refused)
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(PermissionError):
        files.open_private(path, os.O_RDWR)
    assert set(os.listdir("/proc/self/fd")) == before
