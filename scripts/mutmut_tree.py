"""Run mutmut 3 on the checkout as it is, with setup.cfg's package_dir taught to it.

mutmut copies the source folders to `mutants/`, mutates the copies and names
each mutant after its file's path (`actors/peer.py` -> `actors.peer.…`). Two
things it cannot know: that `actors/` and `messages/` are imported as
`coms_hermes_bridge.actors` and `coms_hermes_bridge.messages` (the trampoline
in each mutant records the module's import name, so the path-derived keys would
never match), and that those names must then load from `mutants/`, not from the
checkout the editable install points at. This launcher gives it both, read from
setup.cfg's `package_dir`, and otherwise is `mutmut` itself: every process it
forks inherits the two.

Usage: python scripts/mutmut_tree.py MODULE.py [...] -- MUTMUT_ARGS (see scripts/mutate)
"""

from __future__ import annotations

import configparser
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def package_dirs(setup_cfg: Path) -> dict[str, str]:
    """setup.cfg's `package_dir`: import name -> folder, as setuptools installs it."""
    parser = configparser.ConfigParser()
    parser.read(setup_cfg, encoding="utf-8")
    mapping: dict[str, str] = {}
    for line in parser.get("options", "package_dir").splitlines():
        name, sep, folder = line.partition("=")
        if sep:
            mapping[name.strip()] = folder.strip()
    return mapping


PACKAGES = package_dirs(ROOT / "setup.cfg")
PACKAGE_OF_FOLDER = {folder: name for name, folder in PACKAGES.items()}


def import_name(relative_path: Path) -> str:
    """The module a file under the checkout is imported as (`actors/x.py` -> `….actors.x`)."""
    folder, *rest = relative_path.with_suffix("").parts
    return ".".join((PACKAGE_OF_FOLDER.get(folder, folder), *rest))


def mutant_name(relative_source_path: Path, mutant_method_name: str) -> str:
    """mutmut's key for a mutant, with the module named as the tests import it."""
    return f"{import_name(relative_source_path)}.{mutant_method_name}".replace(".__init__.", ".")


class MutantsFinder(importlib.abc.MetaPathFinder):
    """Load the mapped packages from `mutants/`, ahead of the editable install's finder."""

    def __init__(self, mutants: Path) -> None:
        self.mutants = mutants

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        folder = PACKAGES.get(fullname)
        if folder is None:
            return None  # a submodule: found through the package's __path__ below
        where = self.mutants / folder
        return importlib.util.spec_from_file_location(
            fullname, where / "__init__.py", submodule_search_locations=[str(where)]
        )


def reaping(wait_for_result: Callable[..., Any]) -> Callable[..., Any]:
    """mutmut's wait for a mutant, past the exit of a child the tests left behind.

    The tests run in mutmut's own process before the mutants are forked from it, and
    a test's `hermes` or helper process can end after its test did. mutmut reaps any
    child (`os.wait()`) and takes it for a mutant worker, failing on its pid; that
    child is already gone, so its pid is said and the wait goes on for the next.
    """

    def wait(runner: Any, timeout: float | None = None) -> Any:
        while True:
            try:
                return wait_for_result(runner, timeout)
            except KeyError as stray:
                print(f"mutmut_tree: reaped pid {stray.args[0]}, not a mutant", file=sys.stderr)

    return wait


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print(__doc__, file=sys.stderr)
        return 2
    split = argv.index("--")
    modules, tests, mutmut_args = argv[:split], [], argv[split + 1 :]
    if "--tests" in modules:
        at = modules.index("--tests")
        modules, tests = modules[:at], modules[at + 1 :]
    unknown = [m for m in modules if not (ROOT / m).is_file()]
    if unknown:
        print(f"mutmut_tree: no such module: {', '.join(unknown)}", file=sys.stderr)
        return 2
    # The folders to copy and mutate: pyproject.toml's [tool.mutmut], which must name the
    # package's folders (a test's daemon process inside mutmut's copy reads it there too).
    import mutmut.configuration

    if sorted(mutmut.configuration.config().source_paths) != sorted(map(Path, PACKAGES.values())):
        print("mutmut_tree: [tool.mutmut] source_paths must be setup.cfg's package_dir "
              f"folders: {', '.join(PACKAGES.values())}", file=sys.stderr)
        return 2
    import mutmut.__main__ as mutmut_cli
    import mutmut.mutation.file_mutation as file_mutation
    from mutmut.utils import format_utils
    from mutmut.workers import isolation

    format_utils.get_mutant_name = mutant_name
    file_mutation.get_mutant_name = mutant_name
    mutmut_cli.get_mutant_name = mutant_name
    sys.meta_path.insert(0, MutantsFinder(ROOT / "mutants"))
    isolation.ForkRunner.wait_for_result = reaping(isolation.ForkRunner.wait_for_result)
    settings = mutmut.configuration.config()
    settings.only_mutate = list(modules)
    settings.pytest_add_cli_args_test_selection = list(tests)
    # mutmut's own timeout counts CPU seconds; a mutant that deadlocks spends none, so
    # a wall-clock bound per test (pytest-timeout) ends it as a failure instead.
    settings.pytest_add_cli_args = ["--timeout=60"]
    sys.argv = ["mutmut", *mutmut_args]
    result = mutmut_cli.cli(standalone_mode=False)
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
