"""``silofl tune``: choose a method's settings for a privacy budget without touching the test set.

Every trial is a budget-first run (σ set from ``--target-epsilon`` and the trial's own rounds and sampling rate)
scored on the **validation split** (``eval_split: validation``): training examples of the pooled data set that no
client holds, standing for public data of the same kind. The test split is never read by a trial. The trial with
the best mean headline accuracy (the method's own: ``private_acc`` for ProxyFL, ``global_acc`` for FedAvg, …) is
written to ``OUT/best.yaml`` with ``eval_split: test``, ready for one final run.

What tuning costs. Validation data being public does not make tuning free: every trial trains on the clients'
private data, and picking the best one is a function of all of them. ``tune.json`` states the tuning-inclusive
spend of each party — the RDP composition of every trial's mechanisms (what each party's accountant would have
recorded had all trials been one run), at the run's δ. That bound holds for anything released from any or all
trials, the chosen one included. (Papernot & Steinke 2022 give much smaller bounds when the *number* of trials is
random; a fixed grid, as here, is accounted by plain composition.)
"""

from __future__ import annotations

import csv
import itertools
import json
import time
from pathlib import Path
from typing import Any

import yaml

from silofl.core.errors import ConfigError
from silofl.privacy.analysis import epsilon_of
from silofl.run.config import RunConfig


def parse_grid(items: list[str]) -> dict[str, list[Any]]:
    """``["lr=0.001,0.003", "rounds=10,30"]`` → {"lr": [0.001, 0.003], "rounds": [10, 30]} (YAML values)."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key.strip() or not values.strip():
            raise ConfigError(f"a grid entry is KEY=V1,V2,…; got {item!r}")
        grid[key.strip().replace("-", "_")] = [yaml.safe_load(v) for v in values.split(",")]
    return grid


def trials(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid's values."""
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(grid[k] for k in keys))]


def _label(combo: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in combo.items()) or "base"


def tuning_cost(summaries: list[dict]) -> dict[str, Any]:
    """Each party's ε at δ for the composition of every trial it took part in (see the module doc)."""
    histories: dict[str, list] = {}
    kinds: dict[str, str] = {}
    delta = None
    for s in summaries:
        for a in s.get("accounting", []):
            hist = a.get("history") or a.get("history_hospital")
            if not hist:
                continue
            party = f"client{a['client']}" if "client" in a else str(a.get("party", "server"))
            histories.setdefault(party, []).extend(tuple(h) for h in hist)
            kinds[party] = "prv" if a.get("accountant") == "opacus.prv" else "rdp"
            delta = a["delta"]
    if delta is None:
        return {"per_party": {}, "max": None, "delta": None}
    per = {p: epsilon_of(kinds[p], tuple(h), delta) for p, h in histories.items()}
    return {"per_party": per, "max": max(per.values()), "delta": delta, "trials": len(summaries),
            "method": "RDP composition of every trial's (σ, q, steps) per party"}


def tune(base: RunConfig, grid: dict[str, list[Any]], out: str | Path, progress: bool = False, console=None) -> dict:
    """Run every grid combination of ``base`` on the validation split; write ``OUT/tune.json``, ``tune.md`` and
    ``best.yaml``; return the result."""
    from silofl.run.loop import run

    out = Path(out)
    if (out / "tune.json").exists():
        raise ConfigError(f"{out} already holds a tuning result; choose another --out")
    if base.eval_split != "validation":
        base = base.replace(eval_split="validation")
    combos = trials(grid)
    if not combos:
        raise ConfigError("the grid is empty")
    headline = base.info.headline
    rows, summaries = [], []
    for i, combo in enumerate(combos):
        cfg = base.replace(**combo, out=str(out / "trials" / f"trial{i}"))
        cfg = cfg.replace(eval_every=cfg.rounds)  # scored once, at the end: the validation score of what it releases
        if cfg.eval_split != "validation":
            raise ConfigError("a tuning trial must be scored on the validation split, never the test split")
        t0 = time.perf_counter()
        s = run(cfg, progress=progress, console=console)
        summaries.append(s)
        score = s["final"].get(headline, {}).get("mean")
        rows.append({"trial": i, "settings": combo, "validation": score, "epsilon": s["final"]["epsilon"]["mean"],
                     "noise_multiplier": (s["privacy"].get("noise_calibration") or {}).get("noise_multiplier"),
                     "seconds": time.perf_counter() - t0, "test_set": s["test_set"]})
        if console is not None:
            shown = "—" if score is None else f"{score:.4f}"
            console.print(f"trial {i} {_label(combo)}: validation {headline} {shown}")
    best = max(rows, key=lambda r: -1.0 if r["validation"] is None else r["validation"])
    best_cfg = base.replace(**best["settings"]).replace(eval_split="test")
    cost = tuning_cost(summaries)
    result = {"method": base.method, "headline": headline, "target_epsilon": base.target_epsilon, "grid": grid,
              "validation_split": rows[0]["test_set"], "trials": rows, "best": best, "tuning_cost": cost,
              "seconds": sum(r["seconds"] for r in rows)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "tune.json").write_text(json.dumps(result, indent=1, default=str))
    best_dict = best_cfg.to_dict()
    best_dict.pop("out", None)
    (out / "best.yaml").write_text(yaml.safe_dump(best_dict, sort_keys=False))
    (out / "tune.md").write_text(markdown(result))
    with open(out / "tune.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["trial", "settings", "noise_multiplier", "validation", "epsilon", "seconds"])
        for r in rows:
            w.writerow([r["trial"], json.dumps(r["settings"]), r["noise_multiplier"], r["validation"], r["epsilon"],
                        r["seconds"]])
    return result


def markdown(result: dict) -> str:
    """The tuning result as a Markdown table."""
    lines = [f"# Tuning {result['method']} at ε = {result['target_epsilon']} ({result['headline']} on the validation "
             "split)", "", f"Validation split: {result['validation_split']}.", "",
             "| trial | settings | σ | validation | ε (run) |", "|---|---|---|---|---|"]
    for r in result["trials"]:
        sigma = f"{r['noise_multiplier']:.3f}" if r["noise_multiplier"] else "—"
        val = f"{r['validation']:.4f}" if r["validation"] is not None else "—"
        eps = f"{r['epsilon']:.3f}" if r["epsilon"] is not None else "—"
        lines.append(f"| {r['trial']} | {_label(r['settings'])} | {sigma} | {val} | {eps} |")
    c = result["tuning_cost"]
    lines += ["", f"Best: {_label(result['best']['settings'])}.", ""]
    if c["max"] is not None:
        lines.append(f"Tuning-inclusive spend (every trial composed, δ = {c['delta']:g}): ε ≤ {c['max']:.3f} per party "
                     f"over {c['trials']} trials.")
    return "\n".join(lines) + "\n"

