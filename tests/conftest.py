"""Fixtures every test module shares."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pykka
import pytest
from hypothesis import HealthCheck, settings

from coms_hermes_bridge.actors import loop, responses


def _forget_shared_services() -> None:
    """A forked test process starts without the parent's shared services.

    Mutation testing (mutmut) runs each mutant in a fork of a process that has
    already run tests; the loop and the response sender it inherits
    would point at threads that do not exist in the fork, and every pooled actor
    would wait forever. (The daemon itself never forks Python: Popen execs.)
    """
    loop._SHARED_LOCK = threading.Lock()
    loop._SHARED_EDGE = None
    responses.shared_responses.cache_clear()


os.register_at_fork(after_in_child=_forget_shared_services)


def _hung_up(signum: int, frame: object) -> None:
    """Nothing hangs the test process up: a SIGHUP here is a liveness probe of our own pid
    that sent a real signal (W9: kill(pid, 0)). Fail the test at hand; never die of it."""
    raise AssertionError("the test process was sent SIGHUP")


signal.signal(signal.SIGHUP, _hung_up)  # a handler, not SIG_IGN: children start with SIG_DFL

STOP_TIMEOUT_S = 10.0  # how long each actor left at a test's end may take to stop

# Property-based tests: a short run in the suite, a long one behind `just fuzz`.
# No deadline per example: they drive real sockets and files on a loaded machine.
_COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("default", max_examples=60, **_COMMON)  # type: ignore[arg-type]
settings.register_profile("long", max_examples=3000, **_COMMON)  # type: ignore[arg-type]
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(autouse=True)
def _stop_actors() -> Iterator[None]:
    """No actor outlives its test: leftover threads would leak into the next one.

    Bounded: an actor that cannot stop (its thread or the edge's loop stuck, as a
    mutant can leave them) fails the test instead of holding the run for ever."""
    yield
    pykka.ActorRegistry.stop_all(timeout=STOP_TIMEOUT_S)


@pytest.fixture
def coms_dir() -> Iterator[Path]:
    """A short temporary directory: AF_UNIX paths stop at 108 bytes and tmp_path is long."""
    path = Path(tempfile.mkdtemp(prefix="ch", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
