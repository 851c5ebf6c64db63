"""Seconds per training round of every method, DP and non-DP, measured side by side in one run.

    .venv/bin/python bench/methods_round.py [--rounds 3] [--threads 2] [--json docs/data/methods_round.json]

Papers' Fashion-MNIST settings (8 clients × 1000 images, batch 250, LeNet5 private / MLP shared).
Rounds of all variants are interleaved (round r of every variant, then round r+1), so machine noise
hits them alike; the table gives medians, each method's DP / non-DP ratio, and each method's time
relative to ProxyFL with DP. One warm-up round per variant is not timed. Evaluation is not included.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from silofl.fl.registry import methods
from silofl.runner.config import RunConfig
from silofl.runner.loop import build


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--methods", default=",".join(methods()))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    variants = {}
    for m in args.methods.split(","):
        for privacy in ("strict", "off"):
            _, _, proto, _ = build(RunConfig(method=m, privacy=privacy))
            proto.start()
            proto.run_round(1)  # warm-up
            variants[(m, privacy)] = (proto, [])
    for r in range(2, args.rounds + 2):
        for proto, times in variants.values():
            t = time.perf_counter()
            proto.run_round(r)
            times.append(time.perf_counter() - t)
    med = {k: statistics.median(t) for k, (_, t) in variants.items()}
    ref = med.get(("proxyfl", "strict"))
    print(
        f"seconds per round (train + exchange), medians of {args.rounds} interleaved rounds, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"{'method':10s} {'DP':>8s} {'no DP':>8s} {'DP/noDP':>8s} {'vs ProxyFL DP':>14s}")
    rows = []
    for m in args.methods.split(","):
        dp, nodp = med[(m, "strict")], med[(m, "off")]
        rel = dp / ref if ref else float("nan")
        print(f"{m:10s} {dp:8.3f} {nodp:8.3f} {dp / nodp:8.2f}× {rel:13.2f}×")
        rows.append(
            {"method": m, "dp_s": dp, "nodp_s": nodp, "dp_over_nodp": dp / nodp, "vs_proxyfl_dp": rel}
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": torch.get_num_threads(), "rounds": args.rounds, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
