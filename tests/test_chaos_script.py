"""scripts/chaos.py, kept from rotting: a short run of it against the real daemon, its
verdict on made-up tallies, and its promise to take its daemon with it however it ends.

The short run does not ask for a clean result: a kill in the middle of `hermes send`
may send a question twice today (docs/operations.md, "What survives what"), and the
script must say so. It asks that the exit status agrees with the printed counts, and
that nothing acked is lost."""

from __future__ import annotations

import importlib.util
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.fakes import SCRIPTS, wait_for

CHAOS = [sys.executable, str(SCRIPTS / "chaos.py")]


def figures(out: str) -> dict[str, int]:
    """Each `name: N ...` line of the report, by name."""
    return {name: int(n) for name, n in re.findall(r"^([a-z ,]+): (\d+)", out, re.M)}


def test_a_short_run_asks_everything_and_its_exit_status_agrees_with_its_counts() -> None:
    run = subprocess.run([*CHAOS, "--questions", "10", "--min-kills", "3", "--seed", "7",
                          "--deadline", "30"], capture_output=True, text=True, timeout=60)
    got = figures(run.stdout)
    assert got["questions acked"] == 10, run.stdout
    assert got["answered"] == 10, run.stdout
    assert got["lost"] == 0, run.stdout
    assert got["never acked nor answered"] == 0, run.stdout
    assert got["wrong or error responses"] == 0, run.stdout
    assert got["kills"] >= 3, run.stdout
    assert re.search(r"^wall time: \d+\.\d s$", run.stdout, re.M), run.stdout
    doubled = got["answers received twice"] + got["questions sent twice"]
    assert run.returncode == (1 if doubled else 0), run.stdout + run.stderr
    assert ("verdict: FAIL" if doubled else "verdict: ok") in run.stdout


@pytest.fixture
def chaos(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The script as a module, in sys.modules while it loads: a dataclass looks its
    module up there to read its string annotations (fakes.script does not put it there)."""
    spec = importlib.util.spec_from_file_location("chaos", SCRIPTS / "chaos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "chaos", module)
    spec.loader.exec_module(module)
    return module


def test_the_verdict_fails_on_a_lost_or_doubled_question_and_names_it(chaos: ModuleType) -> None:
    answer = {"kind": "freeform", "text": "yes"}

    def response(qid: str) -> dict[str, object]:
        return {"type": "response", "msg_id": qid, "response": answer, "error": None}

    clean = chaos.Tally(["A", "B"], acked={"A", "B"}, asked={"A": 1, "B": 1},
                        responses={"A": [response("A")], "B": [response("B")]},
                        expected={"A": "yes", "B": "yes"})
    lines, code = chaos.verdict(clean)
    assert code == 0 and "lost: 0" in lines and "verdict: ok" in lines

    lost = chaos.Tally(["A", "B"], acked={"A", "B"}, asked={"A": 1, "B": 1},
                       responses={"A": [response("A")]}, expected={"A": "yes", "B": "yes"})
    lines, code = chaos.verdict(lost)
    assert code == 1 and "lost: 1 [B]" in lines

    twice = chaos.Tally(["A"], acked={"A"}, asked={"A": 2},
                        responses={"A": [response("A"), response("A")]}, expected={"A": "yes"})
    lines, code = chaos.verdict(twice)
    assert code == 1
    assert "answers received twice: 1 [A×2]" in lines
    assert "questions sent twice: 1 [A×2]" in lines

    wrong = chaos.Tally(["A"], acked={"A"}, asked={"A": 1}, responses={"A": [response("A")]},
                        expected={"A": "no"})
    assert chaos.verdict(wrong)[1] == 1


def test_the_verdict_takes_only_a_later_starts_resend_of_the_same_answer(
    chaos: ModuleType,
) -> None:
    # promise 1: delivery is at least once; the one double it allows is the next start
    # sending again, unchanged, a response whose ack a kill cut off
    def response(session: str, text: str = "yes", error: str | None = None
                 ) -> dict[str, object]:
        return {"type": "response", "msg_id": "A", "sender_session": session,
                "response": {"kind": "freeform", "text": text}, "error": error}

    def judged(*copies: dict[str, object]) -> tuple[list[str], int]:
        return chaos.verdict(chaos.Tally(["A"], acked={"A"}, asked={"A": 1},
                                         responses={"A": list(copies)}, expected={"A": "yes"}))

    again = "answers sent again by the next start, a kill having cut off their ack"
    lines, code = judged(response("run1"), response("run2"), response("run3"))
    assert code == 0 and "verdict: ok" in lines
    assert "answers received twice: 0" in lines and f"{again}: 1 [A×3]" in lines
    for doubled in ((response("run1"), response("run1")),  # twice in one run
                    (response("run1"), response("run2"), response("run2")),
                    (response("run1"), response("run2", error="x")),  # not the same answer
                    (response("run1"), response("run2", text="no"))):
        lines, code = judged(*doubled)
        assert code == 1 and "verdict: FAIL" in lines, doubled
        assert f"answers received twice: 1 [A×{len(doubled)}]" in lines
        assert f"{again}: 0" in lines


def daemons_of(coms: Path) -> list[int]:
    """Live daemons (not zombies) running in the world whose PI_COMS_DIR is `coms`."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if (b"coms_hermes_bridge" in cmdline and f"PI_COMS_DIR={coms}".encode() in environ
                and state != "Z"):
            pids.append(int(proc.name))
    return pids


def first_world(parent: int) -> Path:
    """The scratch directory of the script's first daemon, read from its environment."""

    def found() -> Path | None:
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and int((proc / "stat").read_text()
                                               .rsplit(")", 1)[1].split()[1]) == parent:
                    for item in (proc / "environ").read_bytes().split(b"\0"):
                        if item.startswith(b"PI_COMS_DIR="):
                            return Path(item.split(b"=", 1)[1].decode()).parent
            except (OSError, ValueError):
                continue
        return None

    return wait_for(found, 15, "the script's first daemon")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL],
                         ids=["SIGINT", "SIGTERM", "SIGKILL"])
def test_the_daemon_never_outlives_the_script(sig: signal.Signals) -> None:
    proc = subprocess.Popen([*CHAOS, "--questions", "50", "--seed", "3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base: Path | None = None
    try:
        base = first_world(proc.pid)
        wait_for(lambda: daemons_of(base / "c"), 15, "a daemon of the script running")
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
        if sig != signal.SIGKILL:
            assert proc.returncode == 130, out + err
            assert "interrupted" in out and "questions acked: " in out
        wait_for(lambda: not daemons_of(base / "c"), 5, "the daemon's end")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if base is not None:  # the script's to remove, but a SIGKILLed one cannot
            shutil.rmtree(base, ignore_errors=True)
