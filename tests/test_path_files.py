"""The goal that one answered question runs code in 11 source files (docs/architecture.md,
"The path of one question"), kept by a test: a helper moved onto the path, or a new hop,
shows here and not only when someone thinks to run the script. The script runs in a
process of its own: a profiler reaches only threads started after it is set, and this
process's shared threads may have started in an earlier test."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.fakes import SCRIPTS

# actors/sends.py (and the private files it writes with actors/files.py): the question's
# send runs under a waiter whose outcome a restart finds, so it is never sent twice
PATH = {"actors/files.py", "actors/delivery.py", "actors/watcher.py", "actors/logger.py", "actors/peer.py",
        "actors/listener.py", "actors/responses.py",
        "actors/questions.py", "actors/loop.py", "actors/turns.py", "actors/supervision.py", "actors/sends.py", "actors/store.py",
        "messages/contract.py", "messages/wire.py",
        # the marker grammar, defined once beside the liaison plugin that reads it back
        "coms_hermes_bridge/liaison/markers.py"}


def test_one_answered_question_runs_code_in_these_files() -> None:
    run = subprocess.run([sys.executable, str(SCRIPTS / "path_files.py")],
                         capture_output=True, text=True, timeout=120, check=True)
    assert set(re.findall(r"^  (\S+\.py) +\d+ calls$", run.stdout, re.M)) == PATH, run.stdout
    assert f"runs code in {len(PATH)} files:" in run.stdout
