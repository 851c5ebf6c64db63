"""Are seeded results bit-identical between two commits? Runs a fixed set of seeded configurations (every
method, and the options that change what a method computes) through the CLI of each tree and compares
every accuracy, ε and byte count of ``metrics.jsonl`` and the final per-client figures exactly, plus the
PubSub-ML quick scenarios' result tables.

    python bench/identical.py --base 109c62e            # the base commit against the working tree
    python bench/identical.py --base A --head B         # two commits

Each commit is checked out into a temporary git worktree and run with this checkout's virtual
environment (``PYTHONPATH=<tree>/src``), one torch thread per run, so the comparison is of code, not of
machines. Exit code 0 when everything is identical, 1 otherwise; the differences are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
COMMON = {
    "dataset": "digits",
    "clients": 4,
    "rounds": 4,
    "samples_per_client": 120,
    "batch_size": 30,
    "delta": 1e-3,
    "test_limit": 300,
    "eval_every": 2,
    "threads": 1,
    "seed": 3,
}
BASE = {**COMMON, "private_model": "cnn1", "proxy_model": "mlp"}  # methods with a private and a shared model
SHARED = {**COMMON, "proxy_model": "mlp"}  # one shared model
PRIVATE = {**COMMON, "private_model": "cnn1"}  # one private model
CLIENT_LEVEL = {**COMMON, "proxy_model": "mlp256", "local_lr": 0.1}
CASES: dict[str, dict] = {
    **{m: {**BASE, "method": m} for m in ("proxyfl", "fml")},
    **{m: {**SHARED, "method": m} for m in ("fedavg", "avgpush", "cwt")},
    **{m: {**PRIVATE, "method": m} for m in ("regular", "joint")},
    **{
        m: {**CLIENT_LEVEL, "method": m}
        for m in ("dp-fedavg", "dp-fedadam", "dp-fednova", "dp2-rmsprop", "fedadam", "fednova", "rmsprop")
    },
    "proxyfl-paper": {**BASE, "method": "proxyfl", "privacy": "paper"},
    "proxyfl-off": {**BASE, "method": "proxyfl", "privacy": "off"},
    "proxyfl-options": {
        **BASE,
        "method": "proxyfl",
        "self_weight": 0.5,
        "graph": "ring",
        "optimizer_state": "keep",
        "accountant": "prv",
        "private_models": ["mlp", "cnn1", "lenet5", "cnn2"],
        "dml_alpha": 0.3,
    },
    "proxyfl-budgets": {
        **BASE,
        "method": "proxyfl",
        "target_epsilons": [2.0, 3.0, 50.0, 50.0],
        "rounds": 6,
        "noise_multiplier": 1.0,
    },  # σ given: the budgets only stop clients (no calibration)
    "proxyfl-iid-dirichlet": {**BASE, "method": "proxyfl", "partition": "dirichlet", "dirichlet_alpha": 0.3},
    "fedavg-uniform": {
        **SHARED,
        "method": "fedavg",
        "aggregation": "uniform",
        "partition": "iid",
        "noise_multiplier": 0.7,
    },
    "fml-paper": {**BASE, "method": "fml", "privacy": "paper", "dml_beta": 0.3},
    "cwt-one": {**SHARED, "method": "cwt", "cwt_visits": 1, "target_epsilon": 4.0, "noise_multiplier": 1.0},
    "regular-off": {**PRIVATE, "method": "regular", "privacy": "off", "lr": 0.003, "weight_decay": 0.0},
    "dp-fedavg-adaptive": {
        **CLIENT_LEVEL,
        "method": "dp-fedavg",
        "intermediaries": "adaptive",
        "adaptive_clip": True,
        "client_rate": 0.8,
        "rounds": 6,
    },
    "dp-fedavg-subclient": {
        **CLIENT_LEVEL,
        "method": "dp-fedavg",
        "intermediaries": 2,
        "privacy_unit": "subclient",
        "clip": 0.5,
    },
    "dp-fedadam-budget": {
        **CLIENT_LEVEL,
        "method": "dp-fedadam",
        "target_epsilon": 30.0,
        "rounds": 8,
        "noise_multiplier": 0.6,
        "bias_correction": True,
    },
    "dp2-rmsprop-delay": {
        **CLIENT_LEVEL,
        "method": "dp2-rmsprop",
        "dp2_delay": 2,
        "intermediaries": 3,
        "local_epochs": 2,
    },
    "proxyfl-bags-site": {
        "method": "proxyfl",
        "dataset": "bags",
        "partition": "site",
        "clients": 3,
        "rounds": 3,
        "batch_size": 8,
        "delta": 1e-3,
        "private_model": "deepset",
        "proxy_model": "deepset",
        "max_bag_size": 8,
        "threads": 1,
        "seed": 1,
    },
}
SCENARIOS = ("iid", "non-iid", "distributed-features", "regression", "stream", "noisy-sites")


def write_bags(path: Path) -> None:
    """A deterministic bags file (5 sites × 24 bags of 3–9 instances) for the bags/site case."""
    rng = np.random.default_rng(0)
    feats, bag, labels, site = [], [], [], []
    b = 0
    for s in "ABCDE":
        for _ in range(24):
            y = int(rng.integers(0, 2))
            x = rng.normal(0, 1, (int(rng.integers(3, 10)), 4))
            x[:, 0] += 1.5 if y else -1.5
            feats.append(x)
            bag += [b] * len(x)
            labels.append(y)
            site.append(s)
            b += 1
    np.savez(
        path, features=np.concatenate(feats), bag=np.array(bag), labels=np.array(labels), sites=np.array(site)
    )


def run_tree(src: Path, out: Path, bags: Path) -> dict[str, str]:
    """Run every case and scenario with the package at ``src``; {case: error} for the ones that failed."""
    import yaml

    env = {**os.environ, "PYTHONPATH": str(src), "SILOFL_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1"}
    out.mkdir(parents=True, exist_ok=True)

    def one(name: str, cmd: list[str]) -> tuple[str, str | None]:
        res = subprocess.run(
            [sys.executable, "-m", "silofl.cli.main", *cmd], env=env, capture_output=True, text=True, cwd=out
        )
        return name, None if res.returncode == 0 else (res.stdout + res.stderr)[-1500:]

    jobs = []
    for name, case in CASES.items():
        cfg = dict(case)
        if cfg["dataset"] == "bags":
            cfg["data_dir"] = str(bags)
        (out / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
        jobs.append((name, ["run", "--config", f"{name}.yaml", "--out", f"runs/{name}", "--quiet"]))
    for s in SCENARIOS:
        jobs.append((f"scenario-{s}", ["pubsub", "scenario", s, "--quick", "--out", f"scenarios/{s}"]))
    with ThreadPoolExecutor(max_workers=2) as pool:
        return {n: e for n, e in pool.map(lambda j: one(*j), jobs) if e is not None}


KEYS = ("private_acc", "proxy_acc", "global_acc", "epsilon", "delta", "bytes_sent", "bytes_received")


def compare(a: Path, b: Path) -> list[str]:
    diffs = []
    for name in CASES:
        ra, rb = a / "runs" / name, b / "runs" / name
        if not (ra / "metrics.jsonl").is_file() or not (rb / "metrics.jsonl").is_file():
            diffs.append(f"{name}: missing run folder")
            continue
        ma = [json.loads(x) for x in (ra / "metrics.jsonl").read_text().splitlines()]
        mb = [json.loads(x) for x in (rb / "metrics.jsonl").read_text().splitlines()]
        if len(ma) != len(mb):
            diffs.append(f"{name}: {len(ma)} vs {len(mb)} metric records")
            continue
        for x, y in zip(ma, mb, strict=True):
            keys = [k for k in x if k in KEYS or k.endswith("_internal") or k.startswith("epsilon_")]
            bad = [k for k in keys if x.get(k) != y.get(k)]
            if bad or (x["round"], x["client"]) != (y["round"], y["client"]):
                diffs.append(
                    f"{name} round {x['round']} client {x['client']}: "
                    + ", ".join(f"{k} {x.get(k)} vs {y.get(k)}" for k in bad)
                )
                break
        fa = json.loads((ra / "summary.json").read_text())["final"]
        fb = json.loads((rb / "summary.json").read_text())["final"]
        for ca, cb in zip(fa["per_client"], fb["per_client"], strict=True):
            bad = [k for k in ca if (k in KEYS or k in ("left_at", "round")) and ca[k] != cb.get(k)]
            if bad:
                diffs.append(
                    f"{name} final client {ca['client']}: "
                    + ", ".join(f"{k} {ca[k]} vs {cb.get(k)}" for k in bad)
                )
    for s in SCENARIOS:
        pa, pb = a / "scenarios" / s / "table.csv", b / "scenarios" / s / "table.csv"
        if not pa.is_file() or not pb.is_file():
            diffs.append(f"scenario {s}: missing table")
        elif pa.read_text() != pb.read_text():
            diffs.append(f"scenario {s}: tables differ:\n{pa.read_text()}\n---\n{pb.read_text()}")
    return diffs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="commit to compare against")
    ap.add_argument("--head", default=None, help="commit to test (default: the working tree)")
    ap.add_argument("--keep", default=None, help="keep the run folders under this directory")
    args = ap.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="silofl-identical-"))
    work.mkdir(parents=True, exist_ok=True)
    bags = work / "bags.npz"
    write_bags(bags)
    trees = {}
    for label, rev in (("base", args.base), ("head", args.head)):
        if rev is None:
            trees[label] = ROOT / "src"
            continue
        wt = work / f"tree-{label}"
        if not wt.exists():
            subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], check=True, capture_output=True)
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(wt), rev],
                check=True,
                capture_output=True,
            )
        trees[label] = wt / "src"
    failed = {}
    for label, src in trees.items():
        print(f"running {len(CASES)} runs and {len(SCENARIOS)} scenarios with {label} ({src}) …", flush=True)
        failed.update({f"{label}/{k}": v for k, v in run_tree(src, work / label, bags).items()})
    for k, v in failed.items():
        print(f"FAILED {k}:\n{v}")
    diffs = compare(work / "base", work / "head")
    for d in diffs:
        print("DIFFERENT", d)
    for label in ("base", "head"):
        wt = work / f"tree-{label}"
        if wt.exists() and args.keep is None:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(wt)], capture_output=True
            )
    same = not diffs and not failed
    print(
        f"{len(CASES)} runs and {len(SCENARIOS)} PubSub-ML scenarios: "
        + (
            "identical (metrics.jsonl accuracies, ε, bytes; final figures; scenario tables)"
            if same
            else f"{len(diffs)} differences, {len(failed)} failures"
        )
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
