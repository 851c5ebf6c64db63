"""A silofl ProxyFL round vs the same round written the obvious way on Opacus ``make_private`` (hooks).

    .venv/bin/python bench/proxyfl_round.py [--rounds 5] [--privacy paper] [--threads N]

Both sides: Fashion-MNIST, 8 clients × 1000 examples (p_major 0.8), LeNet5 private / MLP proxy, Poisson
batches with q = 250/1000, σ = C = 1, Adam 1e-3, one epoch per round, proxies exchanged on the
exponential graph, ε asked once per round. Evaluation is excluded from both. Rounds are interleaved
(silofl, Opacus, silofl, …) and the medians compared. Target from the issue: silofl ≥ 5× faster.
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
from silofl.runner.config import RunConfig
from silofl.runner.loop import build
from silofl.topology import ExponentialGraph
from silofl.training import dml_loss

warnings.filterwarnings("ignore")


class OpacusProxyFL:
    """The straightforward implementation: one PrivacyEngine per client, GradSampleModule hooks."""

    def __init__(self, parts, cfg: RunConfig):
        o = cfg.options
        from opacus import PrivacyEngine
        from torch.utils.data import DataLoader, TensorDataset

        self.cfg = cfg
        self.clients = []
        for k, (x, y) in enumerate(parts):
            torch.manual_seed(k)
            private = build_model(o.private_model, tuple(x.shape[1:]), 10)
            proxy = build_model(o.proxy_model, tuple(x.shape[1:]), 10)
            popt = torch.optim.Adam(private.parameters(), lr=o.lr, weight_decay=o.weight_decay)
            xopt = torch.optim.Adam(proxy.parameters(), lr=o.lr, weight_decay=o.weight_decay)
            engine = PrivacyEngine(accountant="rdp")
            loader = DataLoader(TensorDataset(x, y), batch_size=cfg.batch_size)
            proxy, xopt, loader = engine.make_private(
                module=proxy,
                optimizer=xopt,
                data_loader=loader,
                noise_multiplier=cfg.noise_multiplier,
                max_grad_norm=cfg.clip,
                poisson_sampling=True,
            )
            self.clients.append(
                dict(private=private, proxy=proxy, popt=popt, xopt=xopt, engine=engine, loader=loader)
            )
        self.graph = ExponentialGraph()

    def run_round(self, rnd: int) -> None:
        a, b = self.cfg.options.dml_alpha, self.cfg.options.dml_beta
        for c in self.clients:
            for xb, yb in c["loader"]:
                if len(yb) == 0:
                    continue
                pl, xl = c["private"](xb), c["proxy"](xb)
                lp = dml_loss(pl, yb, F.log_softmax(xl.detach(), 1), a).mean()
                lx = dml_loss(xl, yb, F.log_softmax(pl.detach(), 1), b).mean()
                c["popt"].zero_grad()
                c["xopt"].zero_grad()
                lp.backward()
                lx.backward()
                c["popt"].step()
                c["xopt"].step()
            c["eps"] = c["engine"].get_epsilon(self.cfg.delta)
        out = self.graph.out_neighbors(rnd, list(range(len(self.clients))))
        states = [{k: v.clone() for k, v in c["proxy"]._module.state_dict().items()} for c in self.clients]
        for src, dsts in out.items():
            for d in dsts:
                self.clients[d]["proxy"]._module.load_state_dict(states[src])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--privacy", default="paper", choices=["paper", "strict"])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, help="also write the timings to this JSON file")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg, split, ours, engine = build(RunConfig(privacy=args.privacy, rounds=args.rounds))
    sites = [engine.sites[k] for k in sorted(engine.sites)]
    theirs = OpacusProxyFL(split.parts, cfg)
    ours.run_round(0)
    theirs.run_round(0)  # warm-up
    t_ours, t_theirs = [], []
    for r in range(1, args.rounds + 1):
        t = time.perf_counter()
        ours.run_round(r)
        for c in sites:
            c.epsilon()
        t_ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        theirs.run_round(r)
        t_theirs.append(time.perf_counter() - t)
    mo, mt = statistics.median(t_ours), statistics.median(t_theirs)
    print(
        f"ProxyFL round, 8 clients, privacy {args.privacy}, {torch.get_num_threads()} threads, {args.rounds} "
        f"interleaved rounds, medians:"
    )
    print(
        f"  silofl                      {mo:7.3f} s/round   (per-round "
        f"{', '.join(f'{x:.2f}' for x in t_ours)})"
    )
    print(
        f"  Opacus make_private (hooks) {mt:7.3f} s/round   (per-round "
        f"{', '.join(f'{x:.2f}' for x in t_theirs)})"
    )
    print(f"  speed-up: {mt / mo:.2f}×")
    print(
        f"  ε after {args.rounds + 1} rounds: silofl {sites[0].epsilon():.3f}, Opacus "
        f"{theirs.clients[0]['eps']:.3f}"
    )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(
            json.dumps(
                {
                    "privacy": args.privacy,
                    "threads": torch.get_num_threads(),
                    "rounds": args.rounds,
                    "silofl_s_per_round": t_ours,
                    "opacus_s_per_round": t_theirs,
                    "silofl_median_s": mo,
                    "opacus_median_s": mt,
                    "speedup": mt / mo,
                    "epsilon_silofl": sites[0].epsilon(),
                    "epsilon_opacus": theirs.clients[0]["eps"],
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
