"""studies/ and bench/ start runs and tunings through the public API (`silofl.api`), so the API has users in
the repository and drifts show: no script imports what starts a run, starts a tuning or writes a run folder
(`silofl.runner.loop`, `silofl.experiments.tune`, `silofl.runner.folder`) past the API.

The few names of those modules that neither start a run nor write a folder stay importable: a bench times
one round of a built run (``build``), and the document generators read finished run folders."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = ("silofl.runner.loop", "silofl.experiments.tune", "silofl.runner.folder")
# module → the names that are no run: measured by a bench on purpose, or reading a finished run folder
ALLOWED = {
    "silofl.runner.loop": {"build"},  # a bench times one round of a built run (no folder, no rounds)
    "silofl.runner.folder": {"read_config", "read_run_config", "read_metrics", "values_by_round", "mean_std"},
}


def scripts() -> list[Path]:
    return sorted(p for folder in ("studies", "bench") for p in (REPO / folder).rglob("*.py"))


def _module_of(mod: str) -> str | None:
    """The forbidden module ``mod`` is or lies under (None: another module)."""
    return next((f for f in FORBIDDEN if mod == f or mod.startswith(f + ".")), None)


def run_starting_imports(source: str, name: str = "<source>") -> list[str]:
    """Each import of ``source`` that reaches past `silofl.api` to start a run or tuning or write a run
    folder, as ``line: import text``."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _module_of(alias.name):  # the whole module: any of its functions
                    found.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            forbidden = _module_of(node.module)
            if forbidden is not None:
                allowed = ALLOWED.get(node.module, set())
                found += [
                    f"{node.lineno}: from {node.module} import {alias.name}"
                    for alias in node.names
                    if alias.name not in allowed
                ]
            elif node.module in ("silofl.runner", "silofl.experiments"):  # from silofl.runner import loop
                found += [
                    f"{node.lineno}: from {node.module} import {alias.name}"
                    for alias in node.names
                    if _module_of(f"{node.module}.{alias.name}")
                ]
    return found


def test_there_are_scripts_to_check():
    names = {p.relative_to(REPO).as_posix() for p in scripts()}
    assert {"studies/privacy_utility.py", "studies/tabular.py", "bench/proxyfl_round.py"} <= names


def test_studies_and_bench_start_runs_through_the_public_api():
    bad = [
        f"{p.relative_to(REPO)}:{hit}"
        for p in scripts()
        for hit in run_starting_imports(p.read_text(), str(p))
    ]
    assert not bad, (
        "studies/ and bench/ start runs and tunings through silofl.api (silofl.run, silofl.tune, "
        "silofl.RunConfig), not the run layer's internals:\n  " + "\n  ".join(bad)
    )


@pytest.mark.parametrize(
    "source",
    [
        "from silofl.runner.loop import run",
        "from silofl.runner.loop import build, run as simulate",
        "import silofl.runner.loop",
        "import silofl.experiments.tune as t",
        "from silofl.experiments.tune import tune",
        "from silofl.runner.folder import RunFolder",
        "from silofl.runner import loop",
        "from silofl.experiments import tune",
        "def f():\n    from silofl.runner.folder import check_out\n",
    ],
)
def test_a_run_starting_import_is_found(source):
    assert run_starting_imports(source)


@pytest.mark.parametrize(
    "source",
    [
        "from silofl.api import run, tune, RunConfig",
        "import silofl",
        "from silofl.runner.loop import build",
        "from silofl.runner.folder import read_config, mean_std",
        "from silofl.runner.config import RunConfig",
        "from silofl.experiments.evaluate import evaluate_run",
        "from .loop import run",
    ],
)
def test_the_api_and_reading_a_finished_run_are_not(source):
    assert not run_starting_imports(source)
