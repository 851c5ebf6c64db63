"""The PubSub-ML experiments (the paper's study: in the repository, not the installed package), run as
``python -m studies.pubsub_scenarios NAME --out DIR [--quick] [--seeds 0,1,2]`` (every scenario at full size:
``bash bench/pubsub_scenarios.sh``). Each scenario builds sites from data available here, runs PubSub-ML
(DP publishers), PubSub-ML* (the same publishers without DP), Own (the subscriber alone) and the DP
federated baselines (FedAvg / FedProx / FedAdam, vanilla V and fine-tuned F, at the minimum of the
publishers' ε), and writes a table (CSV + Markdown, one row per method), ``results.json`` and a plot.

| scenario | data | what varies |
|---|---|---|
| ``iid`` | Fashion-MNIST (``--quick``: scikit-learn digits) | sites drawn IID |
| ``non-iid`` | same | each site 80 % from one class (the ProxyFL papers' skew) |
| ``distributed-features`` | breast cancer (scikit-learn) | feature groups split across sites; same population
(random rows) and different populations (rows by tumour radius) |
| ``regression`` | diabetes (scikit-learn) | feature subsets per site, DP linear regression + DP-SGD network |
| ``stream`` | river's Hyperplane generator (drifting) | ensemble size k = 1…8, accuracy on the latest chunk |
| ``noisy-sites`` | breast cancer | half the publishers publish pure noise |
| ``scale`` | Hyperplane | 1000 publishers × 500 points; customization time by load / select / fuse for All,
top-100/50/10 |

Every (ε, δ) printed comes from the mechanism that ran: the publishers' DP-SGD accountant or
diffprivlib's ε, and the FL baselines' RDP accountant (client level, q = 1).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from silofl.core.errors import ConfigError
from silofl.core.extras import require
from silofl.pubsub.customize import LocalData, customize, split
from silofl.pubsub.dp_models import Bounds, train
from studies.fl_baselines import evaluate, fine_tune, run_fl

SCENARIOS = ("iid", "non-iid", "distributed-features", "regression", "stream", "noisy-sites", "scale")
FL_METHODS = ("fedavg", "fedprox", "fedadam")


@dataclass
class Site:
    name: str
    x: np.ndarray  # raw values of ``features``
    y: np.ndarray
    features: list[str]


@dataclass
class World:
    """Everything public about a scenario: feature order, bounds and defaults, task and classes."""

    features: list[str]
    lo: np.ndarray
    hi: np.ndarray
    defaults: np.ndarray
    task: str
    classes: list | None

    def bounds(self, names: list[str]) -> Bounds:
        """The public bounds of the named features, in that order."""
        idx = [self.features.index(f) for f in names]
        return Bounds(self.lo[idx], self.hi[idx])

    def default_map(self) -> dict[str, float]:
        """Each feature's public default (what a subscriber fills in for a feature it lacks)."""
        return {f: float(v) for f, v in zip(self.features, self.defaults, strict=True)}

    def to_union(self, site_x: np.ndarray, names: list[str]) -> np.ndarray:
        """Rows in the union feature space scaled to [0, 1] by the public bounds; missing features are 0."""
        out = np.zeros((len(site_x), len(self.features)))
        idx = [self.features.index(f) for f in names]
        out[:, idx] = self.bounds(names).scale(site_x)
        return out


def world_of(x: np.ndarray, features: list[str], task: str, classes: list | None) -> World:
    """Public metadata of a data set: bounds and means of every feature (released without DP, as the paper
    assumes public defaults and domain bounds)."""
    return World(list(features), x.min(0), x.max(0), x.mean(0), task, classes)


def rows(x: np.ndarray, y: np.ndarray, idx, features: list[str], all_features: list[str], name: str) -> Site:
    """A site holding the given rows and features of a data set."""
    cols = [all_features.index(f) for f in features]
    return Site(name, x[np.asarray(idx)][:, cols], y[np.asarray(idx)], list(features))


