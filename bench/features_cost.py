"""Feature extraction cost per site (``--features scatter``), uncached and cached, measured in one run.

    .venv/bin/python bench/features_cost.py [--train 1000] [--test 10000] [--j 2] [--threads 1] [--reps 3]

One site of the papers' benchmark holds ``--train`` Fashion-MNIST training images and scores the 10k test set.
For
each rep, in one process, with a fresh empty cache folder each time:
  * uncached: kymatio's Scattering2D + GroupNorm computed, batched, and written to the cache (what a site's
  first run
    pays);
  * cached: the same tensors again, read back by content (what every later run on the same data pays: row
  hashes +
    reads);
  * compute only: the transform with no cache at all (for reference).
Prints seconds and images per second per variant (medians over reps) and the uncached/cached ratio. The
machine is
shared, so compare the ratios, not the absolute figures, across runs.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from silofl.data import load_dataset
from silofl.features import apply
from silofl.features.cache import compute
from silofl.features.scatter import ScatterFeatures


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", type=int, default=1000)
    ap.add_argument("--test", type=int, default=10000)
    ap.add_argument("--j", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ds = load_dataset("fashion-mnist")
    g = torch.Generator().manual_seed(0)
    x_train = ds.x_train[torch.randperm(len(ds.x_train), generator=g)[: args.train]]
    x_test = ds.x_test[: args.test]
    n = len(x_train) + len(x_test)
    stage = ScatterFeatures(j=args.j)
    stage.output_shape(tuple(x_train.shape[1:]))  # filters built once, outside the timings
    times: dict[str, list[float]] = {"compute only": [], "uncached": [], "cached": []}
    for _ in range(args.reps):
        t = time.perf_counter()
        ref = [compute(stage, x_train), compute(stage, x_test)]
        times["compute only"].append(time.perf_counter() - t)
        with tempfile.TemporaryDirectory() as d:
            t = time.perf_counter()
            first = [apply(stage, x_train, Path(d)), apply(stage, x_test, Path(d))]
            times["uncached"].append(time.perf_counter() - t)
            t = time.perf_counter()
            again = [
                apply(ScatterFeatures(j=args.j), x_train, Path(d)),
                apply(ScatterFeatures(j=args.j), x_test, Path(d)),
            ]
            times["cached"].append(time.perf_counter() - t)
        assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
        assert all(torch.equal(a, b) for a, b in zip(first, ref, strict=True))
    shape = tuple(ref[0].shape[1:])
    print(
        f"scatter J={args.j} L=8 on Fashion-MNIST, one site: {len(x_train)} training + {len(x_test)} test "
        f"images "
        f"({n} in all) → {shape}, {args.threads} thread(s), median of {args.reps} reps"
    )
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in med.items():
        print(
            f"  {k:13s} {v:8.2f} s  {n / v:10.0f} images/s   (all reps: "
            f"{', '.join(f'{x:.2f}' for x in times[k])})"
        )
    print(
        f"  uncached / cached: {med['uncached'] / med['cached']:.1f}×; cache overhead on a first run: "
        f"{med['uncached'] / med['compute only']:.2f}× compute only"
    )


if __name__ == "__main__":
    main()
