"""The search beyond the privacy-utility study's grid (issue 24): the DP-SGD recipe's other levers tried on
the validation split, seed 0 — never the test split. Each row is one run of the study's set-up (the scatter
stage, the method's fixed settings there) with the changes it names; the figures are validation accuracies.

    python -m studies.recipe_search --out runs/recipe_search

writes ``docs/data/recipe_search.json``, which ``studies.privacy_utility`` shows in its document.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from studies.privacy_utility import BASE, METHODS_SCATTER, SCATTER_HEADS

DOC_DATA = Path(__file__).resolve().parents[1] / "docs" / "data" / "recipe_search.json"
FEDAVG_8 = {"rounds": 50, "lr": 10.0}  # what the study's tuning chose for FedAvg at ε = 8 (and at 3: lr 3)
COMPLETE = {"graph": "complete", "self_weight": 1.0 / BASE["clients"]}
# (what it tries, study label, ε, the changes to that label's fixed settings)
SEARCH: list[tuple[str, str, float, dict]] = [
    ("FedAvg as tuned", "FedAvg", 8.0, FEDAVG_8),
    ("+ EMA 0.9", "FedAvg", 8.0, {**FEDAVG_8, "ema_decay": 0.9}),
    ("100 rounds", "FedAvg", 8.0, {**FEDAVG_8, "rounds": 100}),
    ("100 rounds + EMA 0.9", "FedAvg", 8.0, {**FEDAVG_8, "rounds": 100, "ema_decay": 0.9}),
    ("full batch (q = 1)", "FedAvg", 8.0, {**FEDAVG_8, "sample_rate": 1.0}),
    (
        "q = 1, 100 rounds + EMA 0.9",
        "FedAvg",
        8.0,
        {**FEDAVG_8, "sample_rate": 1.0, "rounds": 100, "ema_decay": 0.9},
    ),
    ("200 rounds + EMA 0.95", "FedAvg", 8.0, {**FEDAVG_8, "rounds": 200, "ema_decay": 0.95}),
    ("lr 30, 100 rounds + EMA 0.9", "FedAvg", 8.0, {"rounds": 100, "lr": 30.0, "ema_decay": 0.9}),
    ("FedAvg as tuned", "FedAvg", 3.0, {"rounds": 50, "lr": 3.0}),
    ("+ EMA 0.9", "FedAvg", 3.0, {"rounds": 50, "lr": 3.0, "ema_decay": 0.9}),
    ("lr 10, 100 rounds + EMA 0.9", "FedAvg", 3.0, {"rounds": 100, "lr": 10.0, "ema_decay": 0.9}),
    (
        "lr 10, q = 1 + EMA 0.9",
        "FedAvg",
        3.0,
        {"rounds": 50, "lr": 10.0, "sample_rate": 1.0, "ema_decay": 0.9},
    ),
    ("Joint, q = 1", "Joint", 8.0, {"rounds": 50, "lr": 10.0, "sample_rate": 1.0}),
    ("CWT, lr 3", "CWT", 8.0, {"rounds": 100, "lr": 3.0}),
    ("exponential graph, lr 1, α 0.5", "ProxyFL (strict)", 8.0, {"rounds": 100, "lr": 1.0, "dml_alpha": 0.5}),
    ("exponential, lr 0.3", "ProxyFL (strict)", 8.0, {"rounds": 100, "lr": 0.3, "dml_alpha": 0.5}),
    ("exponential, no momentum, lr 3", "ProxyFL (strict)", 8.0, {"rounds": 100, "lr": 3.0, "momentum": 0.0}),
    ("exponential, q = 1", "ProxyFL (strict)", 8.0, {"rounds": 100, "lr": 1.0, "sample_rate": 1.0}),
    ("exponential, EMA 0.9", "ProxyFL (strict)", 8.0, {"rounds": 100, "lr": 1.0, "ema_decay": 0.9}),
    (
        "exponential, self-weight 0, lr 3, α 0",
        "ProxyFL (strict)",
        8.0,
        {"rounds": 100, "lr": 3.0, "dml_alpha": 0.0, "self_weight": 0.0},
    ),
    ("exponential, lr 3, α 0", "ProxyFL (strict)", 8.0, {"rounds": 100, "lr": 3.0, "dml_alpha": 0.0}),
    (
        "exponential, momentum kept, lr 1, α 0",
        "ProxyFL (strict)",
        8.0,
        {"rounds": 100, "lr": 1.0, "dml_alpha": 0.0, "optimizer_state": "keep"},
    ),
    (
        "complete graph, momentum reset, lr 10, α 0",
        "ProxyFL (strict)",
        8.0,
        {**COMPLETE, "rounds": 50, "lr": 10.0, "dml_alpha": 0.0},
    ),
    (
        "complete graph, momentum kept, lr 10, α 0",
        "ProxyFL (strict)",
        8.0,
        {**COMPLETE, "rounds": 50, "lr": 10.0, "dml_alpha": 0.0, "optimizer_state": "keep"},
    ),
    (
        "complete graph, momentum kept, lr 3, α 0",
        "ProxyFL (strict)",
        8.0,
        {**COMPLETE, "rounds": 50, "lr": 3.0, "dml_alpha": 0.0, "optimizer_state": "keep"},
    ),
]


def _fixed(label: str) -> tuple[str, dict]:
    for lab, method, fixed, _ in METHODS_SCATTER:
        if lab == label:
            return method, fixed
    raise KeyError(label)


def _one(i: int, out: str) -> dict:
    """Run search row ``i`` (unless it finished) on the validation split; its row."""
    import torch

    from silofl.api import RunConfig, run

    torch.set_num_threads(1)
    what, label, eps, changes = SEARCH[i]
    method, fixed = _fixed(label)
    folder = Path(out) / f"row{i:02d}"
    if not (folder / "summary.json").exists():
        cfg = RunConfig.from_dict(
            {
                **BASE,
                **SCATTER_HEADS,
                **fixed,
                **changes,
                "method": method,
                "seed": 0,
                "target_epsilon": eps,
                "eval_split": "validation",
                "out": str(folder),
            },
            strict=False,
        )
        run(cfg.replace(eval_every=cfg.rounds), quiet=True, overwrite=folder.exists())
    s = json.loads((folder / "summary.json").read_text())
    accs = {k.removesuffix("_acc"): round(v["mean"], 4) for k, v in s["final"].items() if k.endswith("_acc")}
    return {
        "what": what,
        "label": label,
        "budget": eps,
        "changes": changes,
        "validation": accs,
        "epsilon": s["final"]["epsilon"]["mean"],
    }


def main(argv: list[str] | None = None) -> None:
    """Run (or pick up) every row and write the data file."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/recipe_search")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--data", default=str(DOC_DATA))
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=a.jobs) as ex:
        rows: list[Any] = list(ex.map(_one, range(len(SEARCH)), [a.out] * len(SEARCH)))
    data = {
        "command": f"python -m studies.recipe_search --out {a.out} --jobs {a.jobs}",
        "split": "validation (2000 Fashion-MNIST training images no site holds), seed 0",
        "seconds": round(time.perf_counter() - t0, 1),
        "rows": rows,
    }
    Path(a.data).parent.mkdir(parents=True, exist_ok=True)
    Path(a.data).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {a.data}", file=sys.stderr)


if __name__ == "__main__":
    main()