# ---------------------------------------------------------------------------------------------- one case
def run_case(
    world: World,
    publishers: list[Site],
    subscriber: Site,
    *,
    kinds: list[str],
    epsilons: list[float],
    delta: float,
    seed: int,
    top_m: int | None = None,
    fl_rounds: int = 30,
    fl: bool = True,
    train_options: dict | None = None,
    private_only: bool = False,
) -> dict:
    """One seed of PubSub-ML, PubSub-ML*, Own and the FL baselines; {method: metric} plus details."""
    opts = train_options or {}
    dp, star = [], []
    t0 = time.perf_counter()
    for p, kind, eps in zip(publishers, kinds, epsilons, strict=True):
        common = {
            "publisher": p.name,
            "features": p.features,
            "task": world.task,
            "bounds": world.bounds(p.features),
            "epsilon": eps,
            "delta": delta,
            "classes": world.classes,
            "seed": seed,
            **opts,
        }
        if world.task == "regression" and kind == "dp-linreg":
            common["y_bounds"] = (0.0, 1.0)  # targets are scaled to [0, 1] by their public range
        dp.append(train(kind, p.x, p.y, **common))
        if not private_only:
            star.append(train(kind, p.x, p.y, nonprivate=True, **common))
    t_publish = time.perf_counter() - t0
    local = LocalData(subscriber.x, subscriber.y, subscriber.features, world.task, world.classes)
    idx = split(len(subscriber.x), seed=seed)
    res = customize(dp, local, world.default_map(), top_m=top_m, seed=seed, idx=idx)
    out = {"PubSub-ML": res.report["test"], "Own": res.report["own_test"]}
    details = {
        "selected": res.report["selected"],
        "seconds": res.report["seconds"],
        "publish_seconds": t_publish,
        "publisher_epsilons": [m.epsilon for m in dp],
        "publisher_mechanisms": [m.mechanism["name"] for m in dp],
    }
    if not private_only:
        out["PubSub-ML*"] = customize(
            star, local, world.default_map(), top_m=top_m, seed=seed, idx=idx
        ).report["test"]
    if fl:
        tr, cu, te = idx
        train_rows = np.concatenate([tr, cu])  # the subscriber takes part in FL with all its non-test rows
        sites = [(world.to_union(p.x, p.features), p.y) for p in publishers]
        sites.append(
            (world.to_union(subscriber.x[train_rows], subscriber.features), subscriber.y[train_rows])
        )
        x_te = world.to_union(subscriber.x[te], subscriber.features)
        x_own = world.to_union(subscriber.x[train_rows], subscriber.features)
        n_out = len(world.classes) if world.task == "classification" else 1
        eps_fl = min(m.epsilon for m in dp)
        details["fl_epsilon_target"] = eps_fl
        for method in FL_METHODS:
            model, info = run_fl(
                method,
                sites,
                world.task,
                n_out,
                epsilon=eps_fl,
                delta=min(delta, 1 / len(sites)),
                rounds=fl_rounds,
                seed=seed,
            )
            name = {"fedavg": "FedAvg", "fedprox": "FedProx", "fedadam": "FedAdam"}[method]
            out[f"{name}-V"] = evaluate(model, x_te, subscriber.y[te], world.task)
            out[f"{name}-F"] = evaluate(
                fine_tune(model, x_own, subscriber.y[train_rows], world.task, seed=seed),
                x_te,
                subscriber.y[te],
                world.task,
            )
            details[f"{name}_epsilon"] = info["epsilon"]
    return {"metrics": out, "details": details}


# ---------------------------------------------------------------------------------------------- data
def _images(quick: bool, seed: int):
    from silofl.data import load_dataset

    data = load_dataset("digits" if quick else "fashion-mnist", seed=seed)
    x = data.x_train.flatten(1).numpy().astype(np.float64)
    y = data.y_train.numpy()
    feats = [f"px{i}" for i in range(x.shape[1])]
    classes = data.class_names or [str(c) for c in range(data.num_classes)]
    world = World(
        feats,
        np.full(len(feats), float(x.min())),
        np.full(len(feats), float(x.max())),
        x.mean(0),
        "classification",
        list(classes),
    )
    return x, y, feats, world, data.name


def _cancer():
    from sklearn.datasets import load_breast_cancer

    d = load_breast_cancer()
    feats = [f.replace(" ", "_") for f in d.feature_names]
    return d.data, d.target, feats, world_of(d.data, feats, "classification", ["malignant", "benign"])


