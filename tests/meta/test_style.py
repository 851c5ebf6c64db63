"""The repository's style rules hold: ruff's lint rules (line length included, 110 columns: pyproject.toml)
and its formatter, over every Python folder of the repository."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ["src", "tests", "bench", "studies", "docs/hooks"]


def ruff() -> list[str]:
    exe = Path(sys.executable).parent / "ruff"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("ruff")
    if found is None:
        pytest.skip("ruff is not installed (pip install 'silofl[dev]')")
    return [found]


def test_ruff_lint_rules_hold_line_length_included():
    r = subprocess.run(
        [*ruff(), "check", "--output-format", "concise", *FOLDERS], cwd=REPO, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_code_is_as_ruff_formats_it():
    r = subprocess.run([*ruff(), "format", "--check", *FOLDERS], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
