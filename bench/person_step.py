"""Person-level vs row-level DP-SGD step cost on a table model, measured side by side in one run (variants
interleaved, medians reported).

    .venv/bin/python bench/person_step.py [--persons 250] [--rows-per-person 4] [--reps 30] [--threads 1]

A batch of P persons with k rows each (P·k rows, 40 one-hot-encoded inputs) through ``tabmlp`` (D-64-64-2).
Prints ms per step and the ratio to the non-DP step for: non-DP; row-level DP (ghost norms); person-level DP
with ghost norms (the pair identity over each person's rows); person-level DP with vmap (per-row gradients
summed per person).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from silofl.models import build_model
from silofl.privacy import DPGradient, NoiseSource


def ce(logits, y):
    return F.cross_entropy(logits, y, reduction="none")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--persons", type=int, default=250)
    ap.add_argument("--rows-per-person", type=int, default=4)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    n = a.persons * a.rows_per_person
    x, y = torch.randn(n, 40), torch.randint(0, 2, (n,))
    groups = torch.arange(a.persons).repeat_interleave(a.rows_per_person)[torch.randperm(n)]
    model = build_model("tabmlp", (40,), 2)

    def dp(backend):
        return DPGradient(model, 1.0, 1.0, float(a.persons), NoiseSource(0), backend, sample_rate=0.1)

    ghost, vmap = dp("ghost"), dp("vmap")

    def nondp():
        model.zero_grad()
        ce(model(x), y).mean().backward()

    variants = {
        "non-DP": nondp,
        "row-level DP (ghost)": lambda: ghost.compute(x, ce, y),
        "person-level DP (ghost pairs)": lambda: ghost.compute(x, ce, y, groups=groups),
        "person-level DP (vmap)": lambda: vmap.compute(x, ce, y, groups=groups),
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    for f in variants.values():  # warm-up
        f()
    for _ in range(a.reps):
        for k, f in variants.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    base = statistics.median(times["non-DP"])
    print(f"{a.persons} persons × {a.rows_per_person} rows = {n} rows, tabmlp, {a.threads} thread(s)")
    for k, ts in times.items():
        m = statistics.median(ts)
        print(f"{k:32s} {1000 * m:8.2f} ms   {m / base:5.2f}× non-DP")


if __name__ == "__main__":
    main()