def image_case(kind: str, quick: bool, seed: int) -> tuple[World, list[Site], Site, dict]:
    """The IID or non-IID image scenario's world, publishers and subscriber for one seed."""
    from silofl.data.partition import iid, p_major

    x, y, feats, world, name = _images(quick, seed)
    k, n, n_sub = ((4, 150, 300) if kind == "iid" else (4, 100, 100)) if quick else (9, 1000, 2000)
    rng = np.random.default_rng(seed)
    if kind == "iid":
        parts = iid(y, k + 1, n, rng)
    else:
        parts = p_major(y, k + 1, n, 0.8, rng)
    sub_idx = parts[-1]
    if n_sub > n:  # the subscriber gets more rows, drawn like its own part
        extra = np.setdiff1d(np.arange(len(y)), np.concatenate(parts))
        if kind == "iid":
            more = rng.choice(extra, n_sub - n, replace=False)
        else:
            major = np.bincount(y[sub_idx]).argmax()
            pool_major, pool_rest = extra[y[extra] == major], extra[y[extra] != major]
            m = int(0.8 * (n_sub - n))
            more = np.concatenate(
                [
                    rng.choice(pool_major, m, replace=False),
                    rng.choice(pool_rest, n_sub - n - m, replace=False),
                ]
            )
        sub_idx = np.concatenate([sub_idx, more])
    pubs = [rows(x, y, parts[i], feats, feats, f"site{i}") for i in range(k)]
    return (
        world,
        pubs,
        rows(x, y, sub_idx, feats, feats, "subscriber"),
        {"data": name, "publishers": k, "rows_per_publisher": n, "subscriber_rows": len(sub_idx)},
    )


# ---------------------------------------------------------------------------------------------- scenarios
def _summarise(per_seed: list[dict]) -> dict:
    methods = list(per_seed[0]["metrics"])
    return {
        m: {
            "mean": statistics.fmean(s["metrics"][m] for s in per_seed),
            "std": statistics.pstdev([s["metrics"][m] for s in per_seed]),
            "n": len(per_seed),
        }
        for m in methods
    }


def scenario_images(kind: str, seeds, quick: bool) -> dict:
    """The IID or non-IID image scenario over seeds."""
    eps = 1.0
    cases, info = [], {}
    for seed in seeds:
        world, pubs, sub, info = image_case(kind, quick, seed)
        opts = {"epochs": 3 if quick else 10, "hidden": 32 if quick else 64}
        cases.append(
            run_case(
                world,
                pubs,
                sub,
                kinds=["dp-nn"] * len(pubs),
                epsilons=[eps] * len(pubs),
                delta=1e-5,
                seed=seed,
                fl_rounds=3 if quick else 30,
                train_options=opts,
            )
        )
    return {
        "setting": {**info, "model": "dp-nn (DP-SGD MLP)", "epsilon": eps, "delta": 1e-5},
        "summary": _summarise(cases),
        "per_seed": cases,
    }


def scenario_distributed_features(seeds, quick: bool) -> dict:
    """Feature groups split across sites; same and different populations."""
    x, y, feats, world = _cancer()
    groups = {"mean": feats[0:10], "error": feats[10:20], "worst": feats[20:30]}
    pub_feats = [groups["mean"], groups["error"], groups["worst"], groups["mean"] + groups["worst"]]
    sub_feats = groups["mean"][:5] + groups["worst"][:5]
    out = {}
    for population in ("same", "different"):
        cases = []
        for seed in seeds:
            rng = np.random.default_rng(seed)
            if population == "same":
                parts = np.array_split(rng.permutation(len(y)), 5)
                sub_part = parts.pop()
            else:  # contiguous blocks of mean radius: each site sees a different range of tumour sizes, and
                # the subscriber the middle block (both classes present)
                parts = np.array_split(np.argsort(x[:, 0] + rng.normal(0, 0.5, len(y)), kind="stable"), 5)
                sub_part = parts.pop(2)
            pubs = [rows(x, y, parts[i], f, feats, f"site{i}") for i, f in enumerate(pub_feats)]
            sub = rows(x, y, sub_part, sub_feats, feats, "subscriber")
            cases.append(
                run_case(
                    world,
                    pubs,
                    sub,
                    kinds=["dp-logreg"] * 4,
                    epsilons=[1.0, 1.0, 2.0, 2.0],
                    delta=1e-5,
                    seed=seed,
                    fl_rounds=5 if quick else 30,
                )
            )
        out[population] = {"summary": _summarise(cases), "per_seed": cases}
    return {
        "setting": {
            "data": "breast cancer (569 rows, 30 features)",
            "publishers": 4,
            "publisher_features": [len(f) for f in pub_feats],
            "subscriber_features": sub_feats,
            "model": "dp-logreg",
            "epsilons": [1.0, 1.0, 2.0, 2.0],
            "delta": 1e-5,
        },
        "populations": out,
    }


