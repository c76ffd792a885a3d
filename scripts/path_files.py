#!/usr/bin/env python3
"""Which source files one answered question runs through, and how big the source is.

Starts the whole actor tree in this process (tests/tree_rig.py: a fake hermes, a real
asker, real sockets and inotify), lets it settle, then records every Python function
call, in every thread, from the moment the prompt is written until the asker has its
response and the log has its `answered` line. A file counts when code of it ran in
that window; a file whose names are only used (a dataclass built, a constant read)
does not. Then it counts the lines of `actors/`, `messages/` and `coms_hermes_bridge/`
as they are (blank lines, comments and docstrings included: `wc -l`).

Usage: .venv/bin/python scripts/path_files.py
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SOURCE = ("actors", "messages", "coms_hermes_bridge")

from coms_hermes_bridge import actors as _actors  # noqa: E402
from tests.fakes import wait_for  # noqa: E402
from tests.tree_rig import running_tree  # noqa: E402

PACKAGE = Path(_actors.__file__).resolve().parent.parent
recording = False
seen: dict[str, int] = {}


def _profile(frame: FrameType, event: str, arg: Any) -> None:
    if recording and event == "call":
        name = frame.f_code.co_filename
        seen[name] = seen.get(name, 0) + 1


def _ours(filename: str) -> str | None:
    path = Path(filename).resolve()
    for top in SOURCE:
        for base in (ROOT / top, PACKAGE / top):
            if path.is_relative_to(base):
                return f"{top}/{path.relative_to(base)}"
    return None


def logged(tree: Any, qid: str, event: str) -> None:
    wait_for(lambda: any(r["qid"] == qid and r["event"] == event for r in tree.log_records()),
             what=f"{event} logged")


def path_files() -> dict[str, int]:
    """Files of ours that ran while one question was asked, delivered and answered."""
    global recording
    threading.setprofile(_profile)
    sys.setprofile(_profile)
    try:
        with running_tree() as tree:
            # the first question pays for imports and first starts
            logged(tree, tree.ask("warm-up"), "delivered")
            recording = True
            qid = tree.ask("Ship it?")
            logged(tree, qid, "delivered")
            tree.answer(qid, "yes")
            tree.asker.response_for(qid)
            logged(tree, qid, "answered")
            recording = False
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    files: dict[str, int] = {}
    for filename, calls in seen.items():
        ours = _ours(filename)
        if ours is not None:
            files[ours] = files.get(ours, 0) + calls
    return files


def source_lines() -> dict[str, int]:
    return {str(p.relative_to(ROOT)): len(p.read_text().splitlines())
            for top in SOURCE for p in sorted((ROOT / top).glob("*.py"))}


def main() -> int:
    files = path_files()
    print(f"one answered question runs code in {len(files)} files:")
    for name, calls in sorted(files.items()):
        print(f"  {name:40s} {calls:6d} calls")
    lines = source_lines()
    print(f"source: {sum(lines.values())} lines in {len(lines)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
