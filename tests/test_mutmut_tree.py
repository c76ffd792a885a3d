"""scripts/mutmut_tree.py: mutmut on the checkout, with setup.cfg's package_dir.

A wrong name here does not fail loudly: every mutant would be keyed apart from the
module its trampoline reports, or would load unmutated from the checkout, and a run
would count survivors that no test ever met.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.fakes import script, wait_for

ROOT = Path(__file__).resolve().parent.parent


def launcher() -> ModuleType:
    return script("mutmut_tree")


def test_the_mapping_is_setup_cfgs_package_dir() -> None:
    assert launcher().package_dirs(ROOT / "setup.cfg") == {
        "coms_hermes_bridge": "coms_hermes_bridge",
        "coms_hermes_bridge.actors": "actors",
        "coms_hermes_bridge.messages": "messages",
    }


def test_a_mutant_is_keyed_by_the_name_its_module_is_imported_as() -> None:
    name = launcher().mutant_name
    assert name(Path("actors/questions.py"), "x_f__mutmut_1") == "coms_hermes_bridge.actors.questions.x_f__mutmut_1"
    assert name(Path("messages/wire.py"), "x_g__mutmut_2") == "coms_hermes_bridge.messages.wire.x_g__mutmut_2"
    assert name(Path("coms_hermes_bridge/ops.py"), "x_h__mutmut_3") == "coms_hermes_bridge.ops.x_h__mutmut_3"
    # a package's own module is the package (as mutmut names it)
    assert name(Path("actors/__init__.py"), "x_i__mutmut_4") == "coms_hermes_bridge.actors.x_i__mutmut_4"
    # a folder outside package_dir keeps mutmut's own naming
    assert name(Path("other/thing.py"), "x_j__mutmut_5") == "other.thing.x_j__mutmut_5"


def test_the_mapped_packages_load_from_the_mutants_copy(tmp_path: Path) -> None:
    for folder in ("coms_hermes_bridge", "actors", "messages"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "actors" / "probe.py").write_text("WHERE = 'mutants'\n")
    script = (
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT / 'scripts')!r})\n"
        "import mutmut_tree\n"
        f"sys.meta_path.insert(0, mutmut_tree.MutantsFinder(__import__('pathlib').Path({str(tmp_path)!r})))\n"
        "import coms_hermes_bridge.actors.probe as p, coms_hermes_bridge.messages as m\n"
        "print(p.WHERE, p.__file__, m.__file__)\n"
        f"print(mutmut_tree.MutantsFinder(__import__('pathlib').Path({str(tmp_path)!r})).find_spec('json', None))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=True
    )
    assert done.stdout.splitlines() == [
        f"mutants {tmp_path / 'actors' / 'probe.py'} {tmp_path / 'messages' / '__init__.py'}",
        "None",
    ]


def test_the_wait_for_a_mutant_goes_past_a_child_that_is_not_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    results = iter([KeyError(4452), KeyError(4453), "mutant result"])

    def wait_for_result(runner: object, timeout: float | None = None) -> object:
        result = next(results)
        if isinstance(result, Exception):
            raise result
        return (runner, timeout, result)

    wait = launcher().reaping(wait_for_result)
    assert wait("runner", 5.0) == ("runner", 5.0, "mutant result")
    assert capsys.readouterr().err == (
        "mutmut_tree: reaped pid 4452, not a mutant\nmutmut_tree: reaped pid 4453, not a mutant\n"
    )


def test_a_fork_of_a_process_that_ran_tests_gets_shared_services_of_its_own() -> None:
    # mutmut runs each mutant in a fork of the process that ran every test first: a fork
    # that kept the parent's loop or response sender (threads it does not have)
    # would hang each test that sends a response, and every mutant would count as killed
    from coms_hermes_bridge.actors import loop as runtime
    from coms_hermes_bridge.actors.responses import shared_responses

    pool, edge = shared_responses(), runtime.shared_edge()
    assert edge.spawn(asyncio.sleep(0, "ran")).result(5) == "ran"
    pid = os.fork()
    if pid == 0:  # the child: says what it found by its exit code, and nothing else
        code = 1
        try:
            fresh = runtime.shared_edge()
            if fresh is not edge:
                code = 2
                child_pool = shared_responses()
                if child_pool is not pool and child_pool.edge is fresh:
                    code = 3
                    if fresh.spawn(asyncio.sleep(0, "ran")).result(5) == "ran":
                        code = 0
        finally:
            os._exit(code)
    reaped: list[int] = []  # a fork of a threaded process can deadlock: bounded, and killed

    def child_done() -> bool:
        done, status = os.waitpid(pid, os.WNOHANG)
        reaped.extend([status] if done else [])
        return bool(done)

    try:
        wait_for(child_done, timeout=10, what="the forked child")
    finally:
        if not reaped:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(reaped[0]) == 0
