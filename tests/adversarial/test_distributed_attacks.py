"""Hostile processes in a torch.distributed run: an impostor that joined the rendezvous knowing only its
address (no run key) sends a forged reply (a proxy with PushSum weight 1e300), or a frame header declaring
2^62 or −7 bytes. Process 0 refuses it before allocating anything, logs it, drops that process's sites, and
the run finishes with the others."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from silofl.runner.config import RunConfig
from silofl.runner.entry import RankOptions, rank_entry

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

RUN = {  # the run every genuine process is started with, as data (silofl.runner.entry.run_rank)
    "method": "proxyfl",
    "dataset": "digits",
    "clients": 3,
    "rounds": 2,
    "samples_per_client": 100,
    "batch_size": 25,
    "delta": 1e-3,
    "test_limit": 100,
    "threads": 1,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "mode, reason",
    [
        ("forge", "fails its MAC"),
        ("huge", "declared size 4611686018427387904"),
        ("negative", "declared size -7"),
    ],
)
def test_an_impostor_without_the_run_key_is_refused_and_the_others_finish(tmp_path, mode, reason):
    port, out = str(free_port()), tmp_path / "run"
    base = {
        **os.environ,
        "WORLD_SIZE": "3",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": port,
        "SILOFL_NO_PROGRESS": "1",
        "OMP_NUM_THREADS": "1",
    }
    key = os.urandom(32).hex()
    cfg = RunConfig.from_dict({**RUN, "out": str(out)})
    genuine = rank_entry(cfg, RankOptions(peer_timeout_s=30, quiet=True)).command()
    procs = [
        subprocess.Popen(
            genuine,
            env={**base, "RANK": "0", "SILOFL_RUN_KEY": key},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ),
        subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("impostor.py")), mode],
            env={**base, "RANK": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ),
        subprocess.Popen(
            genuine,
            env={**base, "RANK": "2", "SILOFL_RUN_KEY": key},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ),
    ]
    try:
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert procs[0].returncode == 0, outs[0][1][-3000:]
    assert reason in outs[0][1] and "lost process 1" in outs[0][1]
    s = json.loads((out / "summary.json").read_text())
    assert s["rounds_run"] == 2 and [r["client"] for r in s["final"]["per_client"]] == [0, 2]
    assert reason in s["lost_processes"]["1"]
    assert all(
        r["pushsum_weight"] <= 3 for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    )
    assert "Traceback" not in outs[0][1]
