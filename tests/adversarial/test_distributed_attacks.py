"""Hostile processes in a torch.distributed run: impostors that joined the rendezvous knowing only its
address (no run key) send a forged reply (a proxy with PushSum weight 1e300), or a frame header declaring
2^62 or −7 bytes. Process 0 refuses each before allocating anything, logs it, drops that process's sites, and
the run finishes with the others. One run holds all three impostors (ranks 1–3) beside two genuine processes
(ranks 0 and 4): a run of its own for each took 3 launches for the same checks."""

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

# the impostors, by rank: (mode of tests/adversarial/impostor.py, the reason process 0 gives)
IMPOSTORS = {
    1: ("forge", "fails its MAC"),
    2: ("huge", "declared size 4611686018427387904"),
    3: ("negative", "declared size -7"),
}
GENUINE = (0, 4)
RUN = {  # the run every genuine process is started with, as data (silofl.runner.entry.run_rank)
    "method": "proxyfl",
    "dataset": "digits",
    "clients": 5,  # site k on rank k % 5: one site per process
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


def test_impostors_without_the_run_key_are_refused_and_the_others_finish(tmp_path):
    port, out = str(free_port()), tmp_path / "run"
    base = {
        **os.environ,
        "WORLD_SIZE": str(len(IMPOSTORS) + len(GENUINE)),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": port,
        "SILOFL_NO_PROGRESS": "1",
        "OMP_NUM_THREADS": "1",
    }
    key = os.urandom(32).hex()
    cfg = RunConfig.from_dict({**RUN, "out": str(out)})
    genuine = rank_entry(cfg, RankOptions(peer_timeout_s=30, quiet=True)).command()
    impostor = [sys.executable, str(Path(__file__).with_name("impostor.py"))]
    procs = [
        subprocess.Popen(
            genuine if rank in GENUINE else [*impostor, IMPOSTORS[rank][0]],
            env={**base, "RANK": str(rank), **({"SILOFL_RUN_KEY": key} if rank in GENUINE else {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(len(IMPOSTORS) + len(GENUINE))
    ]
    try:
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert procs[0].returncode == 0, outs[0][1][-3000:]
    s = json.loads((out / "summary.json").read_text())
    for rank, (_, reason) in IMPOSTORS.items():
        assert reason in outs[0][1] and f"lost process {rank}" in outs[0][1], (rank, outs[0][1][-3000:])
        assert reason in s["lost_processes"][str(rank)]
    assert sorted(s["lost_processes"]) == [str(r) for r in IMPOSTORS]
    assert s["rounds_run"] == 2 and [r["client"] for r in s["final"]["per_client"]] == list(GENUINE)
    assert all(
        r["pushsum_weight"] <= 3 for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    )
    assert "Traceback" not in outs[0][1]
