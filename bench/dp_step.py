"""DP-SGD step cost, measured side by side in one run (variants interleaved, medians reported).

    .venv/bin/python bench/dp_step.py [--batch 250] [--reps 30] [--threads N]

Prints ms per step and the ratio to the non-DP step for:
  * the MLP proxy step (784-200-200-10): non-DP, silofl ghost, silofl vmap, Opacus hooks;
  * the LeNet5 step: non-DP, silofl ghost (unfold conv norms), silofl vmap, Opacus hooks;
  * the Gaussian noise draw alone, for reference (part of every DP step, whatever the implementation);
  * the whole ProxyFL step (LeNet5 private non-DP + MLP proxy DP, KL both ways): non-DP vs silofl.
Target from the issue: silofl's DP proxy step ≤ 1.5× the non-DP step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from silofl.models import build_model
from silofl.privacy import DPGradient, NoiseSource
from silofl.training import dml_loss

warnings.filterwarnings("ignore")


def ce(logits, y):
    return F.cross_entropy(logits, y, reduction="none")


def nondp_step(model, opt):
    def step(x, y):
        opt.zero_grad(set_to_none=True)
        ce(model(x), y).mean().backward()
        opt.step()

    return step


def silofl_step(model, opt, backend, batch):
    dp = DPGradient(
        model,
        clip=1.0,
        noise_multiplier=1.0,
        expected_batch_size=batch,
        noise=NoiseSource(0),
        backend=backend,
        sample_rate=batch / 1000,
    )

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        dp.compute(x, ce, y)
        opt.step()

    return step


def opacus_step(model, batch):
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    gs = GradSampleModule(model)
    opt = DPOptimizer(
        torch.optim.Adam(gs.parameters(), lr=1e-3),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        expected_batch_size=batch,
    )

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        ce(gs(x), y).mean().backward()
        opt.step()

    return step


def proxyfl_step(private, proxy, dp: bool, batch):
    popt = torch.optim.Adam(private.parameters(), lr=1e-3, weight_decay=1e-4)
    xopt = torch.optim.Adam(proxy.parameters(), lr=1e-3, weight_decay=1e-4)
    dpg = DPGradient(proxy, 1.0, 1.0, batch, NoiseSource(0), sample_rate=batch / 1000) if dp else None

    def proxy_loss(logits, y, plogp):
        return dml_loss(logits, y, plogp, 0.5)

    def step(x, y):
        pl = private(x)
        plogp = F.log_softmax(pl.detach(), 1)
        xopt.zero_grad(set_to_none=True)
        if dpg:
            xl, _ = dpg.compute(x, proxy_loss, y, plogp)
        else:
            out = proxy(x)
            proxy_loss(out, y, plogp).mean().backward()
            xl = out.detach()
        xopt.step()
        popt.zero_grad(set_to_none=True)
        dml_loss(pl, y, F.log_softmax(xl, 1), 0.5).mean().backward()
        popt.step()

    return step


def noise_only(model):
    """Just the Gaussian draw DP-SGD must make for every parameter (the mechanism's own floor)."""
    src = NoiseSource(0)
    shapes = [tuple(p.shape) for p in model.parameters()]

    def step(x, y):
        for s in shapes:
            src.normal(s, 1.0)

    return step


def measure(variants: dict, x, y, reps: int) -> dict[str, float]:
    for f in variants.values():  # warm-up
        for _ in range(3):
            f(x, y)
    times = {k: [] for k in variants}
    for _ in range(reps):
        for k, f in variants.items():  # interleaved: machine noise hits all variants alike
            t = time.perf_counter()
            f(x, y)
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) * 1000 for k, v in times.items()}


def report(title, ms: dict, base: str):
    print(f"\n{title}")
    for k, v in ms.items():
        print(f"  {k:<28} {v:8.2f} ms   {v / ms[base]:6.2f}× non-DP")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=250)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, help="also write the medians and ratios to this JSON file")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    x, y = torch.rand(a.batch, 1, 28, 28), torch.randint(0, 10, (a.batch,))
    results: dict[str, dict[str, float]] = {}
    print(
        f"batch {a.batch}, torch {torch.__version__}, {torch.get_num_threads()} threads, {a.reps} "
        f"interleaved reps, medians"
    )

    for name in ("mlp", "lenet5"):
        models = {k: build_model(name, (1, 28, 28), 10) for k in ("nondp", "ghost", "vmap", "opacus")}
        variants = {
            "non-DP": nondp_step(models["nondp"], torch.optim.Adam(models["nondp"].parameters(), lr=1e-3)),
            "silofl DP (ghost norms)": silofl_step(
                models["ghost"], torch.optim.Adam(models["ghost"].parameters(), lr=1e-3), "ghost", a.batch
            ),
            "silofl DP (vmap)": silofl_step(
                models["vmap"], torch.optim.Adam(models["vmap"].parameters(), lr=1e-3), "vmap", a.batch
            ),
            "Opacus hooks": opacus_step(models["opacus"], a.batch),
            "(noise draw alone)": noise_only(models["nondp"]),
        }
        results[f"{name} step"] = measure(variants, x, y, a.reps)
        report(f"{name} step", results[f"{name} step"], "non-DP")

    variants = {
        "non-DP": proxyfl_step(
            build_model("lenet5", (1, 28, 28), 10), build_model("mlp", (1, 28, 28), 10), False, a.batch
        ),
        "silofl DP proxy": proxyfl_step(
            build_model("lenet5", (1, 28, 28), 10), build_model("mlp", (1, 28, 28), 10), True, a.batch
        ),
    }
    key = "ProxyFL step (LeNet5 private non-DP + MLP proxy, KL both ways)"
    results[key] = measure(variants, x, y, a.reps)
    report(key, results[key], "non-DP")
    if a.json:
        meta = {
            "batch": a.batch,
            "reps": a.reps,
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
        }
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"meta": meta, "ms": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
