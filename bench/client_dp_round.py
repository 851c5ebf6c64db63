"""Seconds per round of client-level DP FL: DP vs non-DP, and v sub-clients trained as one vmap batch
vs one at a time, measured side by side (interleaved repetitions) in one run.

    python bench/client_dp_round.py [--rounds 3] [--threads 2] [--out docs/data/client_dp_round.json]

Set-up: DP-FedAvg, Fashion-MNIST IID, 6 clients × 2000 images, MLP 784-256-10, batch 64, one local
epoch. Every variant trains the same examples per round; only how (and whether with DP) differs.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from pathlib import Path

import torch

from silofl.runner.config import RunConfig
from silofl.runner.loop import build
from silofl.site import subclients
from silofl.training.local_sgd import local_updates


def setup(v: int, private: bool, data):
    cfg = RunConfig.from_dict(
        dict(
            method="dp-fedavg",
            dataset="fashion-mnist",
            partition="iid",
            clients=6,
            samples_per_client=2000,
            batch_size=64,
            proxy_model="mlp256",
            intermediaries=str(v),
            privacy="strict" if private else "off",
        )
    )
    _, _, proto, _ = build(cfg, data=data)
    proto.start()
    return proto


def time_round(proto, rnd: int) -> float:
    t0 = time.perf_counter()
    proto.run_round(rnd)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from silofl.data import load_dataset

    data = load_dataset("fashion-mnist", None)
    variants = {}
    for v in (1, 8, 31):
        variants[f"v={v} DP vmap"] = (v, True, 64)
        variants[f"v={v} noDP vmap"] = (v, False, 64)
        if v > 1:
            variants[f"v={v} DP one-at-a-time"] = (v, True, 1)
    protos = {k: setup(v, p, data) for k, (v, p, _) in variants.items()}
    times: dict[str, list[float]] = {k: [] for k in variants}
    original = subclients.local_updates
    for rep in range(a.rounds + 1):  # round 0 of each is a warm-up (vmap tracing), not counted
        for k, (_, _, chunk) in variants.items():
            subclients.local_updates = functools.partial(local_updates, chunk=chunk)
            t = time_round(protos[k], rep + 1)
            if rep > 0:
                times[k].append(t)
    subclients.local_updates = original
    med = {k: statistics.median(ts) for k, ts in times.items()}
    print(
        f"s/round (median of {a.rounds}, {a.threads} threads), DP-FedAvg, 6 clients × 2000 Fashion-MNIST, "
        f"mlp256"
    )
    rows = []
    for v in (1, 8, 31):
        dp, nodp = med[f"v={v} DP vmap"], med[f"v={v} noDP vmap"]
        row = {"v": v, "dp_s": dp, "nodp_s": nodp, "dp_over_nodp": dp / nodp}
        line = f"v={v:>2}: DP {dp:.3f}  non-DP {nodp:.3f}  DP/non-DP {dp / nodp:.2f}×"
        if v > 1:
            seq = med[f"v={v} DP one-at-a-time"]
            row.update({"one_at_a_time_s": seq, "one_at_a_time_over_vmap": seq / dp})
            line += f"  one-at-a-time {seq:.3f} ({seq / dp:.2f}× the vmap batch)"
        rows.append(row)
        print(line)
    if a.out:
        Path(a.out).write_text(
            json.dumps(
                {
                    "threads": a.threads,
                    "rounds": a.rounds,
                    "rows": rows,
                    "command": f"python bench/client_dp_round.py --rounds {a.rounds} --threads {a.threads}",
                },
                indent=1,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
