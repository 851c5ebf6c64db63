"""torch.distributed: every process builds its sites' features (read back from the cache by content after the
first); the same numbers as the simulator on the same features."""

import json
import subprocess
import sys

import pytest

from silofl.runner.config import RunConfig
from silofl.runner.loop import run as simulate
from tests.comm.test_torchdist import records


@pytest.mark.slow
@pytest.mark.multiprocess
def test_launch_with_scatter_features_equals_the_simulator(tmp_path):
    c = {
        "dataset": "digits",
        "clients": 2,
        "rounds": 2,
        "samples_per_client": 100,
        "batch_size": 25,
        "delta": 1e-3,
        "test_limit": 100,
        "threads": 1,
        "seed": 5,
        "proxy_model": "linear",
        "features": "scatter",
    }
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in c.items()]
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "silofl.cli.main",
            "launch",
            "--nproc-per-node",
            "2",
            "--method",
            "fedavg",
            *flags,
            "--report-nonprivate",
            "--peer-timeout",
            "120",
            "--out",
            str(tmp_path / "dist"),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    sim = simulate(
        RunConfig.from_dict(
            {**c, "method": "fedavg", "report_nonprivate": True, "out": str(tmp_path / "sim")}
        ),
        progress=False,
    )
    assert records(tmp_path / "dist") == records(tmp_path / "sim")
    dist = json.loads((tmp_path / "dist/summary.json").read_text())
    assert (
        dist["final"] == sim["final"]
        and dist["processes"] == 2
        and dist["features"]["feature_shape"] == [81, 4, 4]
    )
