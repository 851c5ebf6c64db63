"""The tabular example: Palmer penguins, one site per island, every protocol on the same split.

The data are the ``palmerpenguins`` package's ``penguins.csv`` (344 penguins observed 2007–2009 at Palmer
Station, Antarctica, CC0): species (the target: Adelie, Chinstrap, Gentoo), four body measurements, sex
(11 missing) and the island. The island is the natural site: three field sites with very different species
mixes (Biscoe: Adelie and Gentoo; Dream: Adelie and Chinstrap; Torgersen: Adelie only), the kind of label
skew hospitals with different case mixes have. Each island's rows are written to its own file — Biscoe and
Dream as CSV, Torgersen as Parquet — checked against one schema (:data:`SCHEMA`: public bounds, numbers that
are missing drop their row, a missing sex is all zeros), and each site holds out ``test_fraction`` of its own
rows (:func:`silofl.data.sites.holdout`) as its internal test set.

Methods, every one on exactly those training and test rows:

* **Local** (``regular``, no DP): each site alone, the reference for what collaboration adds;
* **ProxyFL** (strict: private tabmlp + DP logreg proxy, PushSum), **FedAvg** (DP-SGD tabmlp, example level),
  **FedAvg, no DP**, **DP-FedAvg** (client level: one hospital = one island);
* **PubSub-ML**: every site publishes a DP-SGD network (``dp-nn``) on its training rows; every site then
  subscribes to the others' models and customizes on its own training rows (75 % own model, 25 % selection and
  fusion), tested on the same held-out rows.

Each is scored per site on its own held-out rows (*internal*) and on the union of every site's held-out rows
(*all islands*: could the site's model recognise a species it never sees at home?). ``results.json`` holds
every figure and every (ε, δ) from the runs' accountants.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path

import numpy as np

SCHEMA = {
    "target": {"name": "species", "levels": ["Adelie", "Chinstrap", "Gentoo"]},
    "features": {
        "bill_length_mm": {"type": "numeric", "bounds": [25, 65], "missing": "drop"},
        "bill_depth_mm": {"type": "numeric", "bounds": [10, 25], "missing": "drop"},
        "flipper_length_mm": {"type": "numeric", "bounds": [160, 240], "missing": "drop"},
        "body_mass_g": {"type": "numeric", "bounds": [2500, 6500], "missing": "drop"},
        "sex": {"type": "categorical", "levels": ["female", "male"], "missing": "impute"},
    },
    "ignore": ["island", "year"],
}
ISLANDS = {"Biscoe": "biscoe.csv", "Dream": "dream.csv", "Torgersen": "torgersen.parquet"}
NUMERIC = ["bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g"]


def write_sites(out: Path) -> tuple[Path, list[Path]]:
    """The schema and one file per island from the package's CSV (Torgersen as Parquet)."""
    import importlib.resources

    from silofl.core.extras import require

    require("palmerpenguins", "studies", "the tabular study (the penguins data)")
    import pandas as pd
    import yaml

    out.mkdir(parents=True, exist_ok=True)
    src = importlib.resources.files("palmerpenguins") / "data" / "penguins.csv"
    df = pd.read_csv(str(src), dtype=str, keep_default_na=False)
    paths = []
    for island, name in ISLANDS.items():
        part = df[df.island == island].copy()
        p = out / name
        if name.endswith(".parquet"):  # typed columns, real nulls: what a Parquet export carries
            for c in NUMERIC:
                part[c] = pd.to_numeric(part[c], errors="coerce")
            part["year"] = part["year"].astype("int64")
            part["sex"] = part["sex"].where(part["sex"] != "NA", None)
            part.to_parquet(p, index=False)
        else:
            part.to_csv(p, index=False)
        paths.append(p)
    schema = out / "schema.yaml"
    schema.write_text(yaml.safe_dump(SCHEMA, sort_keys=False, default_flow_style=None))
    return schema, paths


# ---------------------------------------------------------------------------------------------- FL methods
RECIPE = {
    "target_epsilon": 8.0,
    "optimizer": "sgd",
    "lr": 0.5,
    "clip": 1.0,
    "sample_rate": 0.5,
    "local_steps": 1,
}


