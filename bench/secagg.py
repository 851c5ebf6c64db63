"""Rounds of DP-FedAvg (or FedAvg) with and without secure aggregation, side by side in one run: seconds per
round and bytes per site per round at K = 4, 8, 16 sites (the simulator; interleaved repetitions).

    python bench/secagg.py [--method dp-fedavg|fedavg] [--rounds 3] [--threads 2] [--sites 4,8,16]
                           [--out docs/data/secagg.json]

Set-up: Fashion-MNIST IID, 500 images per site, the default global model (MLP 784-200-200-10, 199,210
parameters, padded to 2^18 for the rotation), batch 50, one local epoch, z = 1, C = 1; secure aggregation
with its defaults (20 bits per coordinate, min_survivors K − 1, complete graph up to 10 sites, k ≈ 3·log2 K
beyond). Central: the server adds Gaussian noise; secure: every site encodes (rotation, rounding, Skellam
noise), masks, and unmasks. ``--method fedavg``: example-level DP-SGD at each site (its defaults), the server
averages the models (central) or decodes the weighted sum of the sites' masked model moves (secure: 32 bits,
no noise, the exact range bound — silofl.fl.exchange.secure_average).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from silofl.runner.config import RunConfig
from silofl.runner.loop import build


def setup(k: int, secure: bool, data, method: str = "dp-fedavg"):
    cfg = RunConfig.from_dict(
        dict(
            method=method,
            dataset="fashion-mnist",
            partition="iid",
            clients=k,
            samples_per_client=500,
            batch_size=50,
            secure_aggregation=secure,
            test_limit=100,
        )
    )
    _, _, proto, engine = build(cfg, data=data)
    proto.start()
    return proto, engine


def traffic(engine, k: int) -> int:
    return sum(engine.bytes_sent.get(s, 0) + engine.bytes_received.get(s, 0) for s in range(k))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sites", default="4,8,16")
    ap.add_argument("--out", default=None)
    ap.add_argument("--method", default="dp-fedavg", choices=["dp-fedavg", "fedavg"])
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from silofl.data import load_dataset

    data = load_dataset("fashion-mnist", None)
    sizes = [int(s) for s in a.sites.split(",")]
    variants = {(k, sec): setup(k, sec, data, a.method) for k in sizes for sec in (False, True)}
    times: dict = {v: [] for v in variants}
    nbytes: dict = {v: [] for v in variants}
    for rep in range(a.rounds + 1):  # the first round of each is a warm-up (key agreement), not counted
        for v, (proto, engine) in variants.items():
            before = traffic(engine, v[0])
            t0 = time.perf_counter()
            proto.run_round(rep + 1)
            proto.flush()  # the deferred broadcast belongs to this round
            dt = time.perf_counter() - t0
            if rep > 0:
                times[v].append(dt)
                nbytes[v].append((traffic(engine, v[0]) - before) / v[0])
    print(
        f"{a.method}, Fashion-MNIST, 500 images per site, mlp; median of {a.rounds} rounds, "
        f"{a.threads} threads"
    )
    print(
        f"{'K':>3} | {'central s':>9} | {'secure s':>9} | {'ratio':>6} | {'central B/site':>14} | "
        f"{'secure B/site':>14} | {'ratio':>6}"
    )
    rows = []
    for k in sizes:
        tc, ts = statistics.median(times[(k, False)]), statistics.median(times[(k, True)])
        bc, bs = statistics.median(nbytes[(k, False)]), statistics.median(nbytes[(k, True)])
        rows.append(
            {
                "sites": k,
                "central_s": tc,
                "secure_s": ts,
                "central_bytes_per_site": bc,
                "secure_bytes_per_site": bs,
            }
        )
        print(
            f"{k:>3} | {tc:>9.3f} | {ts:>9.3f} | {ts / tc:>5.2f}× | {bc:>14,.0f} | {bs:>14,.0f} | "
            f"{bs / bc:>5.2f}×"
        )
    if a.out:
        Path(a.out).write_text(
            json.dumps(
                {
                    "method": a.method,
                    "threads": a.threads,
                    "rounds": a.rounds,
                    "rows": rows,
                    "command": f"python bench/secagg.py --method {a.method} --rounds {a.rounds} "
                    f"--threads {a.threads} --sites {a.sites}",
                },
                indent=1,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
