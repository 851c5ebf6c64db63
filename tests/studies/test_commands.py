"""The commands the documents and bench scripts name for the studies exist: every ``python -m studies.NAME``
is a module of studies/ that runs as a script, and none names the old places (scripts/*_doc.py,
silofl.experiments.docs)."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NAMED = re.compile(r"python -m studies\.([A-Za-z_][\w.]*)")
OLD = re.compile(
    r"scripts/\w+_(?:doc|results)\.py|scripts/epsilon_check\.py|silofl\.experiments\.(?:docs|tabular|"
    r"epsilon_check)"
)


def sources():
    for folder in ("docs", "bench", "studies"):
        for p in sorted((REPO / folder).rglob("*")):
            if p.suffix in (".md", ".sh", ".py", ".yaml"):
                yield p


def test_every_named_study_command_is_a_runnable_module():
    named = {}
    for p in sources():
        text = p.read_text()
        assert not OLD.search(text), (
            f"{p.relative_to(REPO)} names a generator's old place: {OLD.search(text)[0]}"
        )
        for name in NAMED.findall(text):
            named.setdefault(name, p.relative_to(REPO))
    assert {"privacy_utility", "tabular", "tabular_doc", "results_doc", "audit_doc"} <= named.keys()
    for name, where in named.items():
        spec = importlib.util.find_spec(f"studies.{name}")
        assert spec is not None and spec.origin, f"{where}: no module studies.{name}"
        assert 'if __name__ == "__main__":' in Path(spec.origin).read_text(), (
            f"studies.{name} does not run as -m"
        )


@pytest.mark.slow
def test_a_study_runs_with_python_m_from_the_repository_root():
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    cp = subprocess.run(
        [sys.executable, "-m", "studies.epsilon_check", "--help"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cp.returncode == 0, cp.stderr
    assert "--out" in cp.stdout