def fl_methods(rounds: int, noise: float) -> dict[str, dict]:
    """Label -> run options (common: the study's data, seed, δ, threads)."""
    dp = {"noise_multiplier": noise}
    return {
        "Local (no DP)": {"method": "regular", "privacy": "off", "private_model": "tabmlp"},
        "ProxyFL": {"method": "proxyfl", "private_model": "tabmlp", "proxy_model": "logreg", **dp},
        "FedAvg": {"method": "fedavg", "proxy_model": "tabmlp", **dp},
        "FedAvg (no DP)": {"method": "fedavg", "proxy_model": "tabmlp", "privacy": "off"},
        # issue 24's DP-SGD recipe, budget first at ε ≤ 8 per site (σ set by the budget, not given): one DP
        # step a round with SGD, FedAvg's server momentum, ProxyFL's proxies on the complete graph (momentum
        # kept)
        "FedAvg (ε ≤ 8, recipe)": {
            "method": "fedavg",
            "proxy_model": "tabmlp",
            **RECIPE,
            "server_momentum": 0.9,
        },
        "ProxyFL (ε ≤ 8, recipe)": {
            "method": "proxyfl",
            "private_model": "tabmlp",
            "proxy_model": "logreg",
            **RECIPE,
            "momentum": 0.9,
            "optimizer_state": "keep",
            "graph": "complete",
            "self_weight": 1.0 / 3,
        },
        "DP-FedAvg": {
            "method": "dp-fedavg",
            "proxy_model": "tabmlp",
            "local_epochs": 1,
            "local_lr": 0.1,
            "server_lr": 1.0,
            **dp,
        },
    }


def run_fl(
    label: str,
    opts: dict,
    schema: Path,
    paths: list[Path],
    seed: int,
    rounds: int,
    delta: float,
    test_fraction: float,
    out: Path,
    lr: float,
) -> list[dict]:
    """One federated method on the island tables for one seed; per-method rows of per-site accuracies and
    ε."""
    from silofl.api import RunConfig
    from silofl.api import run as simulate

    cfg = RunConfig.from_dict(
        {
            "dataset": "table",
            "schema": str(schema),
            "site_data": [str(p) for p in paths],
            "seed": seed,
            "rounds": rounds,
            "delta": delta,
            "test_fraction": test_fraction,
            "threads": 1,
            "eval_every": rounds,
            "out": str(out),
            **opts,
        }
    )
    if "lr" not in opts and cfg.info.client_level is False:
        cfg = cfg.replace(lr=lr)
    t0 = time.perf_counter()
    s = simulate(cfg, quiet=True, overwrite=out.exists()).summary
    seconds = time.perf_counter() - t0
    rows = s["final"]["per_client"]
    priv = s["privacy"]
    if priv["mode"] == "off":
        eps = None
    elif "epsilon_hospital" in priv:
        eps = [priv["epsilon_hospital"]] * len(rows)
    else:
        eps = [r["epsilon"] for r in rows]
    out_rows = []
    fields = [cfg.info.headline] + (["proxy_acc"] if cfg.method == "proxyfl" else [])
    for field in fields:
        role = field.removesuffix("_acc")
        dp_model = eps is not None and (
            cfg.is_client_level or any(a.get("dp_model") == role for a in s["accounting"])
        )
        out_rows.append(
            {
                "method": label if field == cfg.info.headline else f"{label} ({role})",
                "seed": seed,
                "internal": [r[f"{field}_internal"] for r in rows],
                "all": [r[field] for r in rows],
                "epsilon": eps,
                "delta": priv["delta"],
                "unit": priv["unit"],
                "formal": priv["formal_guarantee"],
                "model_is_dp": dp_model,
                "seconds": seconds,
                "model": role,
                "run": str(out),
            }
        )
    return out_rows


