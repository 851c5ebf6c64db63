"""``silofl tune``: choose a method's settings for a privacy budget without touching the test set.

Every trial is a budget-first run (σ set from ``--target-epsilon`` and the trial's own rounds and sampling
rate)
scored on the **validation split** (``eval_split: validation``): training examples of the pooled data set that
no
client holds, standing for public data of the same kind. The test split is never read by a trial. The trial
with
the best mean headline accuracy (the method's own: ``private_acc`` for ProxyFL, ``global_acc`` for FedAvg, …)
is
written to ``OUT/best.yaml`` with ``eval_split: test``, ready for one final run. With ``metric`` (``--metric
auroc``
| ``balanced_accuracy`` | ``f1`` | ``ece``) the same model is scored by that metric instead (``private_auroc``
…;
for ECE the lowest wins); every trial computes every metric from the same validation pass.

What tuning costs. Validation data being public does not make tuning free: every trial trains on the clients'
private data, and picking the best one is a function of all of them. ``tune.json`` states the tuning-inclusive
spend of each party — the RDP composition of every trial's mechanisms (what each party's accountant would have
recorded had all trials been one run), at the run's δ. That bound holds for anything released from any or all
trials, the chosen one included.

Random trials (``random_trials``, ``silofl tune --random-trials poisson:MU`` …). Instead of the whole grid, a
number K of trials is drawn from a distribution fixed in advance (Poisson, truncated negative binomial,
geometric, logarithmic) with the run's secret randomness (:class:`silofl.core.randomness.SecureRandom`; a
seeded research run draws it from the seed), each trial's settings drawn uniformly from the grid (repeats
allowed), each trial with its own independent randomness, and only the best one is kept. Papernot & Steinke
(ICLR 2022) bound what releasing the best trial alone costs (:mod:`silofl.privacy.tuning`): about one trial's
ε plus a few units, however large E[K] is, where composition grows with the number of trials. It covers
``best.yaml`` and the chosen trial's own output, not K, the other trials' scores or their folders, which stay
with whoever runs the tuning: ``tune.json`` states both, the Papernot–Steinke ε (best trial only) and the
plain composition of the K trials that ran (everything, given K). Trials are selected on a score of their DP
output: the proxies' accuracy (``proxy_acc``) for a method with mutual learning, whose private models are not
DP, the headline otherwise. Every trial of a tuning run uses one data split.

Per-site tables (``dataset: table`` with ``site_data``) have no training rows that no site holds: each site's
validation rows are carved from its own training rows (:func:`silofl.data.sites.validation_rows`: a seeded
``test_fraction`` of them, at most ``validation_size``), its test rows never read; a survival target selects
on the C-index. Those rows are the sites' private rows, so ``tune.json`` carries ``validation_note`` saying
the scores and the choice are computed from them without DP (:data:`SITE_VALIDATION_NOTE`).

Axes. Any run option is an axis (``--grid KEY=V1,V2``, values read as YAML): the DP-SGD recipe's ``lr``,
``clip``,
``batch_size`` or ``sample_rate`` (q), ``optimizer``/``momentum``, ``local_steps``, ``ema_decay``,
``augmult``,
``server_momentum`` …; ``features`` values are passed through as plain strings (``none``, ``scatter``,
``backbone:DIR``). Every combination is checked before the first trial runs.
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
import math
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from silofl.core.errors import ConfigError, DataError
from silofl.privacy.analysis import DEFAULT_ORDERS, epsilon_from_rdp, epsilon_of, rdp_curve
from silofl.privacy.tuning import SOURCE, TrialCount, parse_trial_count, repeat_and_select_epsilon
from silofl.runner.config import RunConfig
from silofl.training.metrics import higher_is_better, metric_field

AUTO_CAP_TAIL = 1e-3  # the default cap on K spends at most this share of δ (see default_cap)
STRING_AXES = ("features",)  # grid values kept as the strings given (not YAML: `off` is no boolean here)


def parse_grid(items: list[str]) -> dict[str, list[Any]]:
    """``["lr=0.001,0.003", "rounds=10,30"]`` → {"lr": [0.001, 0.003], "rounds": [10, 30]} (YAML values)."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key.strip() or not values.strip():
            raise ConfigError(f"a grid entry is KEY=V1,V2,…; got {item!r}")
        name = key.strip().replace("-", "_")
        grid[name] = (
            [v.strip() for v in values.split(",")]
            if name in STRING_AXES
            else [yaml.safe_load(v) for v in values.split(",")]
        )
    return grid