def scenario_regression(seeds, quick: bool) -> dict:
    """Regression on diabetes with feature subsets per site."""
    from sklearn.datasets import load_diabetes

    d = load_diabetes()
    feats = list(d.feature_names)
    x = d.data
    y = (d.target - d.target.min()) / (d.target.max() - d.target.min())  # scaled by the target's public range
    world = world_of(x, feats, "regression", None)
    pub_feats = [feats[0:5], feats[3:8], feats[5:10]]
    sub_feats = [feats[0], feats[2], feats[8], feats[9]]
    cases = []
    for seed in seeds:
        parts = np.array_split(np.random.default_rng(seed).permutation(len(y)), 4)
        pubs = [rows(x, y, parts[i], f, feats, f"site{i}") for i, f in enumerate(pub_feats)]
        sub = rows(x, y, parts[3], sub_feats, feats, "subscriber")
        cases.append(
            run_case(
                world,
                pubs,
                sub,
                kinds=["dp-linreg", "dp-nn", "dp-linreg"],
                epsilons=[1.0, 2.0, 1.0],
                delta=1e-5,
                seed=seed,
                fl_rounds=5 if quick else 30,
                train_options={"epochs": 5 if quick else 30, "hidden": 16},
            )
        )
    return {
        "setting": {
            "data": "diabetes (442 rows, 10 features); target scaled to [0, 1] by its public range; "
            "metric MSE (lower is better)",
            "publishers": 3,
            "models": ["dp-linreg", "dp-nn", "dp-linreg"],
            "epsilons": [1.0, 2.0, 1.0],
            "delta": 1e-5,
        },
        "summary": _summarise(cases),
        "per_seed": cases,
    }


def _hyperplane(n: int, seed: int, n_features: int = 10, drift: float = 0.001):
    import itertools

    require("river", "pubsub", "the PubSub-ML stream scenarios (river's Hyperplane stream)")
    from river.datasets import synth

    gen = synth.Hyperplane(
        seed=seed,
        n_features=n_features,
        n_drift_features=n_features // 2,
        mag_change=drift,
        noise_percentage=0.05,
        sigma=0.1,
    )
    xs, ys = [], []
    for xd, label in itertools.islice(gen, n):
        xs.append([xd[i] for i in range(n_features)])
        ys.append(int(label))
    return np.array(xs), np.array(ys)


