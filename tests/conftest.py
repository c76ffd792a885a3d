"""Fixtures every test module shares."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pykka
import pytest


@pytest.fixture(autouse=True)
def _stop_actors() -> Iterator[None]:
    """No actor outlives its test: leftover threads would leak into the next one."""
    yield
    pykka.ActorRegistry.stop_all()


@pytest.fixture
def coms_dir() -> Iterator[Path]:
    """A short temporary directory: AF_UNIX paths stop at 108 bytes and tmp_path is long."""
    path = Path(tempfile.mkdtemp(prefix="ch", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
