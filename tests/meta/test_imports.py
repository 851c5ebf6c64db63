"""The core install is enough for the simulator: importing silofl, its run loop and its CLI loads no package
of an extra, and a run goes through with every extra's packages made unimportable (each test a fresh
interpreter)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from silofl.core.extras import EXTRAS

REPO = Path(__file__).resolve().parents[2]
EXTRA_MODULES = sorted({m for _, modules in EXTRAS.values() for m in modules} | {"starlette", "grpc"})


def python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
        "SILOFL_NO_PROGRESS": "1",
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_importing_the_library_and_the_cli_loads_no_extra(tmp_path):
    cp = python(
        f"""
        import json, sys
        import silofl, silofl.runner.loop, silofl.cli.main
        print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}} & set({EXTRA_MODULES!r}))))
    """,
        tmp_path,
    )
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout.strip().splitlines()[-1]) == []


@pytest.mark.slow
def test_a_run_needs_no_extra_and_an_extra_s_command_says_which(tmp_path):
    """With every extra's packages blocked: the main job's kind of run (ProxyFL on ScatterNet features,
    against going alone) completes on digits; `silofl pubsub serve` and `silofl deploy local` stop with the
    one line naming their extra (exit code 2)."""
    cp = python(
        f"""
        import sys
        for name in {EXTRA_MODULES!r}:
            sys.modules[name] = None  # as if not installed
        from typer.testing import CliRunner
        from silofl.cli.main import app
        tiny = ["--dataset", "digits", "--clients", "2", "--rounds", "1", "--samples-per-client", "60",
                "--batch-size", "20", "--delta", "1e-3", "--test-limit", "100", "--quiet"]
        main_job = ["--target-epsilon", "8", "--features", "scatter", "--private-model", "linear",
                    "--proxy-model", "linear", "--vs-alone"]  # the README's main job, on digits
        for args in (["run", "--method", "proxyfl", *tiny, *main_job, "--out", "run"],
                     ["pubsub", "serve", "--state", "broker", "--insecure-http"],
                     ["deploy", "local", "--sites", "2", "--method", "fedavg", "--dataset", "digits",
                      "--rounds", "1", "--quiet", "--out", "dep"]):
            r = CliRunner().invoke(app, args)
            print(r.exit_code, r.output.strip().splitlines()[-1] if r.output.strip() else "", sep="\\t")
    """,
        tmp_path,
    )
    assert cp.returncode == 0, cp.stderr
    (run, _), (serve, serve_line), (deploy, deploy_line) = (
        line.split("\t") for line in cp.stdout.strip().splitlines()
    )
    assert run == "0", cp.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["features"]["features"]["name"] == "scatter" and "vs_alone" in summary
    assert serve == "2" and serve_line.endswith("pip install 'silofl[pubsub]'")
    assert deploy == "2" and deploy_line.endswith("pip install 'silofl[deploy]'")
    assert not (tmp_path / "broker").exists() and not (tmp_path / "dep").exists()
