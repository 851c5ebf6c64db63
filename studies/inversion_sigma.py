"""SSIM of gradient-inversion reconstructions against the noise multiplier σ, on digits (docs/howto/audit.md).

    OMP_NUM_THREADS=1 python -m studies.inversion_sigma > /tmp/inversion_sigma.md

The attack of ``silofl audit --attack inversion`` (:func:`silofl.auditing.inversion.attack_update`, its
default
optimisation: 1500 iterations, 2 restarts) on the setting a client-level audit with the default options
attacks: the global ``mlp`` of round 1 (a fresh initialisation, one per image), a sub-client holding one
16×16 digit, one local SGD step at lr 0.05, clipped to C = 1 (the default clip, hospital unit, v = 1), and
N(0, (σ·C)²) on every coordinate. Five digits (the first of classes 0–4 in the training split) per σ; the ε
column is the hospital-level ε of a 20-round run in which every hospital takes part each round (δ = 1e-5,
the RDP accountant).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
import warnings

import torch

from silofl.auditing import inversion
from silofl.data.datasets import load_digits_dataset
from silofl.models import ModelSpec
from silofl.privacy import Accountant

SIGMAS = (0.0, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 1.0)
ROUNDS, DELTA, CLIP, LR = 20, 1e-5, 1.0, 0.05


def epsilon(sigma: float) -> str:
    """The hospital-level ε of ROUNDS rounds at σ (every hospital each round), or — when it is unbounded."""
    if sigma == 0:
        return "∞ (no DP)"
    try:
        e = Accountant("rdp").epsilon_after(sigma, 1.0, ROUNDS, DELTA)
    except Exception:  # noqa: BLE001 - an accountant that cannot bound it: no guarantee to print
        return "—"
    return "> 10⁶" if not math.isfinite(e) or e > 1e6 else f"{e:.3g}"


def main() -> None:
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="Optimal order is the smallest alpha")
    ds = load_digits_dataset()
    picks = [int((ds.y_train == c).nonzero()[0]) for c in range(5)]
    settings = inversion.InversionSettings()
    print(
        "Measured with `OMP_NUM_THREADS=1 python -m studies.inversion_sigma` "
        f"(digits, {len(picks)} images per σ, {settings.iterations} iterations × "
        f"{settings.restarts} restarts):"
    )
    print()
    print(
        "| σ | noise std per coordinate | SSIM (mean ± sd) | PSNR dB (mean) | labels right | ε (20 rounds) |"
    )
    print("|---|---|---|---|---|---|")
    floor = []
    norms = []
    for sigma in SIGMAS:
        ssims, psnrs, right = [], [], 0
        t0 = time.perf_counter()
        for j, i in enumerate(picks):
            torch.manual_seed(j)
            model = ModelSpec("mlp", ds.input_shape, ds.num_classes).build()
            x, y = ds.x_train[i : i + 1], ds.y_train[i : i + 1]
            r = inversion.attack_update(
                model,
                inversion.params_of(model),
                x,
                y,
                lr=LR,
                steps=1,
                subclient_clip=CLIP,
                noise_std=sigma * CLIP,
                box=(0.0, 1.0),
                settings=inversion.InversionSettings(seed=j),
                noise_seed=100 + j,
            )
            ssims.append(r["ssim"])
            psnrs.append(r["psnr"])
            right += r["labels_correct"]
            if sigma == 0:
                floor.append(inversion.baseline(x.numpy(), 0.0, 1.0, seed=j)["ssim"])
                norms.append(r["update_norm_before_clip"])
        print(
            f"| {sigma:g} | {sigma * CLIP:g} | "
            f"{statistics.fmean(ssims):.3f} ± {statistics.pstdev(ssims):.3f} | "
            f"{statistics.fmean(psnrs):.1f} | {right} / {len(picks)} | {epsilon(sigma)} |"
        )
        print(f"σ = {sigma:g}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    print(f"| random images (the floor) | — | {statistics.fmean(floor):.3f} | — | — | — |")
    print()
    print(
        f"The update's norm before clipping: {min(norms):.3f}–{max(norms):.3f} "
        f"(below C = {CLIP:g}: the clip does not bind, and the noise is added at σ·C per coordinate "
        "of the model's "
        f"{sum(p.numel() for p in model.parameters())} parameters)."
    )


if __name__ == "__main__":
    main()
