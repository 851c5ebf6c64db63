"""Generate docs/privacy_utility.md: what each method reaches at ε = 1, 3, 8 per site, each tuned for the
budget on the validation split (never the test set), then run once on the test set.

    python -m studies.privacy_utility --out runs/privacy_utility [--jobs 2] [--seeds 0]
    python -m studies.privacy_utility --out runs/privacy_utility --report-only

For every (method, budget): ``silofl tune`` over the grid below on seed 0 (budget-first σ for each trial's
rounds),
the best trial's released models scored on the test split; every other seed runs those settings once on its
own
split and scores them on the test split. PubSub-ML (every site publishes a DP-SGD model at the budget and
fuses all
published models on its own data) runs at the pipeline's defaults, untuned. Everything is resumable: a
finished tuning or final run is
not run again. Fashion-MNIST, p_major 0.8, 8 clients × 1000 examples, δ = 1e-5, the papers' models (private
LeNet5,
shared MLP). Regular without DP is the "go it alone" line (no tuning: the papers' lr, the longest rounds of
the grid).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

BUDGETS = (1.0, 3.0, 8.0)
BASE: dict[str, Any] = {
    "dataset": "fashion-mnist",
    "clients": 8,
    "samples_per_client": 1000,
    "partition": "p_major",
    "p_major": 0.8,
    "delta": 1e-5,
    "threads": 1,
    "validation_size": 2000,
}
ROUNDS = [30, 100]
TUNE_SEED = 0  # settings are tuned on this seed's split; the other seeds re-run the settings it chose
# (label, method, fixed options, grid) per feature stage. The grids are deliberately small: 2 cores shared by
# several jobs. features none: the papers' models (private LeNet5, shared MLP) and recipe (Adam, lr 1e-3, clip
# 1, q = 0.25).
METHODS_NONE: list[tuple[str, str, dict, dict]] = [
    ("ProxyFL (strict)", "proxyfl", {}, {"rounds": ROUNDS, "dml_alpha": [0.0, 0.5]}),
    ("FML", "fml", {}, {"rounds": ROUNDS}),
    ("FedAvg", "fedavg", {}, {"rounds": ROUNDS}),
    ("AvgPush", "avgpush", {}, {"rounds": ROUNDS}),
    ("CWT", "cwt", {}, {"rounds": ROUNDS}),
    ("Regular", "regular", {}, {"rounds": ROUNDS}),
    ("Joint", "joint", {}, {"rounds": ROUNDS}),
    ("DP-FedAvg (no intermediaries)", "dp-fedavg", {"intermediaries": "none"}, {"rounds": ROUNDS}),
    ("DP-FedAvg (adaptive intermediaries)", "dp-fedavg", {"intermediaries": "adaptive"}, {"rounds": ROUNDS}),
]
# features scatter (Tramèr & Boneh): ScatterNet J = 2 + GroupNorm, linear heads, the DP-SGD recipe — SGD with
# momentum, clip 0.1, q = 0.5; the server methods take one local DP step per round (the sites' noise averaged
# every step) and server momentum; every site also fits the combination of its own non-DP model with the DP
# model(s) it holds on 20 % of its rows (combined_acc: post-processing, non-private, stays at the site).
SCATTER_HEADS = {"features": "scatter", "private_model": "linear", "proxy_model": "linear"}
PRIVATE_LR = (
    0.003  # the non-DP models' Adam lr on features (a private model, the combination's own model, alone)
)
SGD = {"optimizer": "sgd", "momentum": 0.9, "clip": 0.1, "sample_rate": 0.5, "private_lr": PRIVATE_LR}
SERVER = {
    "optimizer": "sgd",
    "clip": 0.1,
    "sample_rate": 0.5,
    "local_steps": 1,
    "server_momentum": 0.9,
    "private_lr": PRIVATE_LR,
}
GOSSIP = {**SGD, "local_steps": 1}  # ProxyFL, AvgPush, CWT: one local DP step a round
SCATTER_ROUNDS = [50, 100]
SCATTER_LR = [3.0, 10.0]  # the server methods' and Joint's (the sites' noise is averaged every step)
GOSSIP_LR = [1.0, 3.0]  # one site's noise per step: smaller steps
# The example-level methods hospital teams get elsewhere (issue 29), on the same features and recipe: the
# server methods as FedAvg (one local DP step a round, SGD, clip 0.1, q = 0.5; FedAdam steps the server with
# Adam instead of momentum); MR-MTL's sites each keep their own DP model (one site's noise per step, as the
# gossip methods). FedPer, FedRep and FedBN split a model into body and head or keep its normalisation layers
# private, which a linear head does not have: they run on Tramèr & Boneh's CNN head (scattercnn; FedBN on its
# GroupNorm variant, scattercnn-gn) with FedAvg's recipe, next to FedAvg on the same head (the reference their
# personalisation is measured against).
SERVER_NO_M = {k: v for k, v in SERVER.items() if k != "server_momentum"}
SERVER_GRID = {"rounds": [50], "lr": SCATTER_LR}
# ProxyFL with every proxy sent to every other site (K − 1 times the exponential graph's bytes; PushSum
# self-weight 1/K: each site holds the exact average of the round's proxies) and the momentum buffer kept
# across the replacement (with one local step a round, 'reset' clears it every round): the proxies step as
# FedAvg's global model does, without a server.
PROXYFL_COMPLETE = (
    "ProxyFL (strict, complete graph)",
    "proxyfl",
    {
        **GOSSIP,
        "graph": "complete",
        "self_weight": 1.0 / BASE["clients"],
        "optimizer_state": "keep",
        "lr": 10.0,
        "combine": "weights",
    },
    {"rounds": [50], "dml_alpha": [0.5, 0.9]},
)
# FedAvg's recipe (one local DP step a round, SGD, clip 0.1, q = 0.5, server momentum 0.9, the combiner on
# 20 % of the rows) on the CNN head at 50 rounds, its lr over CNN_LR: a step lower than the linear head's grid
# (pilots on seed 0's validation split at ε = 3, FedAvg on scattercnn: lr 3 0.603, 10 0.586, 30 0.439). FedRep
# alone differs: one DP step a round would leave its head phase empty (⌊0.2·1 + ½⌋ = 0 steps: the head would
# stay at its initial weights), so it takes two steps a round, the head's then the body's (head share 0.5).
CNN_HEAD, GN_HEAD = "scattercnn", "scattercnn-gn"
FEDAVG_CNN = f"FedAvg ({CNN_HEAD})"  # the same-head reference of the three below
CNN_LR = [1.0, 3.0]
BODY_HEAD_GRID = {"rounds": [50], "lr": CNN_LR}
CNN_SERVER = {**SERVER, "combine": "weights", "proxy_model": CNN_HEAD}  # FedAvg's recipe on the CNN head
BODY_HEAD_SCATTER: list[tuple[str, str, dict, dict]] = [
    (FEDAVG_CNN, "fedavg", CNN_SERVER, BODY_HEAD_GRID),
    (f"FedPer ({CNN_HEAD})", "fedper", CNN_SERVER, BODY_HEAD_GRID),
    (
        f"FedRep ({CNN_HEAD})",
        "fedrep",
        {**CNN_SERVER, "local_steps": 2, "fedrep_head_share": 0.5},
        BODY_HEAD_GRID,
    ),
    (f"FedBN ({GN_HEAD})", "fedbn", {**CNN_SERVER, "proxy_model": GN_HEAD}, BODY_HEAD_GRID),
]
BODY_HEAD_LABELS = tuple(x[0] for x in BODY_HEAD_SCATTER)
PERSONAL_DP = BODY_HEAD_LABELS[1:]  # their headline, the personalised model a site keeps, is a DP model
PERSONALIZED_SCATTER: list[tuple[str, str, dict, dict]] = [
    PROXYFL_COMPLETE,
    ("FedProx", "fedprox", {**SERVER, "combine": "weights"}, SERVER_GRID),
    ("SCAFFOLD", "scaffold", {**SERVER, "combine": "weights"}, SERVER_GRID),
    (
        "FedAdam",
        "fedavg-adam",
        {**SERVER_NO_M, "lr": 3.0, "combine": "weights"},
        {"rounds": [50], "server_lr": [0.01, 0.03]},
    ),
    ("Ditto", "ditto", {**SERVER, "combine": "weights"}, SERVER_GRID),
    ("APFL", "apfl", dict(SERVER), SERVER_GRID),
    ("MR-MTL", "mr-mtl", dict(GOSSIP), {"rounds": [100], "lr": GOSSIP_LR}),
    *BODY_HEAD_SCATTER,
]
PERSONALIZED_LABELS = tuple(x[0] for x in PERSONALIZED_SCATTER)
# Issue 44: the noise pooled under secure aggregation. FedAvg full batch (q = 1: no amplification claimed, one
# DP step a round, server momentum) with each site's own full noise, the same with each site adding a share so
# that the decoded sum of the survivors floor carries one full noise (``noise_placement: pooled``), and
# dp-ssp's one-shot noisy sufficient statistics through the same secure sum (a ridge head: post-processing).
FULL_BATCH = {**SERVER, "sample_rate": 1.0}
POOLED = {"secure_aggregation": True, "noise_placement": "pooled"}
POOLED_SCATTER: list[tuple[str, str, dict, dict]] = [
    ("FedAvg (full batch)", "fedavg", dict(FULL_BATCH), {"rounds": [100], "lr": SCATTER_LR}),
    ("FedAvg (pooled noise)", "fedavg", {**FULL_BATCH, **POOLED}, {"rounds": [100], "lr": SCATTER_LR}),
    (
        "dp-ssp (one-shot statistics)",
        "dp-ssp",
        {"secure_aggregation": True, "rounds": 1},
        {"ssp_dim": [64, 128], "ssp_ridge": [1.5, 2.0]},
    ),
]
POOLED_LABELS = tuple(x[0] for x in POOLED_SCATTER)
PROXYFL_LABELS = ("ProxyFL (strict)", PROXYFL_COMPLETE[0])
METHODS_SCATTER: list[tuple[str, str, dict, dict]] = [
    (
        "ProxyFL (strict)",
        "proxyfl",
        {**GOSSIP, "self_weight": 0.5, "combine": "weights"},
        {"rounds": [100], "lr": GOSSIP_LR, "dml_alpha": [0.0, 0.5]},
    ),
    ("FML", "fml", {**SERVER, "combine": "weights"}, {"rounds": SCATTER_ROUNDS, "lr": SCATTER_LR}),
    ("FedAvg", "fedavg", {**SERVER, "combine": "weights"}, {"rounds": SCATTER_ROUNDS, "lr": SCATTER_LR}),
    ("AvgPush", "avgpush", {**GOSSIP, "combine": "weights"}, {"rounds": SCATTER_ROUNDS, "lr": GOSSIP_LR}),
    ("CWT", "cwt", {**GOSSIP, "combine": "weights"}, {"rounds": SCATTER_ROUNDS, "lr": GOSSIP_LR}),
    ("Regular", "regular", dict(SGD), {"rounds": SCATTER_ROUNDS, "lr": GOSSIP_LR}),
    ("Joint", "joint", dict(SGD), {"rounds": SCATTER_ROUNDS, "lr": SCATTER_LR}),
    ("DP-FedAvg (no intermediaries)", "dp-fedavg", {"intermediaries": "none"}, {"rounds": ROUNDS}),
    ("DP-FedAvg (adaptive intermediaries)", "dp-fedavg", {"intermediaries": "adaptive"}, {"rounds": ROUNDS}),
    *PERSONALIZED_SCATTER,
    *POOLED_SCATTER,
]
FEATURE_SETS: dict[str, tuple[dict, list[tuple[str, str, dict, dict]]]] = {
    "none": ({}, METHODS_NONE),
    "scatter": (SCATTER_HEADS, METHODS_SCATTER),
}
METHODS = METHODS_NONE  # the labels, in table order
# going alone without DP on the same features: Regular (the method's own training, the longest rounds of the
# grid)
ALONE = ("Regular, no DP (go it alone)", "regular", {"privacy": "off", "rounds": max(ROUNDS)})
ALONE_SCATTER = (
    "Regular, no DP (go it alone)",
    "regular",
    {"privacy": "off", "rounds": max(SCATTER_ROUNDS), "sample_rate": 0.5, "lr": PRIVATE_LR},
)
# the ceiling on these features: every site's rows pooled, no DP (Joint's training; not going alone)
CEILING = (
    "Joint without DP (pooled ceiling)",
    "joint",
    {"privacy": "off", "rounds": max(SCATTER_ROUNDS), "sample_rate": 0.5, "lr": PRIVATE_LR},
)
OWN = "own logistic regression (go it alone)"
OWN_C = (
    0.1,
    1.0,
    10.0,
)  # its L2 strength, chosen on the validation split (the same public split the methods tune on)
# The papers' setting for reference, from docs/results.md (σ = 1, q = 0.25, 300 rounds: ε ≈ 99.6 per site)
PAPER_NOTE = (
    "The papers' setting (σ = C = 1, q = 0.25, 300 rounds) ends at ε ≈ 99.6 per site (δ = 1e-5); its "
    "accuracies are in [results.md](results.md) and are not re-run here."
)


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in label.lower()).strip("-")


def _job(
    kind: str,
    label: str,
    method: str,
    fixed: dict,
    grid: dict,
    eps: float | None,
    seed: int,
    feats: str,
    root: str,
) -> dict:
    """One tuning + final run (or one untuned run) on feature stage ``feats``: returns its row. Runs in a
    worker process."""
    import torch

    from silofl.api import RunConfig, run, threat_epsilons, tune

    torch.set_num_threads(1)
    folder = _folder(Path(root), (kind, label, method, fixed, grid, eps, seed, feats))
    fixed = {**FEATURE_SETS[feats][0], **fixed}
    t0 = time.perf_counter()
    row: dict[str, Any] = {"label": label, "method": method, "budget": eps, "seed": seed, "features": feats}
    if kind == "pubsub":
        row.update(
            _pubsub(eps, seed, folder, feats),
            settings=fixed,
            tuning={"trials": 0, "seconds": 0.0, "max": None},
        )
        row["seconds"] = time.perf_counter() - t0
        return row
    if kind == "own":
        row.update(
            _own_alone(seed, folder, feats),
            settings={"C": "chosen on the validation split"},
            tuning={"trials": 0, "seconds": 0.0, "max": None},
        )
        row["seconds"] = time.perf_counter() - t0
        return row
    if (
        kind == "refinal"
    ):  # settings an earlier generation's tuning chose (``grid`` holds them and its record)
        final = folder / "final"
        settings, record = grid["settings"], grid["record"]
        s = _final_run(final, {**fixed, **settings}, method, seed, eps)
        row.update(
            settings=settings,
            validation=record.get("validation"),
            tuning={"trials": record.get("trials") or 0, "seconds": 0.0, "max": record.get("max")},
            tuned_on=TUNE_SEED,
            retuned=False,
        )
    elif (
        kind == "final"
    ):  # the settings tuned on TUNE_SEED, run once on this seed's split and scored on the test split
        final = folder / "final"
        tuned = folder.parent / f"seed{TUNE_SEED}" / "tune" / "tune.json"
        settings = json.loads(tuned.read_text())["best"]["settings"]
        s = _final_run(final, {**fixed, **settings}, method, seed, eps)
        row.update(settings=settings, tuning={"trials": 0, "seconds": 0.0, "max": None}, tuned_on=TUNE_SEED)
    elif kind == "alone":
        final = folder / "final"
        if not (final / "summary.json").exists():
            cfg = RunConfig.from_dict(
                {**BASE, **fixed, "method": method, "seed": seed, "out": str(final)}, strict=False
            )
            run(cfg.replace(eval_every=cfg.rounds), quiet=True, overwrite=final.exists())
        s = json.loads((final / "summary.json").read_text())
        row.update(settings=fixed, tuning={"trials": 0, "seconds": 0.0, "max": None})
    else:
        tdir = folder / "tune"
        if not (tdir / "tune.json").exists():
            if tdir.exists():
                import shutil

                shutil.rmtree(tdir)
            base = RunConfig.from_dict(
                {
                    **BASE,
                    **fixed,
                    "method": method,
                    "seed": seed,
                    "target_epsilon": eps,
                    "eval_split": "validation",
                    "out": str(tdir / "unused"),
                },
                strict=False,
            )
            tune(base, grid, out=tdir, quiet=True)
        t = json.loads((tdir / "tune.json").read_text())
        final = folder / "final"
        if (final / "summary.json").exists():  # an earlier version of this study re-ran the best settings
            s = json.loads((final / "summary.json").read_text())
        else:
            if not (folder / "final.json").exists():
                (folder / "final.json").write_text(
                    json.dumps(score_on_test(tdir / "trials" / f"trial{t['best']['trial']}"))
                )
            s = json.loads((folder / "final.json").read_text())
        row.update(
            settings=t["best"]["settings"],
            validation=t["best"]["validation"],
            tuning={"trials": len(t["trials"]), "seconds": t["seconds"], "max": t["tuning_cost"]["max"]},
            trials=[{"settings": r["settings"], "validation": r["validation"]} for r in t["trials"]],
        )
    head = s["headline"]
    row.update(
        headline=head,
        test=s["final"][head]["mean"],
        test_std=s["final"][head]["std"],
        accs={k: s["final"][k]["mean"] for k in s["final"] if k.endswith("_acc")},
        epsilon=s["final"]["epsilon"]["mean"],
        sigma=(s["privacy"].get("noise_calibration") or {}).get("noise_multiplier"),
        threats={t: eps for t, (eps, _) in threat_epsilons(s).items()},
        rounds=s["rounds_run"],
        seconds=time.perf_counter() - t0,
        final_seconds=s["wall_time_s"],
        test_set=s["test_set"],
    )
    return row


def _final_run(final: Path, settings: dict, method: str, seed: int, eps: float | None) -> dict:
    """Run ``settings`` on seed ``seed``'s split at budget ``eps``, scored on the test split at the last
    round, into ``final`` (unless it finished already); its summary."""
    from silofl.api import RunConfig, run

    if not (final / "summary.json").exists():
        cfg = RunConfig.from_dict(
            {
                **BASE,
                **settings,
                "method": method,
                "seed": seed,
                "target_epsilon": eps,
                "eval_split": "test",
                "out": str(final),
            },
            strict=False,
        )
        run(cfg.replace(eval_every=cfg.rounds), quiet=True, overwrite=final.exists())
    return json.loads((final / "summary.json").read_text())


def score_on_test(trial: Path) -> dict:
    """The chosen trial's released models, scored once on the test split (the seeded trial is deterministic,
    so this equals re-running its settings with eval_split test, without training again): a summary-like
    dict."""
    from silofl.experiments.evaluate import evaluate_run
    from silofl.runner.folder import mean_std

    s = json.loads((trial / "summary.json").read_text())
    accs: dict[str, list[float]] = {}
    for r in evaluate_run(trial, eval_split="test"):
        accs.setdefault(f"{r['model'].split('_', 1)[1]}_acc", []).append(r["accuracy"])
    final = {k: mean_std(v) for k, v in accs.items()}
    final["epsilon"] = s["final"]["epsilon"]
    return {
        "headline": s["headline"],
        "final": final,
        "privacy": s["privacy"],
        "rounds_run": s["rounds_run"],
        "wall_time_s": s["wall_time_s"],
        "test_set": "the data set's test split",
        "scored_from": str(trial),
    }


PUBSUB = ("PubSub-ML (untuned)", "pubsub", {"epochs": 10, "hidden": 64})


def jobs(
    seeds: list[int],
    features: tuple[str, ...] = tuple(FEATURE_SETS),
    budgets: tuple[float, ...] = BUDGETS,
    labels: tuple[str, ...] | None = None,
    refinal: dict | None = None,
) -> list[tuple]:
    """Every (kind, label, method, fixed, grid, ε, seed, features), the cheap budgets first: the go-it-alone
    runs, the tuning on TUNE_SEED, PubSub-ML, then every other seed's run of the tuned settings (those wait
    for their tuning). ``labels``: only these rows (None: all). ``refinal``: {(features, label, ε): settings}
    — rows re-run on every seed with the settings an earlier generation's tuning chose (``refinal`` jobs), not
    tuned again."""

    def want(label: str) -> bool:
        return labels is None or label in labels

    out: list[tuple] = []
    for f in features:
        alone = ALONE_SCATTER if f != "none" else ALONE
        out += [("alone", alone[0], alone[1], alone[2], {}, None, s, f) for s in seeds if want(alone[0])]
        out += [("own", OWN, "logreg", {}, {}, None, s, f) for s in seeds if want(OWN)]
        if f != "none":
            out += [
                ("alone", CEILING[0], CEILING[1], CEILING[2], {}, None, s, f)
                for s in seeds
                if want(CEILING[0])
            ]
    order = sorted(budgets, reverse=True)
    for f in features:
        for eps in order:
            for label, method, fixed, grid in FEATURE_SETS[f][1]:
                settings = (refinal or {}).get((f, label, eps))
                if settings is not None:
                    out += [("refinal", label, method, fixed, settings, eps, s, f) for s in seeds]
                elif want(label) and TUNE_SEED in seeds:
                    out.append(("tuned", label, method, fixed, grid, eps, TUNE_SEED, f))
            if want(PUBSUB[0]):
                out += [("pubsub", PUBSUB[0], PUBSUB[1], PUBSUB[2], {}, eps, s, f) for s in seeds]
    for f in features:
        for eps in order:
            for label, method, fixed, grid in FEATURE_SETS[f][1]:
                if want(label) and (f, label, eps) not in (refinal or {}):
                    out += [("final", label, method, fixed, grid, eps, s, f) for s in seeds if s != TUNE_SEED]
    return out


def _folder(root: Path, j: tuple) -> Path:
    base = root if j[7] == "none" else root / f"features-{j[7]}"  # features none: the earlier study's folders
    return base / _slug(j[1]) / (f"eps{j[5]:g}" if j[5] is not None else "nodp") / f"seed{j[6]}"


def run_all(
    root: Path,
    seeds: list[int],
    workers: int,
    features: tuple[str, ...],
    budgets: tuple[float, ...] = BUDGETS,
    labels: tuple[str, ...] | None = None,
    refinal: dict | None = None,
) -> list[dict]:
    """Run (or pick up) every job; rows as they finish, also appended to ROOT/rows.jsonl. A seed's run of
    tuned settings starts once the tuning it reads has finished."""
    from concurrent.futures import FIRST_COMPLETED, wait

    rows = []
    todo = jobs(seeds, features, budgets, labels, refinal)
    tuned_done = {
        (j[1], j[5], j[7])
        for j in todo
        if j[0] == "tuned" and (_folder(root, j) / "tune" / "tune.json").exists()
    }
    waiting = [
        j for j in todo if j[0] == "final" and (j[1], j[5], j[7]) not in tuned_done and TUNE_SEED in seeds
    ]
    ready = [j for j in todo if j not in waiting]
    with ProcessPoolExecutor(max_workers=workers) as ex:
        futs = {ex.submit(_job, *j, str(root)): j for j in ready}
        while futs:
            done, _ = wait(futs, return_when=FIRST_COMPLETED)
            for f in done:
                j = futs.pop(f)
                try:
                    row = f.result()
                except Exception as e:  # one failure does not stop the study
                    row = {
                        "label": j[1],
                        "method": j[2],
                        "budget": j[5],
                        "seed": j[6],
                        "features": j[7],
                        "error": repr(e),
                    }
                if j[0] == "tuned":
                    for w in [w for w in waiting if (w[1], w[5], w[7]) == (j[1], j[5], j[7])]:
                        waiting.remove(w)
                        futs[ex.submit(_job, *w, str(root))] = w
                rows.append(row)
                with open(root / "rows.jsonl", "a") as fh:
                    fh.write(json.dumps(row, default=str) + "\n")
                print(
                    json.dumps(
                        {
                            k: row.get(k)
                            for k in ("features", "label", "budget", "seed", "test", "epsilon", "error")
                        }
                    ),
                    flush=True,
                )
    return rows


def collect(
    root: Path,
    seeds: list[int],
    features: tuple[str, ...],
    labels: tuple[str, ...] | None = None,
    refinal: dict | None = None,
    budgets: tuple[float, ...] = BUDGETS,
) -> list[dict]:
    """The rows of every finished job (read back from the run folders, without running anything)."""
    rows = []
    for j in jobs(seeds, features, budgets, labels, refinal):
        folder = _folder(root, j)
        if any(
            (folder / f).exists() for f in ("final/summary.json", "final.json", "pubsub.json", "own.json")
        ):
            rows.append(_job(*j, str(root)))
    return rows


def _own_model(path: Path, x, y, feats: list[str], classes: list[str], seed: int):
    """A site's own non-private logistic regression, as ``customize(own="auto")`` trains it; cached in
    PATH."""
    import pickle

    from silofl.pubsub.dp_models import Bounds, train

    if path.exists():
        return pickle.loads(path.read_bytes())
    m = train(
        "dp-logreg",
        x,
        y,
        publisher="own",
        features=feats,
        task="classification",
        bounds=Bounds(x.min(0), x.max(0)),
        epsilon=1.0,
        delta=1e-5,
        classes=classes,
        seed=seed,
        nonprivate=True,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(pickle.dumps(m))
    tmp.replace(path)
    return m


def _split(seed: int, feats: str, eval_split: str = "test"):
    """The study's split of seed ``seed`` (the sites' rows and the test or validation split) after feature
    stage ``feats``, as every run of the study sees it."""
    import torch

    from silofl.runner.config import RunConfig
    from silofl.runner.data import prepare_data

    cfg = RunConfig.from_dict(
        {
            **BASE,
            **FEATURE_SETS[feats][0],
            "method": "regular",
            "privacy": "off",
            "seed": seed,
            "eval_split": eval_split,
            "out": "unused",
        },
        strict=False,
    )
    return prepare_data(cfg.resolve(), torch.device("cpu"))[1]


# Public input bounds of features for PubSub-ML's models (they scale inputs to [0, 1] by bounds a site
# declares, never by its data): GroupNorm-ed scattering coefficients have zero mean and unit variance per
# group of every example, so a fixed ±4 keeps nearly all of them; a constant of the study, not computed from
# any site's rows.
FEATURE_BOUND = 4.0


def _own_alone(seed: int, folder: Path, feats: str) -> dict:
    """Each site going it alone without DP on the same features: scikit-learn's logistic regression on all its
    own rows, its L2 strength chosen from OWN_C on the validation split (the public split the methods tune
    on); the mean over sites on the test split. Cached in FOLDER/own.json."""
    cache = folder / "own.json"
    if cache.exists():
        return json.loads(cache.read_text())
    from sklearn.linear_model import LogisticRegression

    t0 = time.perf_counter()
    test, val = _split(seed, feats), _split(seed, feats, "validation")
    x_val, y_val = val.test[0].flatten(1).numpy(), val.test[1].numpy()
    x_test, y_test = test.test[0].flatten(1).numpy(), test.test[1].numpy()
    accs, chosen = [], []
    for x, y in test.parts:
        x, y = x.flatten(1).numpy(), y.numpy()
        fits = [LogisticRegression(C=c, max_iter=1000).fit(x, y) for c in OWN_C]
        best = max(range(len(fits)), key=lambda i: fits[i].score(x_val, y_val))
        chosen.append(OWN_C[best])
        accs.append(float(fits[best].score(x_test, y_test)))
    out = {
        "headline": "own_acc",
        "test": statistics.fmean(accs),
        "test_std": statistics.pstdev(accs),
        "accs": {"own_acc": statistics.fmean(accs)},
        "epsilon": None,
        "sigma": None,
        "rounds": None,
        "final_seconds": time.perf_counter() - t0,
        "test_set": test.test_set,
        "per_site": accs,
        "C": chosen,
    }
    folder.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(out))
    return out


def _pubsub(eps: float, seed: int, folder: Path, feats: str = "none") -> dict:
    """PubSub-ML on the study's split: each of the 8 sites publishes a DP-SGD model (dp-nn) trained on its own
    rows at (eps, δ), then each site customizes — selects and fuses every published model, its own included,
    plus a non-private model of its own that never leaves it — on its own rows (60 % for its own model, 40 %
    to fuse), and the fused model is scored on the test split. The headline: the mean over sites. Cached in
    FOLDER/pubsub.json."""
    cache = folder / "pubsub.json"
    if cache.exists():
        return json.loads(cache.read_text())
    import numpy as np

    from silofl.pubsub.customize import LocalData, align, customize, model_outputs
    from silofl.pubsub.dp_models import Bounds, train

    split = _split(seed, feats)
    x_test = split.test[0].flatten(1).numpy().astype(np.float64)
    y_test = split.test[1].numpy()
    sites = [(x.flatten(1).numpy().astype(np.float64), y.numpy()) for x, y in split.parts]
    if feats == "none":
        lo = float(
            min(x.min() for x, _ in sites + [(x_test, y_test)])
        )  # the pixel domain (public): its fixed range
        hi = float(max(x.max() for x, _ in sites + [(x_test, y_test)]))
    else:  # the feature stage's public value bounds (whatever the data), else a fixed ±FEATURE_BOUND
        from silofl.features import value_bounds

        lo, hi = (value_bounds(split.features) if split.features is not None else None) or (
            -FEATURE_BOUND,
            FEATURE_BOUND,
        )
    feats_names = [f"px{i}" for i in range(x_test.shape[1])]
    classes = [str(c) for c in range(split.dataset.num_classes)]
    bounds = Bounds(np.full(len(feats_names), lo), np.full(len(feats_names), hi))
    t0 = time.perf_counter()
    published = [
        train(
            "dp-nn",
            x,
            y,
            publisher=f"site{i}",
            features=feats_names,
            task="classification",
            bounds=bounds,
            epsilon=eps,
            delta=BASE["delta"],
            classes=classes,
            seed=seed * 100 + i,
            **PUBSUB[2],
        )
        for i, (x, y) in enumerate(sites)
    ]
    t_publish = time.perf_counter() - t0
    accs, own_accs = [], []
    defaults = {f: (lo + hi) / 2 for f in feats_names}
    for i, (x, y) in enumerate(sites):
        perm = np.random.default_rng([seed, i]).permutation(len(y))
        tr, cu = perm[: int(0.6 * len(y))], perm[int(0.6 * len(y)) :]
        own = _own_model(
            folder.parent.parent / f"own-seed{seed}-site{i}.pkl", x[tr], y[tr], feats_names, classes, seed
        )
        # the own model is what customize(own="auto") trains (non-private logistic regression on the training
        # part, never published); trained once per site and seed, as it does not depend on the budget
        fused = customize(
            [*published, own],
            LocalData(x, y, feats_names, "classification", classes),
            defaults,
            seed=seed,
            idx=(tr, cu, cu),
            own=None,
        )
        accs.append(float((fused.predict(x_test) == y_test).mean()))
        cols, fill = align(own, feats_names, defaults)
        own_accs.append(float((model_outputs(own, x_test, cols, fill).argmax(1).numpy() == y_test).mean()))
    out = {
        "headline": "fused_acc",
        "test": statistics.fmean(accs),
        "test_std": statistics.pstdev(accs),
        "accs": {"fused_acc": statistics.fmean(accs), "own_acc": statistics.fmean(own_accs)},
        "epsilon": max(m.epsilon for m in published),
        "sigma": None,
        "rounds": None,
        "final_seconds": time.perf_counter() - t0,
        "publish_seconds": t_publish,
        "test_set": split.test_set,
        "per_site": accs,
    }
    folder.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(out))
    return out


def _random_trials_epsilon(tdir: Path) -> float | None:
    """The ε per site (largest over parties) that ``silofl tune --random-trials poisson:μ`` with μ = the
    grid's size would report for this tuning: Papernot & Steinke's Theorem 6 on the largest RDP curve of any
    grid setting (each random trial draws its settings from the grid), from the (σ, q, steps) every trial of
    the grid actually ran."""
    import numpy as np

    from silofl.privacy.analysis import DEFAULT_ORDERS, rdp_curve
    from silofl.privacy.tuning import poisson, repeat_and_select_epsilon

    curves: dict[str, Any] = {}
    delta = None
    trials = sorted((tdir / "trials").glob("trial*/summary.json"))
    for f in trials:
        for a in json.loads(f.read_text()).get("accounting", []):
            hist = a.get("history") or a.get("history_hospital")
            if not hist or a.get("accountant") != "opacus.rdp":
                continue
            party = f"client{a['client']}" if "client" in a else str(a.get("party", "server"))
            c = rdp_curve(tuple(tuple(h) for h in hist))
            curves[party] = c if party not in curves else np.maximum(curves[party], c)
            delta = a["delta"]
    if not curves or delta is None or len(trials) < 1:
        return None
    count = poisson(float(len(trials)))
    return max(repeat_and_select_epsilon(DEFAULT_ORDERS, c, count, delta)["epsilon"] for c in curves.values())


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def _sd(xs):
    xs = [x for x in xs if x is not None]
    return statistics.pstdev(xs) if len(xs) > 1 else None


def _pm(m, sd, signed=False):
    if m is None:
        return "—"
    f = f"{m:+.3f}" if signed else f"{m:.3f}"
    return f + (f" ± {sd:.3f}" if sd is not None else "")


SHARED_KEYS = (
    "proxy_acc",
    "global_acc",
)  # the DP models the sites share (ProxyFL's proxy, the rest's global model)
FEATURE_TEXT = {
    "none": "raw pixels; private LeNet5 and shared MLP (the papers'), Adam, lr 1e-3, clip 1, q = 0.25",
    "scatter": (
        "ScatterNet features (kymatio `Scattering2D`, J = 2, L = 8: 81 × 7 × 7, then GroupNorm without "
        "affine "
        "parameters: a fixed function of each image, no budget); linear heads; SGD with momentum 0.9, clip "
        "0.1, q = 0.5 (the non-DP models: Adam, lr 0.003); every DP model a linear head except in the rows "
        "whose label names another head; FedAvg and FML one local DP step per round with "
        "server momentum 0.9; ProxyFL, AvgPush and CWT one local DP step a round (ProxyFL with push-sum "
        "self-weight 0.5) — for these three the momentum buffer is cleared whenever a received model "
        "replaces the shared one (`optimizer_state` reset, the default), so with one step a round they step "
        "without momentum; ProxyFL on the complete graph keeps it; each site also "
        "combines its own non-DP model with the DP model(s) it holds on 20 % of its rows, set aside before "
        "training — every model of those methods trains on the other 80 % (`combined`, non-private: stays at "
        "the site); FedProx, SCAFFOLD, FedAdam, Ditto and APFL take FedAvg's recipe (FedAdam: Adam at the "
        "server instead of momentum, its server lr tuned), MR-MTL the gossip methods' (each site keeps its "
        "own DP model); FedPer, FedRep and FedBN need a body/head split or normalisation layers, which a "
        "linear head does not have: they run on Tramèr & Boneh's CNN head over the scattering maps "
        "(`scattercnn`: conv, conv, fc | out, the head being `out`; FedBN on `scattercnn-gn`, the same CNN "
        "with GroupNorm after each convolution, whose affine parameters each site keeps) with FedAvg's "
        "recipe, next to FedAvg on `scattercnn` (the reference their personalisation is measured against); "
        f"their lr grid is ({', '.join(f'{x:g}' for x in CNN_LR)}), a step below the linear heads' "
        "(pilot runs on seed 0's validation split at ε = 3, 50 rounds, outside the tuning cost below: "
        "FedAvg on `scattercnn` lr 3 0.603, 10 0.586, 30 0.439; FedBN lr 3 0.617, 10 0.484; FedPer's "
        "personal model lr 3 0.177, 10 0.223, 30 0.197); FedRep takes two DP steps a round, the head's "
        "and then the body's (`fedrep_head_share` 0.5), as one step a round would leave its head phase "
        "empty and its head at its "
        "initial weights. With one local DP step a round FedProx's "
        "pull is zero at that step (the model is the one just received) and SCAFFOLD's corrections average "
        "out at the server, so both equal FedAvg exactly; they differ only with several local steps. APFL "
        "does not hold rows out for a combiner (its mixture is its own), so its global model trains on all "
        "of a site's rows, the others' on 80 %"
    ),
}


NONPRIVATE_PERSONAL = (*PROXYFL_LABELS, "Ditto")  # their private models are trained without DP (site-kept)


class _Rows:
    """The finished rows, indexed by (features, label, budget)."""

    def __init__(self, rows: list[dict]):
        self.ok = sorted(
            (r for r in rows if "error" not in r), key=lambda r: r["seed"]
        )  # the tuned seed first
        self.by: dict[tuple, list[dict]] = {}
        for r in self.ok:
            self.by.setdefault((r.get("features", "none"), r["label"], r["budget"]), []).append(r)

    def get(self, feats, label, eps) -> list[dict]:
        return self.by.get((feats, label, eps), [])

    def alone(self, feats) -> tuple[str | None, dict[int, float]]:
        """The strongest going-alone reference on these features (higher mean): its label and per-seed
        figure."""
        best, best_mean = None, None
        for label in (ALONE[0], OWN):
            rs = self.get(feats, label, None)
            m = _mean([r["test"] for r in rs])
            if m is not None and (best_mean is None or m > best_mean):
                best, best_mean = label, m
        return best, {r["seed"]: r["test"] for r in self.get(feats, best, None)} if best else {}

    def shared(self, rs: list[dict]) -> tuple[str | None, list[float]]:
        """The method's best shared DP model (by mean): its field and its per-seed figures (aligned with
        ``rs``)."""
        keys = [k for k in SHARED_KEYS if any(k in r["accs"] for r in rs)]
        if not keys:
            return None, []
        k = max(keys, key=lambda k: _mean([r["accs"].get(k) for r in rs]) or -1)
        return k, [r["accs"].get(k) for r in rs]


def _gain(rs: list[dict], vals: list, ref: dict[int, float]) -> tuple[float | None, float | None]:
    """Mean ± spread over seeds of (figure − the going-alone reference on the same seed's split)."""
    d = [v - ref[r["seed"]] for r, v in zip(rs, vals, strict=True) if v is not None and r["seed"] in ref]
    return _mean(d), _sd(d)


def _colluder_epsilons(root: Path | None, label: str) -> dict[float, float]:
    """The largest ε against the server plus one colluding site over a pooled row's runs, per budget
    (``epsilon_vs_server_plus_1_colluders`` of their summaries: only the honest survivors' noise shares)."""
    out: dict[float, float] = {}
    if root is None:
        return out
    for eps in BUDGETS:
        for f in (root / "features-scatter" / _slug(label) / f"eps{eps:g}").glob("seed*/**/summary.json"):
            v = json.loads(f.read_text()).get("privacy", {}).get("epsilon_vs_server_plus_1_colluders")
            if isinstance(v, (int, float)):
                out[eps] = max(out.get(eps, 0.0), float(v))
    return out


POOLED_TARGETS = {1.0: 0.81, 3.0: 0.85, 8.0: 0.87}  # issue 44: mean of 3 seeds, the shared DP model


def _pooled_section(R: _Rows, f: str, root: Path | None) -> list[str]:
    """Issue 44's rows: each site's own full noise against the noise pooled under secure aggregation, and
    dp-ssp, next to Joint, the pooled ceiling and going alone, per budget with the ε each row holds."""
    if not any(R.get(f, lab, e) for lab in POOLED_LABELS for e in BUDGETS):
        return []
    _, ref = R.alone(f)
    ceil = _mean([r["test"] for r in R.get(f, CEILING[0], None)])
    alone = _mean(list(ref.values()))
    colluders = _colluder_epsilons(root, POOLED_LABELS[1])
    lines = [
        "## Pooling the noise under secure aggregation",
        "",
        "FedAvg with one full-batch DP step a round (q = 1: no amplification by sampling is claimed; clip "
        "0.1, server momentum 0.9, 100 rounds, lr tuned) in two placements: every site adds its own full "
        "noise to its update (*own noise*: the ε holds against everyone who sees the upload), or every site "
        "adds only a Skellam share under secure aggregation so that the decoded sum of the survivors floor "
        "carries the noise of one pooled DP-GD step (*pooled noise*: the server sees only the masked sum). "
        "dp-ssp releases each site's clipped, noised XᵀX and Xᵀy of the scattering features (a random "
        "projection) once through the same secure sum; the ridge head is post-processing. The ε of every row "
        "is against the server and outsiders, with the default survivors floor (K − 1 = 7 of the 8 sites: a "
        "round with fewer survivors releases nothing; each site's policy accepts any floor of at least 4); "
        "*+1 colluder* "
        "is the pooled row's ε against the server plus one colluding site, whose share no longer protects "
        "anyone (only the honest survivors' shares count). Mean ± spread over seeds; going alone (the "
        "stronger reference, as above) and all rows pooled without DP for scale.",
        "",
        "| ε per site | going alone (best) | FedAvg, own noise | FedAvg, pooled noise | +1 colluder: ε | "
        "dp-ssp | Joint | all rows pooled, no DP |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for eps in BUDGETS:
        cells = []
        for lab in (*POOLED_LABELS, "Joint"):
            rs = R.get(f, lab, eps)
            cells.append(_pm(_mean([r["test"] for r in rs]), _sd([r["test"] for r in rs])) if rs else "—")
        c = colluders.get(eps)
        lines.append(
            f"| {eps:g} | {_pm(alone, None)} | {cells[0]} | {cells[1]} | {f'{c:.2f}' if c else '—'} | "
            f"{cells[2]} | {cells[3]} | {_pm(ceil, None)} |"
        )
    lines.append("")
    met = []
    for eps, target in POOLED_TARGETS.items():
        m = _mean([r["test"] for r in R.get(f, POOLED_LABELS[1], eps)])
        if m is not None:
            verdict = "met" if m >= target else f"missed by {target - m:.3f}"
            met.append(f"ε = {eps:g}: {m:.3f} against {target:.2f} ({verdict})")
    if met:
        lines += [f"The targets of pooled noise (issue 44, the shared DP model): {'; '.join(met)}.", ""]
    return lines


def majority_share(trial: Path, feats: str, seed: int = TUNE_SEED) -> float | None:
    """The share of the validation split's images that a site's personal model (``private``) of ``trial`` —
    a tuning trial, run on the validation split — assigns to its site's majority class, mean over sites; None
    without those models. The validation split is public (the study tunes on it); a balanced split gives
    0.1 to a model that matches it."""
    import torch

    from silofl.models import load_model

    models = trial / "models"
    if not (models / "client0_private.json").is_file():
        return None
    split = _split(seed, feats, "validation")
    x = split.test[0]
    shares = []
    for k, (_, y) in enumerate(split.parts):
        model, _ = load_model(models / f"client{k}_private")
        model.eval()
        with torch.no_grad():
            pred = model(x).argmax(1)
        shares.append(float((pred == torch.bincount(y).argmax()).float().mean()))
    return statistics.fmean(shares)


def _personal_section(R: _Rows, f: str, root: Path | None = None) -> list[str]:
    """The gain of personalisation on feature stage ``f``: FedPer's, FedRep's and FedBN's personal model
    (their headline) minus FedAvg's global model on the same head, seed by seed; none without that
    reference. With ``root`` (the study's folder), also what their chosen trials at the largest budget
    predict on the validation split (:func:`majority_share`)."""
    if not any(R.get(f, FEDAVG_CNN, eps) for eps in BUDGETS):
        return []
    top = max(BUDGETS)
    shares = {}
    for label in PERSONAL_DP if root is not None else ():
        tdir = root / f"features-{f}" / _slug(label) / f"eps{top:g}" / f"seed{TUNE_SEED}" / "tune"
        if (tdir / "tune.json").is_file():
            best = json.loads((tdir / "tune.json").read_text())["best"]["trial"]
            v = majority_share(tdir / "trials" / f"trial{best}", f)
            if v is not None:
                shares[label] = v
    lines = [
        f"Personalisation on the same head: each site's personal model minus {FEDAVG_CNN}'s global model "
        "(the same CNN, FedAvg's recipe and grid; FedBN's adds GroupNorm), seed by seed, mean ± spread over "
        "seeds. The personal model adapts the head (FedPer, FedRep) or the normalisation (FedBN) to its "
        f"site's rows, {BASE['p_major'] * 100:g} % of them one class, and is scored on the balanced test "
        "split, which does not reward that skew; a FedPer or FedRep site's head learns from its own rows "
        "only, under its site's DP noise, one step a round without the server's momentum (a pilot giving it "
        "momentum — the sites' SGD momentum kept across rounds instead of the server's — at ε = 3, lr 3: "
        "personal model 0.219 on the validation split, against 0.177 with FedAvg's recipe)."
        + (
            f" The share of the validation split's images (balanced: 0.1 a class) that a site's personal "
            f"model assigns to its site's majority class, mean over sites, ε = {top:g}, seed {TUNE_SEED}'s "
            "chosen trial: " + ", ".join(f"{lab} {v:.2f}" for lab, v in shares.items()) + "."
            if shares
            else ""
        ),
        "",
        "| method | ε = 1 | ε = 3 | ε = 8 |",
        "|---|---|---|---|",
    ]
    for label in PERSONAL_DP:
        cells = []
        for eps in BUDGETS:
            ref = {r["seed"]: r["accs"].get("global_acc") for r in R.get(f, FEDAVG_CNN, eps)}
            ref = {k: v for k, v in ref.items() if v is not None}
            rs = [r for r in R.get(f, label, eps) if r["seed"] in ref]
            cells.append(_pm(*_gain(rs, [r["test"] for r in rs], ref), signed=True) if rs else "—")
        if any(c != "—" for c in cells):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return [*lines, ""] if lines[-1] != "|---|---|---|---|" else []


def document(
    rows: list[dict],
    root: Path,
    doc: Path,
    seeds: list[int],
    command: str,
    features: tuple[str, ...] = tuple(FEATURE_SETS),
) -> str:
    """docs/privacy_utility.md from the rows, with its plot next to it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    R = _Rows(rows)
    labels = [m[0] for m in METHODS] + list(PERSONALIZED_LABELS) + list(POOLED_LABELS) + [PUBSUB[0]]
    all_seeds = sorted({*seeds, *(r["seed"] for r in R.ok)})  # carried rows may have more seeds than this run
    lines = [
        "# Privacy–utility: every method at ε = 1, 3, 8 per site, on pixels and on DP-friendly features",
        "",
        "Generated by",
        "",
        "```bash",
        command,
        "```",
        "",
        "Fashion-MNIST, p_major 0.8, 8 clients × 1000 examples, δ = 1e-5, the balanced 10 000-image test "
        "split; seeds "
        f"{', '.join(map(str, all_seeds))}"
        + (
            f" (the rows this generation ran: seeds {', '.join(map(str, seeds))}; a cell with fewer seeds "
            "says how many)"
            if all_seeds != sorted(seeds)
            else ""
        )
        + " (seeded research runs: † the guarantee holds only while the seed stays secret). "
        "For every method, budget and feature stage, `silofl tune` tried the grid below, each trial "
        "budget-first (σ set "
        "so that its planned rounds end at the budget), scored on a **validation split of 2000 Fashion-MNIST "
        "training "
        "images that no client holds, treated as public data**; the best trial's settings then ran on the "
        "test split. "
        f"Tuning ran on seed {TUNE_SEED}'s split; the other seeds re-ran the settings seed {TUNE_SEED} chose "
        f"on their "
        "own splits. The test split was read only by those final runs.",
        "",
        "Feature stages:",
        "",
    ]
    lines += [f"- **{f}**: {FEATURE_TEXT[f]}." for f in features]
    stages = sorted({r.get("features", "none") for r in rows})
    fresh = {r.get("features", "none") for r in rows if not r.get("carried")}
    old = [f for f in stages if f not in fresh]  # stages this generation did not run at all
    if old:
        lines += [
            "",
            f"**Not re-run in this generation: features {', '.join(old)}.** Those rows are carried over "
            "unchanged from an earlier generation of this document (its CSV; same study, same split, grid "
            f"rounds ∈ {ROUNDS} and ProxyFL's α, the papers' recipe), with their headline figure only: that "
            "generation did not search the DP-SGD recipe. Re-running them: the command above with "
            "`--features none,scatter`.",
        ]
    for f in (f for f in stages if f in fresh):
        fresh_budgets = {
            (r["label"], r["budget"]) for r in rows if not r.get("carried") and r.get("features", "none") == f
        }
        kept_by: dict[str, set] = {}
        for r in rows:
            if r.get("carried") and r.get("features", "none") == f:
                kept_by.setdefault(r["label"], set()).add(r["budget"])
        kept = sorted(
            lab
            if not any((lab, b) in fresh_budgets for b in (*BUDGETS, None))
            else f"{lab} at ε = {', '.join(f'{b:g}' for b in sorted(x for x in bs if x is not None))}"
            for lab, bs in kept_by.items()
        )
        again = sorted(
            {r["label"] for r in rows if r.get("retuned") is False and r.get("features", "none") == f}
        )
        if kept:
            lines += [
                "",
                f"**Features {f}, rows not re-run in this generation: {', '.join(kept)}.** They are carried "
                "over unchanged from the previous generation's CSV (the same study, split, seeds and grid), "
                "with the figures that CSV kept.",
            ]
        if again:
            lines += [
                "",
                f"**Features {f}, re-run with the previous generation's tuned settings: "
                f"{', '.join(again)}** (`--refinal`: every seed's final run again, with the settings the "
                f"previous generation's tuning on seed {TUNE_SEED} chose; its validation figure and tuning "
                "record are that tuning's).",
            ]
    missing = []  # cells of this generation's feature stages with fewer seeds than asked
    for f in (f for f in features if f not in old):
        run_eps = {r["budget"] for r in rows if not r.get("carried") and r.get("features", "none") == f}
        for eps in (e for e in BUDGETS if e in run_eps):  # the budgets this generation ran
            short = [lab for lab in labels if len(R.get(f, lab, eps)) < len(seeds)]
            if short:
                missing.append(
                    f"{f}, ε = {eps:g}: "
                    + ", ".join(f"{lab} ({len(R.get(f, lab, eps))} of {len(seeds)} seeds)" for lab in short)
                )
    if missing:
        lines += [
            "",
            "**This generation is incomplete** (the study resumes where it stopped: the command above "
            "again). Cells with fewer seeds than asked:",
            "",
        ] + [f"- {m}" for m in missing]
    lines += [
        "",
        "Going alone (no DP, the same features, the same seeds' splits): Regular without DP (the method's "
        "own "
        "training: the head, optimizer and longest rounds of the grid) and each site's own scikit-learn "
        "logistic "
        f"regression on all its rows (L2 strength from {OWN_C} chosen on the validation split). Every gain "
        f"below "
        "is against the **stronger** of the two on the same features, seed by seed (mean ± spread over "
        "seeds).",
        "",
    ]
    # headline summary
    lines += [
        "## Does collaborating pay?",
        "",
        "| features | going alone (best) | ε | best shared DP model | gain | best site model (combined / "
        "private) "
        "| gain |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in features:
        ref_label, ref = R.alone(f)
        ref_mean = _mean(list(ref.values()))
        for eps in BUDGETS:
            best = None  # (mean, label, key, gain, sd)
            site = None
            for label in labels:
                rs = R.get(f, label, eps)
                if not rs or label == "Joint":
                    continue
                k, vals = R.shared(rs)
                if k is not None:
                    m = _mean(vals)
                    if m is not None and (best is None or m > best[0]):
                        best = (m, label, k, *_gain(rs, vals, ref))
                for key in ("combined_acc", "private_acc"):
                    if key == "private_acc" and label not in (*NONPRIVATE_PERSONAL, *PERSONAL_DP):
                        continue
                    vals = [r["accs"].get(key) for r in rs]
                    m = _mean(vals)
                    if m is not None and (site is None or m > site[0]):
                        site = (m, label, key, *_gain(rs, vals, ref))
            lines.append(
                f"| {f} | {ref_mean:.3f} ({ref_label}) | {eps:g} | "
                + (
                    f"{best[0]:.3f} ({best[1]}, {best[2].removesuffix('_acc')}) | "
                    f"{_pm(best[3], best[4], True)} | "
                    if best
                    else "— | — | "
                )
                + (
                    f"{site[0]:.3f} ({site[1]}, {site[2].removesuffix('_acc')}) | "
                    f"{_pm(site[3], site[4], True)} |"
                    if site
                    else "— | — |"
                )
                if ref_mean is not None
                else f"| {f} | — | {eps:g} | — | — | — | — |"
            )
    lines += [
        "",
        "*Shared DP model*: a model that leaves the site under the per-site (ε, δ) (ProxyFL's proxy, FML's, "
        "FedAvg's, AvgPush's, CWT's and DP-FedAvg's global model). *Combined / private*: what a site keeps "
        "— its own non-DP model fused with the DP model(s) it holds on its own held-out rows (APFL: its "
        "mixture of its own and the global model), or ProxyFL's private or Ditto's personal model — "
        "non-private, it never leaves the site — or FedPer's, FedRep's and FedBN's personal model (the "
        "shared body or layers under the site's own head or normalisation: a DP model, part of which is "
        "shared). Joint (pooled data) is the upper reference "
        "and "
        "not counted.",
        "",
    ]
    # per feature stage: the tables
    for f in features:
        ref_label, ref = R.alone(f)
        lines += [
            f"## Features: {f}",
            "",
            "| method | ε = 1 | ε = 3 | ε = 8 | tuned settings (1 / 3 / 8) |",
            "|---|---|---|---|---|",
        ]
        for label in [ALONE[0], OWN, CEILING[0]]:
            rs = R.get(f, label, None)
            if rs:
                what = (
                    "no DP; every site's rows pooled — not a going-alone reference"
                    if label == CEILING[0]
                    else "no DP"
                )
                lines.append(
                    f"| {label} | {_pm(_mean([r['test'] for r in rs]), _sd([r['test'] for r in rs]))} "
                    f"({what}) | | | |"
                )
        staged = [lab for lab in labels if any(R.get(f, lab, eps) for eps in BUDGETS)]  # rows this stage has
        for label in staged:
            cells, sets = [], []
            for eps in BUDGETS:
                rs = R.get(f, label, eps)
                if not rs:
                    cells.append("—")
                    sets.append("—")
                    continue
                acc, sd = _mean([r["test"] for r in rs]), _sd([r["test"] for r in rs])
                e = max(r["epsilon"] for r in rs)
                other = [
                    f"{k.removesuffix('_acc')} {_mean([r['accs'].get(k) for r in rs]):.3f}"
                    for k in rs[0]["accs"]
                    if k != rs[0]["headline"] and _mean([r["accs"].get(k) for r in rs]) is not None
                ]
                extra = f"; {', '.join(other)}" if other else ""
                sig = f", σ {rs[0]['sigma']:.2f}" if rs[0].get("sigma") else ""
                n = f", {len(rs)} seed{'s' if len(rs) > 1 else ''}" if len(rs) != len(all_seeds) else ""
                cells.append(f"{_pm(acc, sd)} (ε {e:.2f}{sig}{extra}{n})")
                sets.append(
                    ",".join(f"{k}={v}" for k, v in rs[0]["settings"].items() if k not in FEATURE_SETS[f][0])
                    if isinstance(rs[0]["settings"], dict)
                    else "—"
                )
            lines.append(f"| {label} | " + " | ".join(cells) + " | " + " / ".join(sets) + " |")
        lines += [
            "",
            "Each cell: the method's headline accuracy (ProxyFL, FML: the private models; the rest: the "
            "shared/global or local model), mean ± spread over seeds (and clients), the ε the run ended at, "
            "the "
            "σ the budget set, and the method's other models (proxy/global: the DP models the sites share; "
            "combined: the site's fusion, non-private).",
            "",
        ]
        if ref:
            lines += [
                f"Gain over going alone ({ref_label}, the stronger reference on these features), per method: "
                "its best shared DP model / the site's combined model, mean ± spread over seeds.",
                "",
                "| method | ε = 1 | ε = 3 | ε = 8 |",
                "|---|---|---|---|",
            ]
            for label in staged:
                cells = []
                for eps in BUDGETS:
                    rs = R.get(f, label, eps)
                    if not rs:
                        cells.append("—")
                        continue
                    k, vals = R.shared(rs)
                    g = _gain(rs, vals, ref) if k else (None, None)
                    comb = [r["accs"].get("combined_acc") for r in rs]
                    gc = _gain(rs, comb, ref) if any(v is not None for v in comb) else (None, None)
                    head = _gain(rs, [r["test"] for r in rs], ref) if not k else (None, None)
                    cells.append(
                        " / ".join(
                            x
                            for x in (
                                _pm(*g, signed=True) if k else f"{_pm(*head, signed=True)} (headline)",
                                _pm(*gc, signed=True) if gc[0] is not None else None,
                            )
                            if x
                        )
                    )
                lines.append(f"| {label} | " + " | ".join(cells) + " |")
            lines.append("")
        lines += _personal_section(R, f, root)
    # targets
    lines += ["## The issue's targets (mean of the seeds, balanced test set, δ = 1e-5, per-site ε)", ""]
    for f in features:
        ref_label, ref = R.alone(f)
        if not ref:
            continue
        ref_mean = _mean(list(ref.values()))

        def best_shared(eps, f=f):
            out = None
            for label in labels:
                rs = R.get(f, label, eps)
                if rs and label != "Joint":
                    k, vals = R.shared(rs)
                    m = _mean(vals) if k else None
                    if m is not None and (out is None or m > out[0]):
                        out = (m, f"{label}, {len(rs)} seed{'s' if len(rs) > 1 else ''}")
            return out

        b3, b8 = best_shared(3.0), best_shared(8.0)
        pm = max(
            [
                v
                for lab in PROXYFL_LABELS
                for v in (
                    _mean([r["accs"].get("private_acc") for r in R.get(f, lab, 8.0)]),
                    _mean([r["accs"].get("combined_acc") for r in R.get(f, lab, 8.0)]),
                )
                if v is not None
            ],
            default=None,
        )
        fed1 = [
            lab
            for lab in labels
            if lab not in ("Joint", "Regular")
            and R.get(f, lab, 1.0)
            and max(
                v
                for v in [
                    _mean([r["test"] for r in R.get(f, lab, 1.0)]),
                    *(
                        _mean([r["accs"].get(k) for r in R.get(f, lab, 1.0)])
                        for k in (*SHARED_KEYS, "combined_acc")
                    ),
                ]
                if v is not None
            )
            >= ref_mean
        ]

        def ok(c):
            return "**met**" if c else "not met"

        lines += [f"Features {f} (going alone {ref_mean:.3f}):", ""]
        if b3:
            lines.append(
                f"- ε = 3: best shared DP model {b3[0]:.3f} ({b3[1]}): ≥ 0.80 {ok(b3[0] >= 0.80)}; ≥ going "
                f"alone + 0.05 = {ref_mean + 0.05:.3f} {ok(b3[0] >= ref_mean + 0.05)}."
            )
        if b8:
            lines.append(
                f"- ε = 8: best shared DP model {b8[0]:.3f} ({b8[1]}): ≥ 0.85 {ok(b8[0] >= 0.85)}"
                + (
                    f"; ProxyFL's private or combined model {pm:.3f} ≥ going alone + 0.08 = "
                    f"{ref_mean + 0.08:.3f} {ok(pm >= ref_mean + 0.08)}."
                    if pm is not None
                    else "."
                )
            )
        lines.append(
            f"- ε = 1: federated methods at or above going alone: {', '.join(fed1) if fed1 else 'none'}."
        )
        why_proxyfl = []
        for lab in PROXYFL_LABELS:
            rs = R.get(f, lab, 8.0)
            figs = {
                k: _mean([r["accs"].get(f"{k}_acc") for r in rs]) for k in ("proxy", "private", "combined")
            }
            if rs and all(v is not None for v in figs.values()):
                why_proxyfl.append(
                    f"{lab}: proxy {figs['proxy']:.3f}, private {figs['private']:.3f}, combined "
                    f"{figs['combined']:.3f}"
                )
        if pm is not None and pm < ref_mean + 0.08 and why_proxyfl:
            tried = [
                f"α {t['settings'].get('dml_alpha')}: {t['validation']:.3f}"
                for lab in PROXYFL_LABELS
                for r in R.get(f, lab, 8.0)
                for t in r.get("trials") or []
                if t.get("validation") is not None
                and "dml_alpha" in t.get("settings", {})
                and lab != "ProxyFL (strict)"
            ]
            lines.append(
                "- What limits ProxyFL's site models at ε = 8 ("
                + "; ".join(why_proxyfl)
                + "): a private model learns from the proxy only through distillation on its own site's "
                "rows (80 % of them one class), so it keeps the site's skew, and the combination is fitted "
                "on that site's held-out rows, which have the same skew, while the test set is balanced."
                + (
                    f" The complete graph's tuning (private model, validation split): {', '.join(tried)}."
                    if tried
                    else ""
                )
            )
        for lab in ("DP-FedAvg (no intermediaries)",):  # one update per hospital: the plain mechanism
            rs = R.get(f, lab, 8.0)
            if f == "scatter" and rs and rs[0].get("sigma"):
                from silofl.models import build_model

                z, K = rs[0]["sigma"], BASE["clients"]
                d = sum(p.numel() for p in build_model("linear", (81, 7, 7), 10).parameters())
                lines.append(
                    f"- What limits client-level {lab} at ε = 8 ({_mean([r['test'] for r in rs]):.3f}, σ "
                    f"{z:.2f}, {rs[0]['rounds']} rounds, K = {K} hospitals): the unit is a whole hospital, "
                    "so every round the server adds noise of standard deviation σ·C to the sum of K clipped "
                    "updates (norm ≤ C each); on the average that is σ·C/K per coordinate over the linear "
                    f"head's d = {d:,} coordinates, a noise vector of norm about σ·C·√d/K = "
                    f"{z * d**0.5 / K:.0f}·C against updates of norm at most C. More rounds need a larger σ "
                    "at the same ε; only many more hospitals (K in the hundreds or more) average it out."
                )
        ceil = _mean([r["test"] for r in R.get(f, CEILING[0], None)])
        joint = {eps: _mean([r["test"] for r in R.get(f, "Joint", eps)]) for eps in BUDGETS}
        if ceil is not None and all(v is not None for v in joint.values()):
            lines.append(
                f"- What limits the shared models: every site's rows pooled without DP reach {ceil:.3f} on "
                "these features; Joint — the same pooled rows under one DP-SGD mechanism at the same ε — "
                + " / ".join(f"{joint[e]:.3f}" for e in BUDGETS)
                + f" at ε = {' / '.join(f'{e:g}' for e in BUDGETS)}. FedAvg's round (one local DP step per "
                "site) is Joint's step with every site adding its own noise: each site protects its rows "
                "against everyone who sees its upload, the server included, so the average of K = "
                f"{BASE['clients']} sites' noise has √{BASE['clients']} ≈ {BASE['clients'] ** 0.5:.1f} times "
                "the standard deviation of one pooled mechanism's. The ε = 8 target (0.85) is "
                + ("above" if joint[8.0] < 0.85 else "at or below")
                + f" Joint's {joint[8.0]:.3f}, and ε = 3's (0.80) "
                + ("above" if joint[3.0] < 0.80 else "below")
                + f" Joint's {joint[3.0]:.3f}. The sites' noise can only shrink to Joint's if it is added "
                "once for all sites, which needs secure aggregation with distributed noise (no party sees "
                "one site's update): the next section."
            )
        lines.append("")
        lines += _pooled_section(R, f, root)
    lines += _search_section(doc.parent / "data" / "recipe_search.json")
    # tuning cost
    tc = [r for r in R.ok if r.get("tuning", {}).get("trials")]
    if tc:
        secs = sum(r["tuning"]["seconds"] for r in tc)
        lines += [
            "## Tuning cost",
            "",
            f"{sum(r['tuning']['trials'] for r in tc)} trials"
            + (
                f" ({sum(r['tuning']['trials'] for r in tc if not r.get('carried'))} of them this "
                "generation's)"
                if any(r.get("carried") for r in tc)
                else ""
            )
            + f", {secs / 60:.1f} CPU-minutes of wall time (this generation's tuning) on the "
            "shared machine. Validation data being public does not make tuning free: each trial trained on "
            "the "
            "sites' private data and the choice depends on all of them. Composing every trial of a (method, "
            "budget) — what each site's accountant would record had all trials been one run — gives the "
            "tuning-inclusive ε per site (*random*: what `silofl tune --random-trials poisson:μ`, μ = the "
            "grid's "
            "size, would report by Papernot & Steinke's Theorem 6 for the same mechanisms):",
            "",
            "| features | method | ε = 1 | ε = 3 | ε = 8 |",
            "|---|---|---|---|---|",
        ]
        for f in features:
            base = root if f == "none" else root / f"features-{f}"
            for label in labels:
                cells = []
                for eps in BUDGETS:
                    rs = [r for r in R.get(f, label, eps) if r.get("tuning", {}).get("max") is not None]
                    ps = (
                        _random_trials_epsilon(
                            base / _slug(label) / f"eps{eps:g}" / f"seed{TUNE_SEED}" / "tune"
                        )
                        if rs
                        else None
                    )
                    cells.append(
                        f"{max(r['tuning']['max'] for r in rs):.2f} ({rs[0]['tuning']['trials']} trials"
                        + (f"; random: {ps:.2f}" if ps is not None else "")
                        + ")"
                        if rs
                        else "—"
                    )
                if any(c != "—" for c in cells):
                    lines.append(f"| {f} | {label} | " + " | ".join(cells) + " |")
        lines += [
            "",
            "Selection: ProxyFL and FML were selected on their private models' validation accuracy (their "
            "headline), which is not a DP output: which of the grid's settings won is not covered by either "
            "figure; `--random-trials` selects them on the DP proxy instead. A site that wants the table's ε "
            "to "
            "include tuning should tune at a fraction of its budget, or on another collaboration's public "
            "data.",
        ]
    lines += [
        "",
        "At ε = 1 Opacus may warn that the best Rényi order is the largest of its grid: the ε printed is a "
        "valid bound but not the tightest one.",
        "",
        PAPER_NOTE,
        "",
    ]
    # the plot: one panel per feature stage
    fig, axes = plt.subplots(1, len(features), figsize=(6 * len(features), 4.5), sharey=True, squeeze=False)
    for ax, f in zip(axes[0], features, strict=True):
        for i, label in enumerate(labels):  # one colour each (20 of them), then the markers tell them apart
            pts = []
            for e in BUDGETS:
                rs = R.get(f, label, e)
                if rs:
                    k, vals = R.shared(rs)
                    pts.append((e, _mean(vals) if k else _mean([r["test"] for r in rs])))
            if pts:
                ax.plot(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    marker="os^"[i // 20 % 3],
                    color=plt.get_cmap("tab20")(i % 20),
                    label=label,
                )
        ref_label, ref = R.alone(f)
        if ref:
            ax.axhline(_mean(list(ref.values())), color="k", linestyle="--", label=f"alone: {ref_label}")
        ax.set_xscale("log")
        ax.set_xticks(BUDGETS, [f"{e:g}" for e in BUDGETS])
        ax.minorticks_off()
        ax.set_xlabel("ε per site (δ = 1e-5)")
        ax.set_title(f"features: {f}")
    axes[0][0].set_ylabel("test accuracy (shared DP model; else headline)")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    png = doc.parent / "privacy_utility.png"
    fig.savefig(png, dpi=110)
    plt.close(fig)
    lines.insert(lines.index("## Does collaborating pay?"), "![accuracy against ε](privacy_utility.png)\n")
    (root / "rows.json").write_text(json.dumps(rows, indent=1, default=str))
    _write_csv(R.ok, doc.parent / "data" / "privacy_utility.csv")
    text = "\n".join(lines) + "\n"
    doc.write_text(text)
    return text


def _search_section(path: Path) -> list[str]:
    """The search beyond the grid (``studies.recipe_search``'s data file), as a section; none without it."""
    if not path.is_file():
        return []
    data = json.loads(path.read_text())
    lines = [
        "## The search beyond the grid (validation split)",
        "",
        f"Generated by `{data['command']}` ({data['split']}; the test split never read). Each row changes "
        "the study's settings for that method on this stage as named; the figures are validation accuracies "
        "of the method's models. They decided what the grids above search and the README's main job; none "
        "of them is a test figure.",
        "",
        "| ε | method | what changed | changes | validation accuracy |",
        "|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        changes = ", ".join(
            f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in r["changes"].items()
        )
        accs = ", ".join(f"{k} {v:.3f}" for k, v in r["validation"].items())
        lines.append(f"| {r['budget']:g} | {r['label']} | {r['what']} | {changes} | {accs} |")
    return lines + [""]


def _write_csv(rows: list[dict], path: Path) -> None:
    import csv

    path.parent.mkdir(parents=True, exist_ok=True)
    cols = [
        "label",
        "method",
        "budget",
        "seed",
        "headline",
        "test",
        "epsilon",
        "sigma",
        "rounds",
        "settings",
        "validation",
        "tuning_trials",
        "tuning_epsilon",
        "features",
        "carried_from",
        "accs",
    ]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in rows:
            t = r.get("tuning", {})
            w.writerow(
                [
                    r.get("label"),
                    r.get("method"),
                    r.get("budget"),
                    r.get("seed"),
                    r.get("headline"),
                    r.get("test"),
                    r.get("epsilon"),
                    r.get("sigma"),
                    r.get("rounds"),
                    json.dumps(r.get("settings")),
                    r.get("validation"),
                    t.get("trials"),
                    t.get("max"),
                    r.get("features", "none"),
                    r.get("carried"),
                    json.dumps(r.get("accs") or {}),
                ]
            )


CARRIED = (
    "carried over"  # rows of feature stages not re-run: taken from the CSV the previous generation wrote
)


def carried_rows(
    csv_path: Path,
    features: tuple[str, ...],
    labels: tuple[str, ...] | None = None,
    budgets: tuple[float, ...] = BUDGETS,
) -> list[dict]:
    """The rows of ``csv_path`` (an earlier generation's CSV) whose feature stage is not among ``features``:
    kept as they were (headline figure, ε, σ, settings), marked ``carried``; a CSV without a ``features``
    column is of the pixel stage (``none``). With ``labels``, a row of a feature stage in ``features`` is
    carried too when its label is not among them, and so is a row whose budget is not among ``budgets`` (the
    rows this generation did not run)."""
    import csv

    if not csv_path.is_file():
        return []
    out = []
    with open(csv_path, newline="") as f:
        for r in csv.DictReader(f):
            feats = r.get("features") or "none"
            ran = (
                feats in features
                and (labels is None or r["label"] in labels)
                and (not r.get("budget") or float(r["budget"]) in budgets)
            )
            if ran or r.get("carried") == "no":
                continue

            def num(k, r=r):
                return float(r[k]) if r.get(k) not in (None, "") else None

            out.append(
                {
                    "label": r["label"],
                    "method": r["method"],
                    "budget": num("budget"),
                    "seed": int(r["seed"]),
                    "features": feats,
                    "headline": r["headline"],
                    "test": num("test"),
                    "epsilon": num("epsilon"),
                    "sigma": num("sigma"),
                    "rounds": int(float(r["rounds"])) if r.get("rounds") else None,
                    "settings": json.loads(r["settings"]) if r.get("settings") else {},
                    "validation": num("validation"),
                    "accs": {r["headline"]: num("test"), **json.loads(r.get("accs") or "{}")},
                    "tuning": {
                        "trials": int(float(r["tuning_trials"])) if r.get("tuning_trials") else 0,
                        "max": num("tuning_epsilon"),
                        "seconds": 0.0,
                    },
                    "carried": r.get("carried_from") or "the previous generation of this document",
                }
            )
    return out


def tuned_settings(csv_path: Path, features: tuple[str, ...], labels: tuple[str, ...]) -> dict:
    """{(features, label, ε): {"settings", "record"}} of ``labels`` from an earlier generation's CSV: the
    settings its tuning on TUNE_SEED chose and that tuning's record (validation figure, trials, tuning ε)."""
    import csv

    if not labels:
        return {}
    if not csv_path.is_file():
        raise SystemExit(f"--refinal needs the previous generation's CSV ({csv_path}); there is none")
    out: dict = {}
    with open(csv_path, newline="") as f:
        for r in csv.DictReader(f):
            feats = r.get("features") or "none"
            if r["label"] not in labels or feats not in features or not r.get("budget"):
                continue
            if int(r["seed"]) != TUNE_SEED:
                continue
            out[(feats, r["label"], float(r["budget"]))] = {
                "settings": json.loads(r["settings"]),
                "record": {
                    "validation": float(r["validation"]) if r.get("validation") else None,
                    "trials": int(float(r["tuning_trials"])) if r.get("tuning_trials") else 0,
                    "max": float(r["tuning_epsilon"]) if r.get("tuning_epsilon") else None,
                },
            }
    return out


def main(argv: list[str] | None = None) -> None:
    """Run (or resume) the study and write the document."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/privacy_utility")
    ap.add_argument("--doc", default=str(Path(__file__).resolve().parents[1] / "docs" / "privacy_utility.md"))
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument(
        "--features",
        default=",".join(FEATURE_SETS),
        help="feature stages to run, comma-separated (default: all)",
    )
    ap.add_argument(
        "--budgets",
        default=",".join(f"{b:g}" for b in BUDGETS),
        help="the budgets to run, comma-separated (default: all); the document shows every finished one",
    )
    ap.add_argument(
        "--labels",
        default=None,
        help="only these rows (labels separated by ';', as labels hold commas; default: all); the others are "
        "carried over from the previous generation's CSV",
    )
    ap.add_argument(
        "--refinal",
        default="",
        help="rows (labels separated by ';') re-run on every seed with the settings the previous "
        "generation's tuning chose (its CSV), without tuning again",
    )
    ap.add_argument("--report-only", action="store_true")
    a = ap.parse_args(argv)
    features = tuple(f.strip() for f in a.features.split(","))
    bad = [f for f in features if f not in FEATURE_SETS]
    if bad:
        ap.error(f"unknown feature stage(s) {bad}; choose from {list(FEATURE_SETS)}")
    seeds = [int(s) for s in a.seeds.split(",")]
    root = Path(a.out)
    root.mkdir(parents=True, exist_ok=True)
    budgets = tuple(float(b) for b in a.budgets.split(","))
    if not set(budgets) <= set(BUDGETS):
        ap.error(f"budgets must be among {BUDGETS}")
    csv_path = Path(a.doc).parent / "data" / "privacy_utility.csv"
    fresh = tuple(x.strip() for x in a.labels.split(";") if x.strip()) if a.labels else None
    again = tuple(x.strip() for x in a.refinal.split(";") if x.strip())
    known = {m[0] for f in features for m in FEATURE_SETS[f][1]} | {ALONE[0], OWN, PUBSUB[0], CEILING[0]}
    bad = [x for x in (*(fresh or ()), *again) if x not in known]
    if bad:
        ap.error(f"unknown label(s) {bad}; choose from {sorted(known)}")
    refinal = tuned_settings(csv_path, features, again)
    ran = None if fresh is None and not again else (*(fresh or ()), *again)
    rows = (
        collect(root, seeds, features, fresh, refinal, budgets)
        if a.report_only
        else run_all(root, seeds, a.jobs, features, budgets, fresh, refinal)
    )
    carried = carried_rows(csv_path, features, ran, budgets)
    cmd = (
        f"python -m studies.privacy_utility --out {a.out} --seeds {a.seeds} --jobs {a.jobs} "
        f"--features {','.join(features)}"
        + (f" --budgets {a.budgets}" if set(budgets) != set(BUDGETS) else "")
        + (f" --labels '{';'.join(fresh)}'" if fresh else "")
        + (f" --refinal '{';'.join(again)}'" if again else "")
    )
    document(rows + carried, root, Path(a.doc), seeds, cmd, tuple(FEATURE_SETS) if carried else features)
    print(f"wrote {a.doc}", file=sys.stderr)


if __name__ == "__main__":
    main()