def scenario_stream(seeds, quick: bool) -> dict:
    """P publishers and one subscriber share a drifting Hyperplane stream, interleaved chunk by chunk; each
    publisher keeps its k latest models (disjoint chunks); at every step the subscriber customizes on its
    latest chunk (split 60/20/20) and is scored on that chunk's test part."""
    from silofl.pubsub.stream import StreamPublisher

    publishers, chunk, steps = (2, 200, 6) if quick else (4, 500, 24)
    sizes = [1, 2, 4] if quick else [1, 2, 4, 8]
    feats = [f"x{i}" for i in range(10)]
    world = World(feats, np.zeros(10), np.ones(10), np.full(10, 0.5), "classification", ["0", "1"])
    table = {}
    for k in sizes:
        accs, own = [], []
        for seed in seeds:
            x, y = _hyperplane((publishers + 1) * chunk * steps, seed)
            streams = [
                StreamPublisher(
                    f"site{p}",
                    feats,
                    "classification",
                    "dp-logreg",
                    1.0,
                    1e-5,
                    world.bounds(feats),
                    k=k,
                    classes=world.classes,
                    seed=seed * 100 + p,
                )
                for p in range(publishers)
            ]
            for t in range(steps):
                base = t * (publishers + 1) * chunk
                for p, s in enumerate(streams):
                    ids = np.arange(base + p * chunk, base + (p + 1) * chunk)
                    s.add_chunk(x[ids], y[ids], ids)
                sub = np.arange(base + publishers * chunk, base + (publishers + 1) * chunk)
                if t < min(sizes[-1], steps - 1):  # let every ensemble size fill before scoring
                    continue
                models = [m for s in streams for m in s.models()]
                res = customize(
                    models,
                    LocalData(x[sub], y[sub], feats, "classification", world.classes),
                    world.default_map(),
                    seed=seed + t,
                    epochs=100,
                )
                accs.append(res.report["test"])
                own.append(res.report["own_test"])
        table[k] = {
            "PubSub-ML": {"mean": statistics.fmean(accs), "std": statistics.pstdev(accs), "n": len(accs)},
            "Own": {"mean": statistics.fmean(own), "std": statistics.pstdev(own), "n": len(own)},
        }
    return {
        "setting": {
            "data": "river Hyperplane (10 features, 5 drifting, mag_change 0.001, 5 % label noise)",
            "publishers": publishers,
            "chunk_rows": chunk,
            "steps": steps,
            "model": "dp-logreg",
            "epsilon": 1.0,
            "delta": 1e-5,
            "guarantee": "each record is in exactly one chunk's model: (ε, δ) = (1, 1e-5) for the whole "
            "stream by parallel composition, whatever k and the number of steps",
        },
        "by_ensemble_size": {str(k): v for k, v in table.items()},
    }


def scenario_noisy(seeds, quick: bool) -> dict:
    """Half the publishers publish pure noise: does top-m selection drop them?"""
    x, y, feats, world = _cancer()
    out = {"all": [], "good only": [], "top-4": []}
    noisy_selected = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        perm = rng.permutation(len(y))
        parts = [perm[i * 50 : (i + 1) * 50] for i in range(8)] + [
            perm[400:]
        ]  # 8 × 50 rows; the subscriber 169
        pubs = [rows(x, y, parts[i], feats, feats, f"site{i}") for i in range(8)]
        for i in range(4, 8):  # pure noise: labels drawn at random, features shuffled
            pubs[i] = Site(f"noisy{i}", rng.permutation(pubs[i].x), rng.integers(0, 2, len(pubs[i].y)), feats)
        sub = rows(x, y, parts[8], feats[:10], feats, "subscriber")
        dp = [
            train(
                "dp-logreg",
                p.x,
                p.y,
                publisher=p.name,
                features=p.features,
                task="classification",
                bounds=world.bounds(p.features),
                epsilon=1.0,
                delta=1e-5,
                classes=world.classes,
                seed=seed,
            )
            for p in pubs
        ]
        local = LocalData(sub.x, sub.y, sub.features, "classification", world.classes)
        idx = split(len(sub.y), seed=seed)
        for name, models, m in (("all", dp, None), ("good only", dp[:4], None), ("top-4", dp, 4)):
            rep = customize(models, local, world.default_map(), top_m=m, seed=seed, idx=idx).report
            out[name].append(rep["test"])
            if name == "top-4":
                noisy_selected.append(sum(s.startswith("noisy") for s in rep["selected"]))
        out.setdefault("Own", []).append(rep["own_test"])
    summary = {
        f"PubSub-ML ({k})" if k != "Own" else "Own": {
            "mean": statistics.fmean(v),
            "std": statistics.pstdev(v),
            "n": len(v),
        }
        for k, v in out.items()
    }
    return {
        "setting": {
            "data": "breast cancer; 8 publishers on all 30 features, 4 of them pure noise (random labels, "
            "shuffled rows); subscriber on 10 features",
            "model": "dp-logreg",
            "epsilon": 1.0,
        },
        "summary": summary,
        "noisy_models_in_top4": noisy_selected,
    }


