"""The real hermes (hermes-agent 0.19.0 in .venv-hermes) for the tests that run it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.bridge_process import ROOT


def ensure_hermes_bin() -> Path:
    """The hermes venv's bin, made (or found up to date) by the project's script. A venv
    that cannot be made fails the test: it is never skipped."""
    made = subprocess.run([str(ROOT / "scripts" / "ensure-hermes-venv")],
                          capture_output=True, text=True, timeout=900, check=False)
    if made.returncode != 0:
        pytest.fail(f"scripts/ensure-hermes-venv failed ({made.returncode}):\n{made.stderr}")
    bin_dir = Path(made.stdout.strip().splitlines()[-1])
    assert (bin_dir / "hermes").is_file(), bin_dir
    return bin_dir
