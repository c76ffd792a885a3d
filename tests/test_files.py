"""Private directories whatever the umask, and never a chmod of what is not ours."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from coms_hermes_bridge.actors import files
from coms_hermes_bridge.actors.files import private_dir, write_atomic


def mode(path: Path) -> int:
    return os.lstat(path).st_mode & 0o777


def test_missing_directories_are_made_0700_under_umask_000(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        private_dir(tmp_path / "a" / "b")
    finally:
        os.umask(old)
    assert (mode(tmp_path / "a"), mode(tmp_path / "a" / "b")) == (0o700, 0o700)


def test_a_looser_directory_is_tightened_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "q"
    target.mkdir()
    target.chmod(0o775)
    private_dir(target)
    assert mode(target) == 0o700
    assert capsys.readouterr().err == f"coms-hermes-bridge: {target} was mode 0775; tightened to 0700\n"
    private_dir(target)  # already private: nothing more to say
    assert capsys.readouterr().err == ""


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