def scenario_scale(seeds, quick: bool, out_dir: Path) -> dict:
    """1000 publishers × 500 points publish DP logistic regressions to a broker; the subscriber fetches every
    model (load), scores them (select) and fuses the top m (fuse)."""
    from silofl.pubsub.broker import Broker

    n_pub, n = (30, 100) if quick else (1000, 500)
    feats = [f"x{i}" for i in range(10)]
    world = World(feats, np.zeros(10), np.ones(10), np.full(10, 0.5), "classification", ["0", "1"])
    seed = seeds[0]
    x, y = _hyperplane(n_pub * n + 2000, seed, drift=0.0)
    broker = Broker(out_dir / "broker")
    t0 = time.perf_counter()
    for p in range(n_pub):
        broker.join(f"site{p}", {f: ("continuous", 0.5, 0.0, 1.0) for f in feats})
        sl = slice(p * n, (p + 1) * n)
        m = train(
            "dp-logreg",
            x[sl],
            y[sl],
            publisher=f"site{p}",
            features=feats,
            task="classification",
            bounds=world.bounds(feats),
            epsilon=1.0,
            delta=1e-5,
            classes=world.classes,
            seed=p,
        )
        broker.publish(m.to_bytes())
    t_publish = time.perf_counter() - t0
    broker.join("subscriber")
    ch = broker.subscribe("subscriber", [feats[:3]])
    sub = slice(n_pub * n, n_pub * n + 2000)
    local = LocalData(x[sub], y[sub], feats, "classification", world.classes)
    results = {}
    for m in [None, 100, 50, 10] if not quick else [None, 10]:
        t1 = time.perf_counter()
        models = [broker.fetch(i) for i in broker.stream(ch.id)]
        t_load = time.perf_counter() - t1
        rep = customize(models, local, world.default_map(), top_m=m, seed=seed, own=None, epochs=100).report
        results["All" if m is None else f"top-{m}"] = {
            "load": t_load,
            "select": rep["seconds"]["select"],
            "fuse": rep["seconds"]["fuse"],
            "test": rep["test"],
            "models": len(models),
        }
    return {
        "setting": {
            "publishers": n_pub,
            "rows_per_publisher": n,
            "model": "dp-logreg",
            "epsilon": 1.0,
            "subscriber_rows": 2000,
            "publish_seconds_total": t_publish,
            "data": "river Hyperplane (10 features, no drift)",
        },
        "timings": results,
    }