def trials(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid's values."""
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(grid[k] for k in keys))]


def _label(combo: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in combo.items()) or "base"


def tuning_cost(summaries: list[dict], folders: list[Path] | None = None) -> dict[str, Any]:
    """Each party's ε at δ for the composition of every trial it took part in (see the module doc): the
    trials' DP-SGD (σ, q, steps) by RDP, or — for a party whose trials record no DP-SGD history (secure sums
    with pooled noise, dp-ssp's one release) — every entry of its site ledger in the trials' ``folders``,
    composed by the site accountant against the server."""
    histories: dict[str, list] = {}
    kinds: dict[str, str] = {}
    delta = None
    ledgered: set[str] = set()
    for s in summaries:
        for a in s.get("accounting", []):
            party = f"client{a['client']}" if "client" in a else str(a.get("party", "server"))
            hist = a.get("history") or a.get("history_hospital")
            if not hist:
                if a.get("site_ledger") and a.get("delta") is not None:
                    ledgered.add(party)
                    delta = a["delta"]
                continue
            histories.setdefault(party, []).extend(tuple(h) for h in hist)
            kinds[party] = "prv" if a.get("accountant") == "opacus.prv" else "rdp"
            delta = a["delta"]
    if delta is None:
        return {"per_party": {}, "max": None, "delta": None}
    per = {p: epsilon_of(kinds[p], tuple(h), delta) for p, h in histories.items()}
    methods = ["RDP composition of every trial's (σ, q, steps) per party"] if per else []
    if folders is not None:
        for party in sorted(ledgered - set(per)):
            eps = _ledger_epsilon([f / "sites" / party / "ledger.jsonl" for f in folders], delta)
            if eps is not None:
                per[party] = eps
        if set(per) - set(histories):
            methods.append("the site accountant's composition of every trial's site-ledger entries per party")
    if not per:
        return {"per_party": {}, "max": None, "delta": None}
    return {
        "per_party": per,
        "max": max(per.values()),
        "delta": delta,
        "trials": len(summaries),
        "method": "; ".join(methods),
    }


def _ledger_epsilon(paths: list[Path], delta: float) -> float | None:
    """ε at ``delta`` against the server of every spending entry of the ledgers at ``paths`` composed (None
    when a trial wrote no ledger)."""
    from silofl.privacy.site_accountant import compose, epsilon_at, spend_of, with_tail

    spends = []
    for path in paths:
        if not path.is_file():
            return None
        for line in path.read_text().splitlines():
            spend = spend_of(json.loads(line))
            if spend is not None:
                spends.append(spend)
    curve, eps, dlt, tail = compose(spends, "server")
    return with_tail(lambda d: epsilon_at(curve, (eps, dlt), d), delta, tail)


