"""The layers of src/silofl hold (pyproject.toml's import-linter contracts, run as CI runs them:
`lint-imports`), and every subpackage sits in a layer, so a new one cannot escape the contract."""

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def contracts() -> list[dict]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def test_lint_imports_keeps_every_contract():
    lint = Path(sys.executable).with_name("lint-imports")
    r = subprocess.run([str(lint)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


def test_every_subpackage_is_in_a_layer():
    layers = next(c for c in contracts() if c["type"] == "layers" and "silofl.cli" in c["layers"])["layers"]
    named = {m.strip() for layer in layers for m in layer.replace("|", ":").split(":")}
    src = REPO / "src" / "silofl"
    packages = {f"silofl.{p.name}" for p in src.iterdir() if (p / "__init__.py").is_file()}
    packages |= {f"silofl.{p.stem}" for p in src.glob("*.py") if p.stem != "__init__"}
    assert packages == named, (sorted(packages - named), sorted(named - packages))
