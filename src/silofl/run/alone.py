""""How does this compare with training alone?": the same sites, split and rounds trained by each site on its own
data without DP (Regular, privacy off) — the line a collaboration under a budget has to beat."""

from __future__ import annotations

import json
from pathlib import Path

from silofl.run.config import RunConfig


def alone_config(cfg: RunConfig, split_seed: int | None) -> RunConfig:
    """Regular without DP on ``cfg``'s split (same data, clients, examples, rounds, private architecture)."""
    flat = {k: getattr(cfg, k) for k in ("dataset", "data_dir", "clients", "rounds", "seed", "partition", "p_major",
                                         "dirichlet_alpha", "samples_per_client", "batch_size", "threads", "test_limit",
                                         "device", "image_size", "max_bag_size")}
    model = getattr(cfg.options, "private_model", None) or getattr(cfg.options, "proxy_model", None)
    lr = getattr(cfg.options, "lr", None)
    return RunConfig.from_dict({**flat, "method": "regular", "privacy": "off", "split_seed": split_seed,
                                "eval_every": cfg.rounds, "out": str(Path(cfg.out) / "alone"),
                                **({"private_model": model} if model else {}), **({"lr": lr} if lr else {})},
                               strict=False)


def compare_with_alone(cfg: RunConfig, summary: dict, console=None) -> dict:
    """Run the go-it-alone baseline into ``OUT/alone`` and add the comparison to ``OUT/summary.json``."""
    from silofl.run.loop import run

    alone = run(alone_config(cfg, summary.get("data_split_seed")), progress=False)
    base = alone["final"]["private_acc"]["mean"]
    fin = summary["final"]
    mine = {k: fin[k]["mean"] for k in fin if k.endswith("_acc") and isinstance(fin[k], dict) and
            fin[k].get("mean") is not None}
    eps = fin["epsilon"]["mean"]
    result = {"alone_private_acc": base, "alone_run": str(Path(cfg.out) / "alone"), "this_run": mine,
              "difference": {k: v - base for k, v in mine.items()}, "epsilon": eps,
              "note": "training alone: Regular without DP on the same split, examples, rounds and architecture"}
    path = Path(cfg.out) / "summary.json"
    data = json.loads(path.read_text())
    data["vs_alone"] = result
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    if console is not None:
        parts = ", ".join(f"{k.removesuffix('_acc')} {v:.3f} ({v - base:+.3f})" for k, v in mine.items())
        eps_txt = f" at ε = {eps:.2f}" if eps is not None else ""
        console.print(f"[bold]vs training alone[/] (Regular, no DP, same split and rounds: {base:.3f}): {parts}{eps_txt}")
    return result