def tune(
    base: RunConfig,
    grid: dict[str, list[Any]],
    out: str | Path,
    progress: bool = False,
    console=None,
    random_trials: TrialCount | str | None = None,
    max_trials: int | None = None,
    site_folders: list[str | Path] | None = None,
) -> dict:
    """Run every grid combination of ``base`` on the validation split — or, with ``random_trials``, K ~ that
    distribution trials of settings drawn from the grid, at most ``max_trials`` (default: see
    :func:`default_cap`) — and write ``OUT/tune.json``, ``tune.md`` and ``best.yaml``; return the result.
    Every check runs before the first trial: a ConfigError leaves nothing written. ``site_folders`` (one per
    site, in the order of its table): each site's one ledger is charged the tuning before the first trial
    (:func:`charge_sites`)."""
    out = Path(out)
    if (out / "tune.json").exists():
        raise ConfigError(f"{out} already holds a tuning result; choose another --out")
    if base.eval_split != "validation":
        base = base.replace(eval_split="validation")
    combos = trials(grid)
    if not combos:
        raise ConfigError("the grid is empty")
    if max_trials is not None and random_trials is None:
        raise ConfigError("--max-trials caps random trials; give --random-trials too")
    check_combinations(base, combos)
    # one data split (and so one validation split) for every trial, recorded like any run's split seed
    base = base.replace(split_seed=base.data_seed if base.data_seed is not None else secrets.randbits(32))
    check_site_validation(base, combos)
    folders = open_site_folders(site_folders) if site_folders else {}
    if random_trials is None:
        picks, random_part = list(range(len(combos))), None
    else:
        count = parse_trial_count(random_trials) if isinstance(random_trials, str) else random_trials
        if folders and max_trials is None:  # a cap whose cost stays below 0.1% of δ at each site's lifetime
            max_trials = max(default_cap(count, f.lifetime[1], f.lifetime[0]) for f in folders.values())
        picks, random_part = _draw_random_trials(base, combos, count, max_trials)
    charged = charge_sites(base, combos, picks, random_part, folders) if folders else {}
    metric = _run_metric(base)  # --metric: the validation figure trials are selected on
    headline = metric_field(base.info.headline, metric)
    score_field = random_part["selection"] if random_part else headline
    rows, summaries = [], []
    for i, idx in enumerate(picks):
        combo = combos[idx]
        cfg = base.replace(**combo, out=str(out / "trials" / f"trial{i}"))
        cfg = cfg.replace(
            eval_every=cfg.rounds
        )  # scored once, at the end: the validation score of what it releases
        if random_part is not None and base.seed is not None:  # independent trials: each its own seed
            cfg = dataclasses.replace(cfg, seed=_trial_seed(base.seed, i))
        if cfg.eval_split != "validation":
            raise ConfigError("a tuning trial must be scored on the validation split, never the test split")
        row, s = _run_trial(cfg, i, combo, score_field, progress, console)
        rows.append(row)
        summaries.append(s)
    sign = 1.0 if higher_is_better(metric) else -1.0  # ECE: the lowest wins
    best = (
        max(rows, key=lambda r: -math.inf if r["validation"] is None else sign * r["validation"])
        if rows
        else None
    )
    cost = tuning_cost(summaries, [out / "trials" / f"trial{i}" for i in range(len(summaries))])
    result: dict[str, Any] = {
        "method": base.method,
        "headline": headline,
        "selection": score_field,
        "metric": metric,
        "lower_is_better": not higher_is_better(metric),
        "target_epsilon": base.target_epsilon,
        "grid": grid,
        "validation_split": rows[0]["test_set"] if rows else None,
        "data_split_seed": base.data_seed,
        "trials": rows,
        "best": best,
        "tuning_cost": cost,
        "seconds": sum(r["seconds"] for r in rows),
    }
    if random_part is not None:
        result["random_trials"] = _random_cost(random_part, summaries)
    if base.site_data:
        result["validation_note"] = SITE_VALIDATION_NOTE
    if folders:
        added = top_up_sites(folders, charged, summaries)
        result["site_ledgers"] = {
            folders[k].name: {
                "charged": [e["seq"] for e in (charged[k], added.get(k)) if e is not None],
                "site_ledger": folders[k]
                .accountant(folders[k].policy.colluders)
                .report(folders[k].lifetime[1]),
            }
            for k in charged
        }
    out.mkdir(parents=True, exist_ok=True)
    (out / "tune.json").write_text(json.dumps(result, indent=1, default=str))
    if best is not None:
        best_dict = base.replace(**best["settings"]).replace(eval_split="test").to_dict()
        best_dict.pop("out", None)
        (out / "best.yaml").write_text(yaml.safe_dump(best_dict, sort_keys=False))
    (out / "tune.md").write_text(markdown(result))
    with open(out / "tune.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["trial", "settings", "noise_multiplier", "validation", "epsilon", "seconds"])
        for r in rows:
            w.writerow(
                [
                    r["trial"],
                    json.dumps(r["settings"]),
                    r["noise_multiplier"],
                    r["validation"],
                    r["epsilon"],
                    r["seconds"],
                ]
            )
    return result


# ------------------------------------------------------------------------------------------ site ledgers
def open_site_folders(paths: list[str | Path]) -> dict[int, Any]:
    """Site folders (``silofl site init``) by client index, in the order of the sites' tables."""
    from silofl.site.folder import SiteFolder

    folders = {k: SiteFolder.load(p) for k, p in enumerate(paths)}
    for f in folders.values():
        f.ledger  # noqa: B018 - verified and checked to be this site's before anything is charged to it
    return folders


def _unit(cfg: RunConfig) -> str:
    column = getattr(cfg, "id_column", None)
    return f"person (column {column})" if column else "row"


def charge_sites(
    base: RunConfig, combos: list[dict[str, Any]], picks: list[int], random_part: dict | None, folders: dict
) -> dict[int, dict]:
    """Before the first trial: check every trial's plan against each site's policy, then charge each site's
    one ledger a ``tuning`` entry (:func:`silofl.privacy.site_accountant.tuning_spend`) — the composition of
    the ``picks`` trials' planned (σ, q, steps), or with random trials the repeat-and-select bound of the
    grid — after its one accountant checked that the entry keeps it within its lifetime budget against the
    server plus the colluders its policy assumes. Any refusal is one ConfigError with nothing charged to any
    site. Returns the entries charged, by client index."""
    from silofl.core.errors import BudgetExhausted
    from silofl.privacy.site_accountant import planned_tuning
    from silofl.runner.plan import policy_request
    from silofl.site.policy import PolicyRefused

    planned = planned_trials(base, combos)
    n = {len([p for p in parties if p.startswith("client")]) for _, parties in planned}
    if n != {len(folders)}:
        raise ConfigError(
            f"{len(folders)} site folders given for {'/'.join(map(str, sorted(n)))} sites: give one per "
            "site, in the order of the sites' tables"
        )
    entries: dict[int, dict] = {}
    for k, folder in folders.items():
        policy = folder.policy
        for (cfg, _), combo in zip(planned, combos, strict=True):
            request = policy_request(cfg, k)
            if request.placement != "local":
                raise ConfigError(
                    f"tuning on site folders charges example-level DP-SGD trials whose noise the site adds "
                    f"itself; {_label(combo)} places it {request.placement!r}"
                )
            try:
                policy.check(request)
            except PolicyRefused as e:
                raise ConfigError(f"site {folder.name} refuses the tuning ({_label(combo)}): {e}") from None
        party, unit = f"client{k}", _unit(planned[0][0])
        if random_part is None:
            entry = planned_tuning([planned[i][1][party] for i in picks], unit=unit)
        else:
            entry = planned_tuning(
                grid=[parties[party] for _, parties in planned],
                count=random_part["count"],
                cap=random_part["cap"],
                unit=unit,
            )
        try:
            folder.accountant(policy.colluders).require(
                [entry], what=f"tuning ({len(picks)} trials)", who=f"site {folder.name}"
            )
        except BudgetExhausted as e:
            raise ConfigError(str(e)) from None
        entries[k] = entry
    for k, entry in entries.items():  # every site agreed: charge them all, before the first trial
        fields = {key: v for key, v in entry.items() if key != "kind"}
        entries[k] = folders[k].ledger.append("tuning", **fields)
    return entries


def top_up_sites(folders: dict, charged: dict[int, dict], summaries: list[dict]) -> dict[int, dict]:
    """After the trials: a site whose recorded DP-SGD steps (any trial's) exceed at any order what its
    ``tuning`` entry planned is charged, on top, the composition of every step its trials recorded (an over-
    count, never an under-count). Returns the entries added."""
    from silofl.privacy.site_accountant import ORDERS, planned_tuning, tuning_trial_curve

    added = {}
    for k, entry in charged.items():
        hists = [
            tuple(h)
            for s in summaries
            for a in s.get("accounting", [])
            if a.get("client") == k
            for h in (a.get("history") or [])
        ]
        if not hists:
            continue
        if entry["selection"] == "composition":
            pairs = [(rdp_curve(tuple(hists), ORDERS), rdp_curve(tuple(map(tuple, entry["trials"])), ORDERS))]
        else:
            top = tuning_trial_curve(entry)
            pairs = [
                (rdp_curve(tuple(map(tuple, a["history"])), ORDERS), top)
                for s in summaries
                for a in s.get("accounting", [])
                if a.get("client") == k and a.get("history")
            ]
        if any(np.any(got > want * (1 + 1e-9) + 1e-12) for got, want in pairs):
            fields = {key: v for key, v in planned_tuning(hists, unit=entry["unit"]).items() if key != "kind"}
            added[k] = folders[k].ledger.append("tuning", **fields, note="trials recorded more than planned")
    return added


def check_combinations(base: RunConfig, combos: list[dict[str, Any]]) -> None:
    """Raise ConfigError, before any trial runs, if a combination of the grid is not a valid run."""
    known = set(RunConfig.common_fields()) | set(base.info.options.field_names())
    for axis in STRING_AXES:
        if any(axis in c for c in combos) and axis not in known:
            raise ConfigError(
                f"the {axis} axis needs the run option {axis!r}, which this silofl does not have"
            )
    for combo in combos:
        try:
            base.replace(**combo).resolve()
        except ConfigError as e:
            raise ConfigError(f"grid setting {_label(combo)}: {e}") from None


SITE_VALIDATION_NOTE = (
    "Per-site tables: each site's validation rows are its own (private) training rows held out of every "
    "trial, not public data. The scores — of the DP models — and the choice of the best trial are computed "
    "from them without DP, like any run's test figures: the ε above covers the trials' training, not what "
    "the choice reveals about the validation rows."
)
SITE_SPLIT_KEYS = ("site_data", "schema", "test_fraction", "validation_size", "id_column", "time_bins")


def check_site_validation(base: RunConfig, combos: list[dict[str, Any]]) -> None:
    """Per-site tables: carve every site's validation rows (:func:`silofl.data.sites.validation_rows`) once
    for each distinct data setting of the grid, before any trial runs — a site with too few rows refuses
    (one line) with nothing written. Pooled data sets: nothing to check here."""
    import torch

    from silofl.runner.data import prepare_data

    seen: set[str] = set()
    for combo in combos:
        cfg = base.replace(**combo).resolve()
        if not cfg.site_data:
            continue
        key = json.dumps([getattr(cfg, k, None) for k in SITE_SPLIT_KEYS], default=str)
        if key in seen:
            continue
        seen.add(key)
        try:
            prepare_data(cfg, torch.device("cpu"), features=False)
        except DataError as e:
            raise ConfigError(str(e)) from None


def _run_trial(
    cfg: RunConfig, i: int, combo: dict[str, Any], score_field: str, progress: bool, console
) -> tuple[dict, dict]:
    from silofl.runner.loop import run

    t0 = time.perf_counter()
    s = run(cfg, progress=progress, console=console)
    score = s["final"].get(score_field, {}).get("mean")
    row = {
        "trial": i,
        "settings": combo,
        "validation": score,
        "epsilon": s["final"]["epsilon"]["mean"],
        "noise_multiplier": (s["privacy"].get("noise_calibration") or {}).get("noise_multiplier"),
        "seconds": time.perf_counter() - t0,
        "test_set": s["test_set"],
    }
    if console is not None:
        shown = "—" if score is None else f"{score:.4f}"
        console.print(f"trial {i} {_label(combo)}: validation {score_field} {shown}")
    return row, s


# ------------------------------------------------------------------------------------------------ random
# trials
def _trial_seed(run_seed: int, trial: int) -> int:
    """Trial ``trial``'s own seed in a seeded research run (independent trials, as the bound needs)."""
    return int(np.random.SeedSequence([int(run_seed), 0x5053, int(trial)]).generate_state(1)[0])


def _uniforms(seed: int | None) -> Callable[[int], list[float]]:
    """Uniforms in [0, 1) for the tuning's own draws: the secure generator, or the seed's (research runs)."""
    if seed is None:
        from silofl.core.randomness import SecureRandom

        gen = SecureRandom()
        return lambda n: [float(u) for u in gen.uniform(n)]
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x5053]))
    return lambda n: [float(u) for u in rng.random(n)]