# ---------------------------------------------------------------------------------------------- PubSub-ML
def run_pubsub(
    schema_path: Path,
    paths: list[Path],
    seed: int,
    epsilon: float,
    delta: float,
    test_fraction: float,
    epochs: int,
) -> dict:
    """PubSub-ML on the island tables for one seed: each site publishes a DP model and customizes the
    others'."""
    from silofl.data.schema import Schema, read_table
    from silofl.data.sites import holdout
    from silofl.pubsub.customize import LocalData, customize
    from silofl.pubsub.dp_models import Bounds, train
    from silofl.pubsub.tables import encode

    t0 = time.perf_counter()
    schema = Schema.load(schema_path)
    sites = []
    for k, p in enumerate(paths):
        raw, y, _ = schema.check(read_table(p), str(p))
        assert y is not None
        t = encode(schema, raw, y)
        tr, te = holdout(len(y), test_fraction, seed, k, str(p))  # the FL runs' split
        sites.append((t, tr, te))
    names = [Path(p).stem for p in paths]
    published = [
        train(
            "dp-nn",
            t.x[tr],
            t.y[tr],
            publisher=names[k],
            features=t.features,
            task="classification",
            bounds=Bounds(t.lo, t.hi),
            epsilon=epsilon,
            delta=delta,
            classes=t.classes,
            seed=seed * 10 + k,
            epochs=epochs,
            hidden=32,
            batch_size=16,
            lr=0.05,
        )
        for k, (t, tr, _) in enumerate(sites)
    ]
    x_all = np.concatenate([t.x[te] for t, _, te in sites])
    y_all = np.concatenate([t.y[te] for t, _, te in sites])
    internal, union, own = [], [], []
    for k, (t, tr, te) in enumerate(sites):
        perm = np.random.default_rng([seed, k, 7]).permutation(tr)
        cut = int(round(0.75 * len(perm)))
        others = [m for j, m in enumerate(published) if j != k]
        res = customize(
            others,
            LocalData(t.x, t.y, t.features, "classification", t.classes),
            dict(zip(t.features, t.defaults.tolist(), strict=True)),
            seed=seed,
            idx=(np.sort(perm[:cut]), np.sort(perm[cut:]), te),
        )
        internal.append(res.report["test"])
        union.append(float((res.predict(x_all) == y_all).mean()))
        own.append(res.report["own_test"])
    return {
        "method": "PubSub-ML",
        "seed": seed,
        "internal": internal,
        "all": union,
        "epsilon": [m.epsilon for m in published],
        "delta": delta,
        "unit": "one training row of the publishing site (example-level DP-SGD, per publisher)",
        "formal": True,
        "model_is_dp": False,
        "seconds": time.perf_counter() - t0,
        "model": "customized (others' DP models + own)",
        "noise_multipliers": [m.mechanism["noise_multiplier"] for m in published],
        "own_internal": own,
    }


# ---------------------------------------------------------------------------------------------- the study
def summarise(rows: list[dict]) -> dict:
    """Per method: mean ± std over seeds of the site-mean accuracies, per-site means, ε range."""
    out: dict[str, dict] = {}
    for label in dict.fromkeys(r["method"] for r in rows):
        rs = [r for r in rows if r["method"] == label]
        n_sites = len(rs[0]["internal"])

        def ms(values):
            return {
                "mean": statistics.fmean(values),
                "std": statistics.pstdev(values) if len(values) > 1 else 0.0,
            }

        eps = [e for r in rs for e in (r["epsilon"] or [])]
        out[label] = {
            "internal": ms([statistics.fmean(r["internal"]) for r in rs]),
            "all": ms([statistics.fmean(r["all"]) for r in rs]),
            "internal_per_site": [statistics.fmean(r["internal"][k] for r in rs) for k in range(n_sites)],
            "all_per_site": [statistics.fmean(r["all"][k] for r in rs) for k in range(n_sites)],
            "epsilon_min": min(eps) if eps else None,
            "epsilon_max": max(eps) if eps else None,
            "delta": rs[0]["delta"],
            "unit": rs[0]["unit"],
            "formal": rs[0]["formal"],
            "model": rs[0]["model"],
            "model_is_dp": rs[0]["model_is_dp"],
            "seconds": ms([r["seconds"] for r in rs]),
            "seeds": len(rs),
        }
    return out


