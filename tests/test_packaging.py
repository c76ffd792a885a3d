"""What `pip install .` puts in site-packages."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bridge_process import ROOT

# Build litter and local state never belong in a copy that is built.
_SKIP = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "mutants"
)


@pytest.fixture
def fresh() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="chbpkg", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow  # seconds of real time: in `just test-slow`
def test_pip_install_puts_one_import_package_in_site_packages(fresh: Path) -> None:
    # no `actors` or `messages` in site-packages; python -m coms_hermes_bridge works
    source = fresh / "src"
    shutil.copytree(ROOT, source, symlinks=True, ignore=_SKIP)  # the build must not litter ROOT
    venv = fresh / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
         "--no-deps", "--disable-pip-version-check", str(source)],
        capture_output=True, text=True, timeout=240, check=False,
    )
    assert done.returncode == 0, done.stderr
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout.strip()
    site = Path(purelib)
    top = sorted(p.name for p in site.iterdir() if not p.name.endswith((".dist-info", ".pth")))
    assert top == ["coms_hermes_bridge"], top
    package = site / "coms_hermes_bridge"
    for sub in ("actors", "messages"):
        assert (package / sub).is_dir() and not (package / sub).is_symlink()
    assert (package / "actors" / "daemon.py").is_file()
    assert (package / "messages" / "py.typed").is_file()
    # X14: the liaison plugin ships whole, its manifest too, for `liaison install` to copy
    for name in ("__init__.py", "answers.py", "markers.py", "plugin.yaml"):
        assert (package / "liaison" / name).is_file(), name

    # run it from the install alone: the dependencies come from our own environment,
    # after the fresh site-packages, and nothing from the checkout is on the path
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for command in (
        [str(python), "-m", "coms_hermes_bridge", "--version"],
        [str(venv / "bin" / "coms-hermes-bridge"), "--version"],
    ):
        ran = subprocess.run(
            command, capture_output=True, text=True, timeout=30, env=env, cwd=str(fresh),
            check=False,
        )
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.startswith("coms-hermes-bridge ")
    where = subprocess.run(
        [str(python), "-c", "import coms_hermes_bridge.actors.daemon as d; print(d.__file__)"],
        capture_output=True, text=True, timeout=30, env=env, cwd=str(fresh), check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(site)


def test_a_module_can_load_under_one_name_only() -> None:
    # The top-level actors/ and messages/ folders are the package's subpackages (setup.cfg's
    # package_dir), with relative imports inside: imported by their folder names (as a
    # checkout on sys.path would allow), they refuse to load, so no module can exist
    # twice with two sets of globals.
    done = subprocess.run(
        [sys.executable, "-c",
         "import coms_hermes_bridge.actors.loop as r, coms_hermes_bridge.messages.wire as w\n"
         "print(r.__name__, w.__name__)\n"
         "try:\n    import actors.loop\nexcept ImportError as e:\n    print('refused:', e)\n"
         "import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in "
         "('actors', 'messages')))"],
        capture_output=True, text=True, timeout=30, cwd=str(ROOT), check=True,
    )
    assert done.stdout.splitlines() == [
        "coms_hermes_bridge.actors.loop coms_hermes_bridge.messages.wire",
        "refused: attempted relative import beyond top-level package",
        "['actors']",
    ]
    assert not (ROOT / "coms_hermes_bridge" / "actors").exists()  # no link, no copy
