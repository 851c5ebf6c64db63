"""The docs' secure aggregation commands, as written: a simulator run and a torch.distributed run (two
processes); each reports the ε against the server on the console and in summary.json."""

import json
import os
import subprocess
import sys

import pytest

from tests import readme

SECTION = readme.SECURE


@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_docs_commands_as_written(tmp_path):
    cmds = readme.commands(SECTION)
    assert len(cmds) == 2
    env = {**os.environ, "SILOFL_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    for cmd in cmds:
        args = readme.argv(cmd)
        r = subprocess.run(
            [sys.executable, "-m", "silofl.cli.main", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        out = tmp_path / args[args.index("--out") + 1]
        s = json.loads((out / "summary.json").read_text())
        p = s["privacy"]
        assert p["secure_aggregation"] is True and p["noise_placement"] == "site"
        assert p["rounds_released"] == s["rounds_run"] and p["rounds_abandoned"] == 0
        assert p["epsilon_vs_server"] > 0
        assert "secure aggregation: on" in r.stdout and "ε against the server" in r.stdout
        if args[0] == "launch":
            assert s["processes"] == 2
