"""FedAvg rounds (or another method that takes pooled noise: ``--method``, e.g. fedavg-adam, ditto) with each
site's own noise and with the noise pooled under secure aggregation, side by side in one run: seconds per
round and bytes per site per round (the simulator; interleaved repetitions).

    python bench/pooled_round.py [--rounds 3] [--threads 1] [--sites 8] [--features scatter] [--method fedavg]

Set-up (issue 44's benchmark): Fashion-MNIST, p_major 0.8, 1000 images per site, ScatterNet features (from
the feature cache when warm), a linear head (39,700 parameters, padded to 2^16 for the rotation), full batch,
one DP step a round, clip 0.1, σ = 10, seed 0. Variants: ``local`` — every site's DP-SGD adds its own noise
and uploads its model in the clear; ``local+secagg`` — the same uploads masked (32 bits, no noise, exact
range; silofl.fl.exchange.secure_average); ``pooled`` — every site uploads the masked encoding of its clipped
gradient sum plus its Skellam share (32 bits; silofl.fl.exchange.pooled). The first round of each variant
(key agreement) is a warm-up and not counted.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from silofl.runner.config import RunConfig
from silofl.runner.loop import build

VARIANTS = {
    "local": {},
    "local+secagg": {"secure_aggregation": True},
    "pooled": {"secure_aggregation": True, "noise_placement": "pooled"},
}


def setup(k: int, features: str, extra: dict, method: str = "fedavg"):
    """A built, started run of ``method`` with ``k`` sites (see the module doc) with ``extra`` settings."""
    cfg = RunConfig.from_dict(
        dict(
            method=method,
            dataset="fashion-mnist",
            partition="p_major",
            p_major=0.8,
            clients=k,
            samples_per_client=1000,
            features=features,
            proxy_model="linear",
            optimizer="sgd",
            lr=3.0,
            clip=0.1,
            sample_rate=1.0,
            local_steps=1,
            noise_multiplier=10.0,
            delta=1e-5,
            seed=0,
            test_limit=100,
            **extra,
        )
    )
    _, _, coord, engine = build(cfg)
    coord.start()
    return coord, engine


def site_bytes(engine, k: int) -> int:
    """Bytes every site has sent and received so far, summed."""
    return sum(engine.bytes_sent.get(s, 0) + engine.bytes_received.get(s, 0) for s in range(k))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sites", type=int, default=8)
    ap.add_argument("--features", default="scatter")
    ap.add_argument("--method", default="fedavg", help="a method that takes pooled noise")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    k = a.sites
    runs = {name: setup(k, a.features, extra, a.method) for name, extra in VARIANTS.items()}
    times: dict = {v: [] for v in runs}
    nbytes: dict = {v: [] for v in runs}
    for rep in range(a.rounds + 1):
        for v, (coord, engine) in runs.items():
            before = site_bytes(engine, k)
            t0 = time.perf_counter()
            coord.run_round(rep + 1)
            coord.flush()  # the deferred broadcast belongs to this round
            if rep > 0:
                times[v].append(time.perf_counter() - t0)
                nbytes[v].append((site_bytes(engine, k) - before) / k)
    print(
        f"{a.method}, Fashion-MNIST, {k} sites × 1000, features {a.features}, linear head; median of "
        f"{a.rounds} rounds, {a.threads} thread(s)"
    )
    print(f"{'variant':>13} | {'s/round':>8} | {'× local':>7} | {'B/site/round':>12} | {'× local':>7}")
    t0, b0 = statistics.median(times["local"]), statistics.median(nbytes["local"])
    for v in runs:
        t, b = statistics.median(times[v]), statistics.median(nbytes[v])
        print(f"{v:>13} | {t:>8.3f} | {t / t0:>6.2f}× | {b:>12,.0f} | {b / b0:>6.2f}×")


if __name__ == "__main__":
    main()