# ---------------------------------------------------------------------------------------------- output
def run_scenario(name: str, out: str | Path, quick: bool = False, seeds=None) -> dict:
    """Run one scenario (default seeds: 3 for the image and stream scenarios, 5 for the small tabular ones,
    1 for scale) and write results.json, table.csv, table.md and plot.png under ``out``."""
    if name not in SCENARIOS:
        raise ConfigError(f"unknown scenario {name!r}; choose one of: {', '.join(SCENARIOS)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if seeds is None:
        seeds = {"iid": 3, "non-iid": 3, "stream": 3, "scale": 1}.get(name, 5)
        seeds = range(seeds)
    seeds = list(seeds)[:1] if quick else list(seeds)
    t0 = time.perf_counter()
    if name in ("iid", "non-iid"):
        result = scenario_images(name, seeds, quick)
    elif name == "distributed-features":
        result = scenario_distributed_features(seeds, quick)
    elif name == "regression":
        result = scenario_regression(seeds, quick)
    elif name == "stream":
        result = scenario_stream(seeds, quick)
    elif name == "noisy-sites":
        result = scenario_noisy(seeds, quick)
    else:
        result = scenario_scale(seeds, quick, out)
    result.update(
        {"scenario": name, "quick": quick, "seeds": seeds, "wall_seconds": time.perf_counter() - t0}
    )
    (out / "results.json").write_text(json.dumps(result, indent=2, default=float))
    write_tables(name, result, out)
    return result


def _table_rows(name: str, result: dict) -> tuple[list[str], list[list]]:
    def ms(d):
        return f"{d['mean']:.4f} ± {d['std']:.4f}"

    if name == "distributed-features":
        head = ["method", "same population", "different populations"]
        methods = list(result["populations"]["same"]["summary"])
        return head, [
            [
                m,
                ms(result["populations"]["same"]["summary"][m]),
                ms(result["populations"]["different"]["summary"][m]),
            ]
            for m in methods
        ]
    if name == "stream":
        head = ["ensemble size k", "PubSub-ML", "Own"]
        return head, [[k, ms(v["PubSub-ML"]), ms(v["Own"])] for k, v in result["by_ensemble_size"].items()]
    if name == "scale":
        head = ["subscriber keeps", "models", "load s", "select s", "fuse s", "total s", "test accuracy"]
        return head, [
            [
                k,
                v["models"],
                f"{v['load']:.2f}",
                f"{v['select']:.2f}",
                f"{v['fuse']:.2f}",
                f"{v['load'] + v['select'] + v['fuse']:.2f}",
                f"{v['test']:.4f}",
            ]
            for k, v in result["timings"].items()
        ]
    metric = "MSE (lower is better)" if name == "regression" else "accuracy"
    return ["method", metric], [[m, ms(v)] for m, v in result["summary"].items()]


def write_tables(name: str, result: dict, out: Path) -> None:
    """table.csv, table.md and plot.png of a scenario's result."""
    import csv

    head, body = _table_rows(name, result)
    with open(out / "table.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(head)
        w.writerows(body)
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    md += ["| " + " | ".join(str(c) for c in r) + " |" for r in body]
    (out / "table.md").write_text("\n".join(md) + "\n")
    _plot(name, result, out / "plot.png")


def _plot(name: str, result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    if name == "stream":
        ks = list(result["by_ensemble_size"])
        for method in ("PubSub-ML", "Own"):
            v = [result["by_ensemble_size"][k][method] for k in ks]
            ax.errorbar(
                [int(k) for k in ks],
                [d["mean"] for d in v],
                yerr=[d["std"] for d in v],
                marker="o",
                label=method,
                capsize=3,
            )
        ax.set_xlabel("ensemble size k (models per publisher)")
        ax.set_ylabel("accuracy on the latest chunk")
        ax.legend()
    elif name == "scale":
        keys = list(result["timings"])
        bottom = np.zeros(len(keys))
        for part in ("load", "select", "fuse"):
            vals = np.array([result["timings"][k][part] for k in keys])
            ax.bar(keys, vals, bottom=bottom, label=part)
            bottom += vals
        ax.set_ylabel("seconds")
        ax.set_title(f"customization with {result['setting']['publishers']} publishers")
        ax.legend()
    else:
        series = (
            {
                "same": result["populations"]["same"]["summary"],
                "different": result["populations"]["different"]["summary"],
            }
            if name == "distributed-features"
            else {"": result["summary"]}
        )
        methods = list(next(iter(series.values())))
        width = 0.8 / len(series)
        for j, (label, summ) in enumerate(series.items()):
            pos = np.arange(len(methods)) + j * width
            means = np.array([summ[m]["mean"] for m in methods])
            stds = np.array([summ[m]["std"] for m in methods])
            low = np.minimum(stds, means * 0.999) if name == "regression" else stds
            ax.bar(
                pos, means, width, yerr=[low, stds], capsize=2, label=f"{label} population" if label else None
            )
        ax.set_xticks(np.arange(len(methods)) + width * (len(series) - 1) / 2)
        ax.set_xticklabels(methods, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel("MSE (lower is better, log scale)" if name == "regression" else "accuracy")
        if name == "regression":  # diverged baselines sit orders of magnitude above the rest
            ax.set_yscale("log")
        if len(series) > 1:
            ax.legend(fontsize=8)
    ax.set_title(ax.get_title() or f"PubSub-ML scenario: {name}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """``python -m studies.pubsub_scenarios NAME --out DIR [--quick] [--seeds 0,1,2]``: one scenario, its
    table printed; a bad argument is one line and exit code 2."""
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m studies.pubsub_scenarios", description=main.__doc__)
    p.add_argument("name", help=" | ".join(SCENARIOS))
    p.add_argument("--out", required=True, help="output folder (table.csv, table.md, results.json, plot.png)")
    p.add_argument("--quick", action="store_true", help="shrink the scenario to seconds (one seed)")
    p.add_argument("--seeds", help="comma-separated seeds (default depends on the scenario)")
    a = p.parse_args(argv)
    try:
        seeds = [int(s) for s in a.seeds.split(",") if s.strip()] if a.seeds else None
    except ValueError:
        p.error(f"--seeds takes integers separated by commas, got {a.seeds!r}")
    t0 = time.perf_counter()
    try:
        run_scenario(a.name, a.out, quick=a.quick, seeds=seeds)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print((Path(a.out) / "table.md").read_text())
    print(f"{a.name}: {time.perf_counter() - t0:.1f} s → {a.out}/table.csv, table.md, results.json, plot.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
