"""The accuracy cost of secure aggregation's discrete noise at equal ε: DP-FedAvg with central Gaussian noise
(z = 1) against DP-FedAvg with ``--secure-aggregation`` whose noise multiplier is raised until its ε against
the server equals the central run's ε (the discrete mechanism's rounding and Skellam bound cost a few
percent of ε at the same z), over several seeds, side by side.

    python bench/secagg_accuracy.py [--seeds 0,1,2] [--rounds 20] [--out docs/data/secagg_accuracy.json]

Set-up: Fashion-MNIST IID, 6 hospitals × 1000 images, mlp256, batch 64, one local epoch, local lr 0.05,
C = 1, δ = 1e-5; secure aggregation with its defaults (20 bits, min_survivors 5 of 6). Each run is a real
``silofl run`` process; the figures are read from its summary.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

COMMON = (
    "--method dp-fedavg --dataset fashion-mnist --partition iid --clients 6 --samples-per-client 1000 "
    "--proxy-model mlp256 --batch-size 64 --local-lr 0.05 --clip 1.0 --delta 1e-5 --threads 1"
).split()


def run(out: Path, *args: str, common: list[str] = COMMON) -> dict:
    """``silofl run`` of ``common`` and ``args`` into ``out``; its summary.json."""
    env = {**os.environ, "SILOFL_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "silofl.cli.main", "run", *common, *args, "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode:
        raise SystemExit(r.stderr[-2000:])
    return json.loads((out / "summary.json").read_text())


def mean_sd(rows: list[dict], key: str) -> str:
    """``key``'s mean ± sample standard deviation over the seeds' rows."""
    v = [r[key] for r in rows]
    return f"{statistics.fmean(v):.4f} ± {statistics.stdev(v) if len(v) > 1 else 0.0:.4f}"


def write_result(out: str | None, rounds: int, rows: list[dict], command: str) -> None:
    """The rows and the command that made them, as JSON in ``out`` (nothing without ``out``)."""
    if out:
        Path(out).write_text(
            json.dumps({"rounds": rounds, "rows": rows, "command": command}, indent=1) + "\n"
        )


def equal_epsilon_z(target: float, rounds: int, dim: int) -> float:
    """The least z whose discrete mechanism (the run's: 20 bits, 6 parties, 5 survivors, C = 1) spends
    ``target`` against the server in ``rounds`` rounds."""
    from silofl.privacy.discrete import calibrate_for_epsilon

    mech = calibrate_for_epsilon(
        target, delta=1e-5, rounds=rounds, dim=dim, clip=1.0, bits=20, parties=6, min_survivors=5
    )
    return mech.noise_multiplier()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            base = ["--rounds", str(a.rounds), "--eval-every", str(a.rounds), "--seed", str(seed)]
            c = run(Path(tmp) / f"c{seed}", *base, "--noise-multiplier", "1.0")
            eps = c["privacy"]["epsilon_hospital"]
            dim = _dim()
            z = equal_epsilon_z(eps, a.rounds, dim)
            s = run(Path(tmp) / f"s{seed}", *base, "--noise-multiplier", repr(z), "--secure-aggregation")
            rows.append(
                {
                    "seed": seed,
                    "central_acc": c["final"]["per_client"][0]["global_acc"],
                    "central_epsilon": eps,
                    "secure_acc": s["final"]["per_client"][0]["global_acc"],
                    "secure_epsilon_vs_server": s["privacy"]["epsilon_vs_server"],
                    "secure_noise_multiplier": z,
                }
            )
            print(json.dumps(rows[-1]), flush=True)

    def ms(key: str) -> str:
        return mean_sd(rows, key)

    print(f"DP-FedAvg, Fashion-MNIST IID, 6 × 1000, {a.rounds} rounds, seeds {a.seeds} (mean ± sd)")
    print(f"central noise (z = 1):         acc {ms('central_acc')}, ε {ms('central_epsilon')}")
    print(
        f"secure aggregation (equal ε):  acc {ms('secure_acc')}, "
        f"ε vs server {ms('secure_epsilon_vs_server')}, z {ms('secure_noise_multiplier')}"
    )
    write_result(
        a.out, a.rounds, rows, f"python bench/secagg_accuracy.py --seeds {a.seeds} --rounds {a.rounds}"
    )


def _dim() -> int:
    """The number of parameters of mlp256 on Fashion-MNIST (what the update sum's mechanism covers)."""
    from silofl.models import ModelSpec

    return sum(p.numel() for p in ModelSpec("mlp256", (1, 28, 28), 10).build().parameters())


if __name__ == "__main__":
    main()
