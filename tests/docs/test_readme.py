"""The README (issue 27): its two set-up commands are the contract, every other command in it runs in the
suite exactly as written (here, or — for the path of a hospital — in the tests of the docs page it links
to, where the same command stands), and the gains it quotes are the generated study's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from tests import readme
from tests.helpers import silofl_here

ROOT = readme.ROOT


def _sections(text: str) -> list[str]:
    """The README's ``##`` titles (outside code blocks)."""
    out, in_code = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("## "):
            out.append(line[3:].strip())
    return out


def test_the_set_up_commands_come_first_unchanged():
    """The first block: the main job (install, then run), then the test suite — which CI runs (.ci/run)."""
    text = readme.README.read_text()
    first = re.search(r"```bash\n(.*?)```", text, flags=re.S)
    assert first is not None and text.index(first.group(0)) < text.index("\n## ")
    setup, tests = first.group(1).strip().splitlines()
    assert setup.startswith("bash scripts/setup.sh && .venv/bin/silofl run ") and len(setup) <= 100
    assert tests == "bash scripts/test.sh"
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    assert len(text.splitlines()) <= 150


def test_every_readme_command_is_run_by_a_test():
    """A command in a README section runs in a test of its own (readme.SECTIONS) or stands, exactly as
    written, in a docs section whose every command runs (the path of a hospital shows commands of the
    how-tos)."""
    text = readme.README.read_text()
    tested_here = {t for f, t in (w for w in readme.SECTIONS if isinstance(w, tuple)) if f == "README.md"}
    elsewhere = {c for w in readme.SECTIONS if w[0] != "README.md" for c in readme.commands(w)}
    elsewhere_vars = {
        k: v for w in readme.SECTIONS if w[0] != "README.md" for k, v in readme.variables(w).items()
    }
    seen = 0
    for title in _sections(text):
        cmds = readme.commands(title)
        if title in tested_here:
            assert cmds or readme.blocks(title, "python"), title
            continue
        assert not readme.blocks(title, "python"), f"a python block in {title!r} that no test runs"
        for c in cmds:
            assert c in elsewhere, f"README command in {title!r} that no test runs as written: {c}"
            seen += 1
        for k, v in readme.variables(title).items():
            assert elsewhere_vars.get(k) == v, (title, k)
    assert seen >= 4  # the path of a hospital


def _gain_rows(text: str) -> list[list[str]]:
    return [
        [c.strip() for c in line.strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| ") and not line.startswith("| features")
    ]


def test_the_readmes_gains_are_the_generated_studys():
    """Each row of the README's gain table is a row of docs/privacy_utility.md's *Does collaborating pay?*,
    cell for cell (the study regenerates that page: a README quoting stale figures fails here)."""
    ours = _gain_rows(readme.section("What a site gains"))
    theirs = _gain_rows(readme.section(("docs/privacy_utility.md", "Does collaborating pay?")))
    assert ours
    for row in ours:
        features = row[0].split()[0]
        match = [r for r in theirs if r[0] == features and r[2] == row[2]]
        assert len(match) == 1, row
        (r,) = match
        assert r[1].startswith(row[1] + " "), (row, r)
        assert r[3:] == row[3:], (row, r)


ENV = {**os.environ, "SILOFL_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1", "COLUMNS": "200"}


@pytest.mark.slow
def test_the_30_second_run_as_written(tmp_path):
    """The README's first run: σ set by the budget, every site at ε ≤ 8 (the run's ε checked against
    dp-accounting's RDP accountant from the σ, q and steps the run recorded), and the going-alone
    comparison written."""
    import dp_accounting

    (cmd,) = readme.commands(readme.FIRST_RUN)
    args = readme.argv(cmd)
    r = silofl_here(args, tmp_path, ENV)  # as written, in this process (a process costs ~2 s of imports)
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / args[args.index("--out") + 1]
    s = json.loads((out / "summary.json").read_text())
    assert s["rounds_run"] == 30 and s["clients"] == 4 and s["features"]["features"]["name"] == "scatter"
    cal = s["privacy"]["noise_calibration"]
    for party in cal["parties"]:
        acc = dp_accounting.rdp.RdpAccountant()
        acc.compose(
            dp_accounting.PoissonSampledDpEvent(
                party["sample_rate"], dp_accounting.GaussianDpEvent(cal["noise_multiplier"])
            ),
            party["steps"],
        )
        eps = acc.get_epsilon(cal["delta"])
        # another RDP implementation (its own orders and RDP → (ε, δ) conversion): the same ε within 0.05
        assert abs(eps - party["planned_epsilon"]) < 0.05 and party["planned_epsilon"] <= 8.0, (party, eps)
    assert s["final"]["epsilon"]["mean"] <= 8.0
    assert "vs_alone" in s and (out / "alone").is_dir()
    decision = json.loads((out / "decision.json").read_text())  # what the README's text says it holds
    assert len(decision["rows"]) == 4 and (out / "report.md").is_file()
    assert all(row["reference"]["internal"]["name"] == "silofl Regular, no DP" for row in decision["rows"])
    for k in range(4):
        assert (out / "sites" / f"client{k}" / "ledger.jsonl").stat().st_size > 0
    # the decision table once, with going alone in it (not first without it, then again)
    assert r.stdout.count("Decision per site") == 1, r.stdout[-4000:]
    assert "no going-alone reference" not in r.stdout


@pytest.mark.slow
def test_the_python_example_as_written(tmp_path):
    """The README's Python example, run as a script. It uses the API of issue 27 item 3
    (``silofl.run(RunConfig)``, helper cli27); on a tree without it the test says so and skips."""
    import silofl

    if not (hasattr(silofl, "RunConfig") and callable(getattr(silofl, "run", None))):
        pytest.skip("silofl.run(RunConfig) (issue 27 item 3, helper cli27) is not in this tree yet")
    (code,) = readme.blocks(readme.PYTHON, "python")
    script = tmp_path / "example.py"
    script.write_text(textwrap.dedent(code))
    r = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "epsilon" in r.stdout or "ε" in r.stdout, r.stdout[-2000:]