def default_cap(count: TrialCount, delta: float, epsilon: float = 0.0) -> int:
    """The cap on K when none is given: the smallest whose cut-off tail τ = P[K > cap] is at most
    ``AUTO_CAP_TAIL`` × δ / (1 + e^{ε+1}), ``epsilon`` being the uncapped bound — so the cap's cost (1 +
    e^ε')τ stays below ``AUTO_CAP_TAIL`` × δ for any ε' ≤ ε + 1, and moves ε next to nothing."""
    target = AUTO_CAP_TAIL * delta / (1 + math.exp(min(epsilon + 1, 700.0)))
    hi = max(1, math.ceil(count.mean))
    while count.tail(hi) > target:
        hi *= 2
        if hi > 2**20:
            raise ConfigError(f"{count.name} needs more than {2**20} trials to cap; give --max-trials")
    lo = max(0, hi // 2)
    while hi - lo > 1:  # the tail falls as the cap grows
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if count.tail(mid) <= target else (mid, hi)
    return max(1, hi)


def planned_trials(
    base: RunConfig, combos: list[dict[str, Any]]
) -> list[tuple[RunConfig, dict[str, tuple[float, float, int]]]]:
    """Per grid setting, (its resolved config with σ calibrated from the budget, per party the (σ, q, steps)
    its budget-first run is planned to spend). Loads the data set, trains nothing."""
    import torch

    from silofl.runner.data import load_dataset, prepare_data, unit_sizes

    loaded: dict[tuple, Any] = {}
    out = []
    for combo in combos:
        cfg = base.replace(**combo).resolve()
        if not cfg.calibrates or not cfg.is_private:
            raise ConfigError(
                "random trials and trials charged to site folders need budget-first DP trials (σ set from "
                f"--target-epsilon) so that every trial's privacy is known in advance; {_label(combo)} is not"
            )
        if cfg.split_seed is None and cfg.seed is None:  # as prepare_data does: a fresh split
            cfg = dataclasses.replace(cfg, split_seed=secrets.randbits(32))
        seed = cfg.split_seed if cfg.split_seed is not None else cfg.seed
        assert seed is not None
        data = None
        if not cfg.site_data:
            key = (cfg.dataset, cfg.data_dir, cfg.image_size, cfg.max_bag_size, seed)
            if key not in loaded:
                loaded[key] = load_dataset(
                    cfg.dataset,
                    cfg.data_dir,
                    image_size=cfg.image_size,
                    max_bag_size=cfg.max_bag_size,
                    seed=seed,
                )
            data = loaded[key]
        cfg, split = prepare_data(cfg, torch.device("cpu"), data)
        parties = {  # persons with --id-column
            str(p["party"]): (float(cfg.noise_multiplier), float(p["sample_rate"]), int(p["steps"]))
            for p in cfg.calibration_plan(unit_sizes(cfg, split))
        }
        out.append((cfg, parties))
    return out


def planned_curves(
    base: RunConfig, combos: list[dict[str, Any]], orders: tuple[float, ...] = DEFAULT_ORDERS
) -> dict[str, np.ndarray]:
    """Per party, the pointwise maximum over every grid setting of the RDP curve its budget-first run is
    planned to spend (:func:`planned_trials`): the RDP curve of one random trial (the mixture over the grid;
    see :mod:`silofl.privacy.tuning`). Loads the data set, trains nothing."""
    curves: dict[str, np.ndarray] = {}
    for _, parties in planned_trials(base, combos):
        for party, h in parties.items():
            curve = rdp_curve((h,), orders)
            curves[party] = np.maximum(curves[party], curve) if party in curves else curve
    return curves


def _draw_random_trials(
    base: RunConfig, combos: list[dict[str, Any]], count: TrialCount, cap: int | None
) -> tuple[list[int], dict]:
    """Check the bound can be given (before anything runs), then draw K and each trial's settings."""
    if cap is not None and cap < 1:
        raise ConfigError(f"--max-trials must be at least 1, got {cap}")
    cfg = base.resolve()
    delta = cfg.delta
    curves = planned_curves(base, combos)
    uncapped = max(
        repeat_and_select_epsilon(DEFAULT_ORDERS, c, count, delta)["epsilon"] for c in curves.values()
    )
    given = cap is not None
    cap = int(cap) if cap is not None else default_cap(count, delta, uncapped)
    for curve in curves.values():  # refuses here, before any trial, if the cap costs too much
        try:
            repeat_and_select_epsilon(DEFAULT_ORDERS, curve, count, delta, cap)
        except ConfigError as e:
            raise ConfigError(
                f"{e}; --max-trials {default_cap(count, delta, uncapped)} would do" if given else str(e)
            ) from None
    uniforms = _uniforms(base.seed)
    k, truncated = count.draw(uniforms(1)[0], cap)
    picks = [min(int(u * len(combos)), len(combos) - 1) for u in uniforms(k)]
    selection = metric_field(
        "proxy_acc" if cfg.info.traits.mutual_learning else cfg.info.headline,
        _run_metric(cfg),
    )
    return picks, {
        "count": count,
        "cap": cap,
        "k": k,
        "truncated": truncated,
        "picks": picks,
        "curves": curves,
        "delta": delta,
        "selection": selection,
        "formal": cfg.guarantee().formal,
        "seeded": base.seed is not None,
        "grid_size": len(combos),
    }


def _random_cost(part: dict, summaries: list[dict]) -> dict:
    """tune.json's ``random_trials``: the draws, and per party the ε of one trial and the Papernot–Steinke ε
    of the best trial, each trial's curve being the planned one raised to what any trial that ran actually
    recorded."""
    count: TrialCount = part["count"]
    delta = part["delta"]
    curves = {p: c.copy() for p, c in part["curves"].items()}
    for s in summaries:
        for a in s.get("accounting", []):
            hist = a.get("history") or a.get("history_hospital")
            if hist:
                party = f"client{a['client']}" if "client" in a else str(a.get("party", "server"))
                actual = rdp_curve(tuple(tuple(h) for h in hist))
                curves[party] = np.maximum(curves[party], actual) if party in curves else actual
    per: dict[str, dict] = {}
    for party, curve in curves.items():
        ps = repeat_and_select_epsilon(DEFAULT_ORDERS, curve, count, delta, part["cap"])
        per[party] = {
            "one_trial": epsilon_from_rdp(DEFAULT_ORDERS, curve, delta)[0],
            "tuned": ps["epsilon"],
            "order": ps["order"],
            "tail": ps["tail"],
            "truncation_delta": ps["truncation_delta"],
        }
    k = part["k"]
    note = (
        "K = 0: no trial ran and nothing was chosen (the output is ⊥: no best.yaml). Running the tuning "
        "again "
        "composes with this run's bound, which already counts the chance of K = 0."
        if k == 0
        else "Papernot–Steinke ε: releasing only the best trial (best.yaml, its model and score), never K "
        "nor the other "
        "trials. tune.json, tune.csv and trials/ hold every trial: for those, the composition of the K "
        "trials run."
    )
    if part["seeded"]:
        note += (
            " A seeded research run: K, the settings and every trial's noise come from the seed, so this "
            "bound, "
            "like each trial's ε, holds only while the seed stays secret."
        )
    elif not part["formal"]:
        note += " These runs' ε is not a formal guarantee (see a trial's summary.json), nor is this bound."
    return {
        **count.to_dict(),
        "max_trials": part["cap"],
        "tail": count.tail(part["cap"]),
        "drawn": k,
        "truncated": part["truncated"],
        "settings_drawn": part["picks"],
        "grid_size": part["grid_size"],
        "selection": part["selection"],
        "seeded": part["seeded"],
        "formal": part["formal"],
        "delta": delta,
        "per_party": per,
        "max": max(v["tuned"] for v in per.values()),
        "one_trial_max": max(v["one_trial"] for v in per.values()),
        "source": SOURCE,
        "method": "RDP of one trial: per party, the maximum over every grid setting of its planned (σ, q, "
        "steps) "
        "and of what trials recorded; then Theorem 2/6, RDP monotonicity, opacus' RDP→(ε, δ) "
        "conversion, and (1 + e^ε)·P[K > cap] of δ for the cap",
        "note": note,
    }


def markdown(result: dict) -> str:
    """The tuning result as a Markdown table."""
    sel = result.get("selection", result["headline"])
    low = " — lowest wins" if result.get("lower_is_better") else ""
    lines = [
        f"# Tuning {result['method']} at ε = {result['target_epsilon']} ({sel} on the validation split{low})",
        "",
        f"Validation split: {result['validation_split']}.",
        "",
        *([result["validation_note"], ""] if result.get("validation_note") else []),
        "| trial | settings | σ | validation | ε (run) |",
        "|---|---|---|---|---|",
    ]
    for r in result["trials"]:
        sigma = f"{r['noise_multiplier']:.3f}" if r["noise_multiplier"] else "—"
        val = f"{r['validation']:.4f}" if r["validation"] is not None else "—"
        eps = f"{r['epsilon']:.3f}" if r["epsilon"] is not None else "—"
        lines.append(f"| {r['trial']} | {_label(r['settings'])} | {sigma} | {val} | {eps} |")
    c = result["tuning_cost"]
    rt = result.get("random_trials")
    lines += [
        "",
        f"Best: {_label(result['best']['settings'])}." if result["best"] else "Best: none (no trial ran).",
        "",
    ]
    if rt is not None:
        lines += [
            f"Random trials: K ~ {rt['distribution']} (E[K] = {rt['mean']:.3g}, at most {rt['max_trials']}; "
            f"P[K > {rt['max_trials']}] ≤ {rt['tail']:.2g}), drawn K = {rt['drawn']}"
            f"{' (capped)' if rt['truncated'] else ''}; settings drawn uniformly from the {rt['grid_size']} "
            f"of "
            "the grid.",
            "",
            f"| party | ε one trial | ε best of K ({rt['theorem']}) | ε all K trials (composition) |",
            "|---|---|---|---|",
        ]
        for party, v in rt["per_party"].items():
            comp = c["per_party"].get(party)
            lines.append(
                f"| {party} | {v['one_trial']:.3f} | {v['tuned']:.3f} | "
                f"{'0 (none ran)' if comp is None else f'{comp:.3f}'} |"
            )
        lines += ["", f"δ = {rt['delta']:g}. {rt['note']} Bound: {rt['source']}.", ""]
    if c["max"] is not None:
        lines.append(
            f"Tuning-inclusive spend (every trial composed, δ = {c['delta']:g}): ε ≤ {c['max']:.3f} per "
            f"party "
            f"over {c['trials']} trials."
        )
    return "\n".join(lines) + "\n"


def _run_metric(cfg) -> str:
    """The headline a run of ``cfg`` is judged by: --metric, or its task's default where accuracy is not
    defined (a survival target: the C-index, silofl.training.tasks)."""
    resolve = getattr(cfg, "_task_metric", None)
    return resolve() if resolve is not None else getattr(cfg, "metric", "accuracy")
