"""``silofl deploy local --secure-aggregation``: a real Flower deployment (SuperLink, one SuperNode per site,
sealed payloads) runs the secure aggregation steps and gives the simulator's figures exactly (the masks
cancel exactly; the sites' noise and the rotation seeds are seeded in both)."""

import json
import signal
import subprocess
import sys

import pytest

from tests.deploy.test_deploy_local import BASE, ENV


@pytest.mark.slow
@pytest.mark.deploy
def test_deploy_local_with_secure_aggregation_equals_the_simulator(tmp_path):
    args = ["--method", "dp-fedavg", "--secure-aggregation", *BASE, "--noise-multiplier", "1.0"]
    cmd = [sys.executable, "-m", "silofl.cli.main"]
    dep = subprocess.Popen(
        [*cmd, "deploy", "local", "--sites", "3", *args, "--out", str(tmp_path / "d"), "--timeout", "600"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        sim = subprocess.run(
            [*cmd, "run", "--clients", "3", *args, "--out", str(tmp_path / "s")],
            capture_output=True,
            text=True,
            timeout=600,
            env=ENV,
        )
        out, err = dep.communicate(timeout=900)
    finally:
        if dep.poll() is None:
            dep.send_signal(signal.SIGINT)
            try:
                dep.wait(60)
            except subprocess.TimeoutExpired:
                dep.kill()
    assert sim.returncode == 0, sim.stderr[-3000:]
    assert dep.returncode == 0, err[-3000:]
    runs = {k: json.loads((tmp_path / k / "summary.json").read_text()) for k in ("d", "s")}
    assert runs["d"]["engine"]["name"] == "flower"
    for s in runs.values():
        assert s["privacy"]["secure_aggregation"] is True and s["privacy"]["rounds_released"] == 2
    rows = {
        k: [(r["client"], r["global_acc"], r["epsilon"]) for r in s["final"]["per_client"]]
        for k, s in runs.items()
    }
    assert rows["d"] == rows["s"]
    assert runs["d"]["privacy"]["epsilon_vs_server"] == runs["s"]["privacy"]["epsilon_vs_server"]
    assert "ε against the server" in out
