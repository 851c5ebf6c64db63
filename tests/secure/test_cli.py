"""The docs' secure aggregation commands, as written: a simulator run and a torch.distributed run (two
processes); each reports the ε against the server on the console and in summary.json."""

import json
import os
import subprocess
import sys

import pytest

from tests import readme
from tests.helpers import silofl_here

SECTION = readme.SECURE


@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_docs_commands_as_written(tmp_path):
    cmds = readme.commands(SECTION)
    assert len(cmds) == 2
    env = {**os.environ, "SILOFL_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    for cmd in cmds:
        args = readme.argv(cmd)
        if args[0] == "run":  # as written, in this process (a process costs ~2 s of imports)
            r = silofl_here(args, tmp_path, env)
        else:
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


SAMPLED = (
    "--method dp-fedavg --secure-aggregation --dataset digits --partition iid --clients 4 "
    "--samples-per-client 160 --batch-size 16 --rounds 2 --delta 1e-3 --proxy-model mlp256 --test-limit 200 "
    "--threads 1 --client-rate 0.6 "
    "--privacy-unit subclient --intermediaries 2 --seed 3"
).split()


@pytest.mark.slow
@pytest.mark.multiprocess
def test_sampling_and_the_subclient_unit_on_torch_distributed_equal_the_simulator(tmp_path):
    """Client sampling and the sub-client unit with secure aggregation, seeded: ``silofl launch`` (two
    processes) gives the simulator's figures exactly, each hospital's ε against the server from its own
    rounds, and says on the console what that ε holds against."""
    env = {**os.environ, "SILOFL_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    runs, outs = {}, {}
    for name, head in (("l", ["launch", "--nproc-per-node", "2"]), ("s", ["run"])):
        if head == ["run"]:  # the simulator in this process (a process costs ~2 s of imports)
            r = silofl_here([*head, *SAMPLED, "--out", name], tmp_path, env)
        else:
            r = subprocess.run(
                [sys.executable, "-m", "silofl.cli.main", *head, *SAMPLED, "--out", name],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
        assert r.returncode == 0, r.stderr[-3000:]
        runs[name], outs[name] = json.loads((tmp_path / name / "summary.json").read_text()), r.stdout
    keys = (
        "epsilon_vs_server",
        "epsilon_vs_server_per_hospital",
        "rounds_per_hospital",
        "epsilon_vs_server_hospital",
    )
    p = {k: {key: s["privacy"][key] for key in keys} for k, s in runs.items()}
    assert p["l"] == p["s"]
    rows = {
        k: [(r["client"], r["global_acc"], r["epsilon"]) for r in s["final"]["per_client"]]
        for k, s in runs.items()
    }
    assert rows["l"] == rows["s"]
    s = runs["s"]["privacy"]
    assert s["privacy_unit"] == "subclient" and s["rounds_released"] >= 1
    assert s["epsilon_vs_server"] == max(s["epsilon_vs_server_per_hospital"].values()) > 0
    assert s["epsilon_vs_server_hospital"] > s["epsilon_vs_server"]
    for out in outs.values():
        assert "ε against the server (one subclient)" in out and "no amplification by sampling claimed" in out
