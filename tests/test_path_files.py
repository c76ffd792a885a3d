"""The goal that one answered question runs code in 8 source files (docs/architecture.md,
"The path of one question"), kept by a test: a helper moved onto the path, or a new hop,
shows here and not only when someone thinks to run the script."""

from __future__ import annotations

from tests.fakes import script

PATH = {"actors/hermes.py", "actors/logger.py", "actors/peer.py", "actors/questions.py",
        "actors/runtime.py", "actors/store.py", "messages/contract.py", "messages/wire.py"}


def test_one_answered_question_runs_code_in_these_eight_files() -> None:
    files = script("path_files").path_files()
    assert set(files) == PATH