def run_study(
    out: Path,
    seeds: list[int],
    rounds: int,
    noise: float,
    delta: float,
    test_fraction: float,
    pubsub_epsilon: float,
    pubsub_epochs: int,
    lr: float,
) -> dict:
    """Every protocol over the seeds; writes and returns results.json (settings, site sizes, rows,
    summary)."""
    t0 = time.perf_counter()
    schema, paths = write_sites(out / "data")
    rows = []
    for seed in seeds:
        for label, opts in fl_methods(rounds, noise).items():
            slug = label.lower().replace(" ", "-").replace("(", "").replace(")", "")
            new = run_fl(
                label,
                opts,
                schema,
                paths,
                seed,
                rounds,
                delta,
                test_fraction,
                out / "runs" / slug / f"seed{seed}",
                lr,
            )
            rows += new
            for r in new:
                print(
                    f"seed {seed} {r['method']}: internal {statistics.fmean(r['internal']):.3f}, all islands "
                    f"{statistics.fmean(r['all']):.3f}, ε ≤ {max(r['epsilon']) if r['epsilon'] else '—'}, "
                    f"{r['seconds']:.1f} s",
                    flush=True,
                )
        rows.append(run_pubsub(schema, paths, seed, pubsub_epsilon, delta, test_fraction, pubsub_epochs))
        print(
            f"seed {seed} PubSub-ML: internal {statistics.fmean(rows[-1]['internal']):.3f}, "
            f"{rows[-1]['seconds']:.1f} s",
            flush=True,
        )
    from silofl.data.schema import Schema, read_table
    from silofl.data.sites import holdout

    sch = Schema.load(schema)
    sizes = []
    for k, p in enumerate(paths):
        raw, y, dropped = sch.check(read_table(p), str(p))
        assert y is not None
        tr, te = holdout(len(y), test_fraction, seeds[0], k, str(p))
        sizes.append(
            {
                "site": p.stem,
                "file": p.name,
                "rows": len(y) + dropped,
                "dropped": dropped,
                "train": len(tr),
                "test": len(te),
                "classes": {c: int((y == i).sum()) for i, c in enumerate(sch.classes)},
            }
        )
    from silofl.runner.folder import read_config

    first = read_config(rows[0]["run"])  # as it ran (the batch size the run planned: plan.json)
    result = {
        "setting": {
            "batch_size": first["batch_size"],
            "seeds": seeds,
            "rounds": rounds,
            "noise_multiplier": noise,
            "delta": delta,
            "test_fraction": test_fraction,
            "pubsub_epsilon": pubsub_epsilon,
            "pubsub_epochs": pubsub_epochs,
            "lr": lr,
            "threads": 1,
        },
        "sites": sizes,
        "schema": SCHEMA,
        "rows": rows,
        "summary": summarise(rows),
        "wall_seconds": time.perf_counter() - t0,
    }
    (out / "results.json").write_text(json.dumps(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> None:
    """Command line of the tabular study (bench/tabular_study.sh)."""
    ap = argparse.ArgumentParser(
        description="The tabular example (Palmer penguins by island), every protocol."
    )
    ap.add_argument("--out", default="reports/tabular")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--noise", type=float, default=1.5)
    ap.add_argument("--delta", type=float, default=1e-4)
    ap.add_argument("--test-fraction", type=float, default=0.25)
    ap.add_argument("--pubsub-epsilon", type=float, default=4.0)
    ap.add_argument("--pubsub-epochs", type=int, default=20)
    ap.add_argument("--lr", type=float, default=0.02, help="Adam learning rate of the example-level methods")
    ap.add_argument("--quick", action="store_true", help="2 rounds, one seed (a smoke test)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if (out / "runs").exists():
        shutil.rmtree(out / "runs")  # this study's own earlier runs only
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.quick:
        seeds, args.rounds, args.pubsub_epochs = seeds[:1], 2, 2
    res = run_study(
        out,
        seeds,
        args.rounds,
        args.noise,
        args.delta,
        args.test_fraction,
        args.pubsub_epsilon,
        args.pubsub_epochs,
        args.lr,
    )
    print(f"wrote {out / 'results.json'} ({res['wall_seconds']:.0f} s)")


if __name__ == "__main__":
    main()
