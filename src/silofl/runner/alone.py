""" "How does this compare with training alone?": the same sites, split and rounds trained by each site on its
own data without DP (Regular, privacy off) — the line a collaboration under a budget has to beat.

Per-site tables (``--dataset table --site-data …``) get a tuned going-alone reference, chosen on each site's
own validation rows (carved from its training rows as ``silofl tune`` carves them; its test rows are never
read while choosing):

- silofl's Regular without DP at each learning rate of a fixed grid, ``trials`` of them, half a decade apart
  around the run's own (:func:`lr_grid`: ×0.1, ×0.32, ×1, ×3.2 for the default :data:`DEFAULT_TRIALS` = 4);
- a scikit-learn logistic regression (classification targets) at as many inverse regularisations C
  (:func:`c_grid`: 0.01, 0.1, 1, 10), fitted on the same training rows.

Each site keeps, per kind, the setting with the best validation figure, and of the two kinds the stronger on
validation (ties: Regular); that model, retrained on all of the site's training rows, is its going-alone
reference in the decision report (``decision.json`` names it). ``trials`` is the federated run's tuning
budget (:func:`budget`): the number of trials ``silofl tune`` ran to choose the run's settings, which its
``recipe.yaml`` records as ``tuning_trials`` (a run from it carries it; ``compare_with_alone(…, trials=K)``
gives it directly), at least :data:`MIN_TRIALS`, the grids widening half a decade (lr) or a decade (C) per
trial; a run that records no tuning uses :data:`DEFAULT_TRIALS`, and says so. Survival targets get the
Regular grid only (no Cox reference: lifelines is not a dependency of silofl). Other data (benchmarks, image
folders) keep one Regular run at the run's own learning rate: their validation rows are not the sites' own.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from silofl.runner.config import RunConfig
from silofl.training.metrics import METRICS, higher_is_better, metric_field, metric_label

# what going alone does not take from the run: its method, privacy mechanism, combination, output and
# reporting. Everything else — the data set and its sources, schema, split, sizes, features, evaluation — is
# copied, so the reference trains on the same rows, with the same inputs, and is scored on the same test set
NOT_COPIED = (
    "method",
    "privacy",
    "noise_multiplier",
    "clip",
    "delta",
    "accountant",
    "target_epsilon",
    "target_epsilons",
    "calibrate_noise",
    "out",
    "eval_every",
    "checkpoint_every",
    "report_nonprivate",
    "split_seed",
    "combine",
    "combine_holdout",
    "combine_epochs",
    "combine_l2",
    "combine_balance",
    "track",
    "tuning_trials",
    "secure_aggregation",  # a mechanism of the run's releases; going alone releases nothing
)


def alone_config(cfg: RunConfig, split_seed: int | None) -> RunConfig:
    """Regular without DP on ``cfg``'s split: every data and feature setting of ``cfg`` (same data, sources,
    clients, examples, rounds, features, test set), the run's private architecture (else its shared one)."""
    flat = {k: getattr(cfg, k) for k in RunConfig.common_fields() if k not in NOT_COPIED}
    regular = RunConfig.from_dict({"method": "regular"}).options
    opts = {
        k: getattr(cfg.options, k) for k in regular.field_names() if hasattr(cfg.options, k)
    }  # same training
    if "private_model" not in opts and getattr(
        cfg.options, "proxy_model", None
    ):  # no private model: the shared one
        opts["private_model"] = cfg.options.proxy_model
    if (
        opts.get("private_lr") is not None
    ):  # the run trains its non-DP models with Adam at private_lr: so does alone
        opts.update(optimizer="adam", momentum=0.0, nesterov=False, lr=opts["private_lr"], augmult=0)
    return RunConfig.from_dict(
        {
            **flat,
            **opts,
            "method": "regular",
            "privacy": "off",
            "split_seed": split_seed,
            "eval_every": cfg.rounds,
            "out": str(Path(cfg.out) / "alone"),
        },
        strict=False,
    )


DEFAULT_TRIALS = 4  # going alone's trials per kind when the run's own tuning budget is not known
MIN_TRIALS = 2  # the fewest settings a choice is made among
REGULAR = "silofl Regular, no DP"
SKLEARN = "scikit-learn logistic regression"
RECORD = "alone.json"  # OUT/alone/alone.json: the tuning of going alone, per site


def lr_grid(lr: float, trials: int) -> list[float]:
    """``trials`` learning rates half a decade apart around ``lr`` (``lr`` itself among them)."""
    return [float(lr) * 10.0 ** ((i - trials // 2) / 2) for i in range(trials)]


def c_grid(trials: int) -> list[float]:
    """``trials`` inverse regularisations of the logistic regression, a decade apart around 1."""
    return [10.0 ** (i - trials // 2) for i in range(trials)]


def budget(cfg: RunConfig, trials: int | None = None) -> dict[str, Any]:
    """Going alone's trials per kind: ``trials`` where given, else the run's own tuning's count
    (``cfg.tuning_trials``), at least :data:`MIN_TRIALS`; else :data:`DEFAULT_TRIALS`. ``{trials, source
    ("tuning" | "default"), tuning_trials, text}``, ``text`` the decision report's words for it."""
    tuned = trials if trials is not None else cfg.tuning_trials
    if tuned is None:
        text = f"default budget of {DEFAULT_TRIALS}: the run records no tuning"
        return {"trials": DEFAULT_TRIALS, "source": "default", "tuning_trials": None, "text": text}
    n = max(MIN_TRIALS, int(tuned))
    text = f"going alone tuned with {n} trials, as the federated run's tuning"
    if n != tuned:
        text += f" (its {tuned} raised to {MIN_TRIALS}, the fewest a choice is made among)"
    return {"trials": n, "source": "tuning", "tuning_trials": int(tuned), "text": text}


def tunes_alone(cfg: RunConfig) -> bool:
    """Whether going alone is tuned on the sites' own validation rows: per-site tables."""
    return cfg.dataset == "table" and bool(cfg.site_data)


def figure(metric: str, outputs: torch.Tensor, y: torch.Tensor) -> float:
    """The metric of ``outputs`` on every row of ``y`` (NaN where undefined)."""
    from silofl.training.bootstrap import metric_statistic

    v = metric_statistic(metric, outputs, y)(np.arange(len(y)))
    return float(v) if v is not None and math.isfinite(v) else math.nan


def best_index(metric: str, values: list[float]) -> int | None:
    """The index of the best finite figure (the first among equals), None when none is finite."""
    from silofl.training.metrics import higher_is_better

    sign = 1.0 if higher_is_better(metric) else -1.0
    ok = [(sign * v, -i) for i, v in enumerate(values) if math.isfinite(v)]
    return -max(ok)[1] if ok else None


def is_classification(y: torch.Tensor) -> bool:
    """Class labels, one per row (not a survival target, not masks)."""
    return y.dim() == 1 and not torch.is_floating_point(y)


def fit_logistic(x: torch.Tensor, y: torch.Tensor, c: float):
    """A scikit-learn logistic regression at inverse regularisation ``c`` on these rows; None when they hold
    one class."""
    from sklearn.linear_model import LogisticRegression

    ys = y.cpu().numpy()
    if len(np.unique(ys)) < 2:
        return None
    return LogisticRegression(C=c, max_iter=1000).fit(x.flatten(1).cpu().numpy(), ys)


def logistic_outputs(clf, x: torch.Tensor, classes: int) -> torch.Tensor:
    """A fitted logistic regression's log-probabilities over every class (absent classes: −1e9)."""
    lp = np.full((len(x), classes), -1e9)
    lp[:, clf.classes_] = clf.predict_log_proba(x.flatten(1).cpu().numpy())
    return torch.from_numpy(lp)


def logistic_search(train, val, metric: str, cs: list[float], classes: int) -> dict | None:
    """C chosen on the validation rows ``val`` of fits on ``train``: ``{C, validation, by_C}``; None when the
    training rows hold one class."""
    by = []
    for c in cs:
        clf = fit_logistic(train[0], train[1], c)
        if clf is None:
            return None
        by.append(figure(metric, logistic_outputs(clf, val[0], classes), val[1]))
    i = best_index(metric, by)
    if i is None:
        return None
    return {"C": cs[i], "validation": by[i], "by_C": by}


def _private(models: Path, k: int) -> torch.nn.Module:
    from silofl.models import load_model

    return load_model(models / f"client{k}_private")[0]


def tune_alone(base: RunConfig, trials: int = DEFAULT_TRIALS, spent: dict | None = None) -> dict:
    """Going alone tuned per site on its own validation rows (see the module doc), ``trials`` settings per
    kind (``spent``: :func:`budget`'s account of them, recorded; default: :data:`DEFAULT_TRIALS`'s): runs the
    Regular grid on
    the validation split into ``OUT/alone/tuning``, each chosen learning rate again on all training rows into
    ``OUT/alone/final``, gathers each site's chosen Regular model into ``OUT/alone/models`` and writes the
    record (``OUT/alone/alone.json``), which it returns."""
    from silofl.runner.data import prepare_split
    from silofl.runner.decision import outputs_of
    from silofl.runner.loop import run

    started = time.perf_counter()
    root = Path(base.out)
    metric = base.resolve().metric
    val_cfg = base.replace(eval_split="validation")
    val = prepare_split(val_cfg, torch.device("cpu"))
    assert val.internal is not None  # per-site tables: each site's own validation rows
    n, classes = len(val.parts), int(val.dataset.num_classes)
    lrs, cs = lr_grid(base.options.lr, trials), c_grid(trials)
    by_lr = [[math.nan] * len(lrs) for _ in range(n)]
    for i, lr in enumerate(lrs):
        folder = root / "tuning" / f"lr{i}"
        run(val_cfg.replace(lr=lr, out=str(folder)), progress=False, overwrite=True)
        for k in range(n):
            xv, yv = val.internal[k]
            by_lr[k][i] = figure(metric, outputs_of(_private(folder / "models", k), xv, yv), yv)
    sites: list[dict[str, Any]] = []
    for k in range(n):
        found = best_index(metric, by_lr[k])
        undefined = found is None  # too few validation rows for a figure: the run's own learning rate
        best = trials // 2 if found is None else found
        regular: dict[str, Any] = {
            "lr": lrs[best],
            "validation": None if undefined else by_lr[k][best],
            "by_lr": by_lr[k],
        }
        if undefined:
            regular["note"] = "the validation figure is undefined at every learning rate: the run's own kept"
        sk = (
            logistic_search(val.parts[k], val.internal[k], metric, cs, classes)
            if is_classification(val.parts[k][1])
            else None
        )
        pair = [regular["validation"], sk["validation"] if sk is not None else None]
        pick = best_index(metric, [math.nan if v is None else v for v in pair])  # ties: Regular
        chosen = SKLEARN if pick == 1 else REGULAR
        name = val.sites[k] if val.sites else f"client{k}"
        sites.append(
            {
                "site": str(name),
                "validation_rows": len(val.internal[k][1]),
                "regular": regular,
                "sklearn": sk,
                "chosen": chosen,
            }
        )
    models = root / "models"
    models.mkdir(parents=True, exist_ok=True)
    for i in sorted({lrs.index(s["regular"]["lr"]) for s in sites if s["regular"]["lr"] is not None}):
        folder = root / "final" / f"lr{i}"
        run(base.replace(lr=lrs[i], out=str(folder)), progress=False, overwrite=True)
        for k, s in enumerate(sites):
            if s["regular"]["lr"] == lrs[i]:
                for f in (folder / "models").glob(f"client{k}_*"):
                    shutil.copy2(f, models / f.name)
    record = {
        "metric": metric,
        "trials": trials,
        "trials_source": (spent or {}).get("source", "default"),
        "tuning_trials": (spent or {}).get("tuning_trials"),
        "budget": (spent or {}).get("text") or f"{trials} trials per kind",
        "grid": {"lr": lrs, "C": cs},
        "validation_split": val.test_set,
        "sites": sites,
        "seconds": time.perf_counter() - started,
        "note": "each site's going-alone reference: the stronger on its own validation rows of silofl's "
        f"Regular without DP over {trials} learning rates and a scikit-learn logistic regression over "
        f"{trials} values of C (classification), each retrained on all of the site's training rows; the "
        "test rows are not read while choosing",
    }
    (root / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    return record


def read_record(alone: Path | None) -> dict | None:
    """``OUT/alone/alone.json``, or None (going alone untuned, or not run)."""
    if alone is None or not (alone / RECORD).is_file():
        return None
    return json.loads((alone / RECORD).read_text())


def reference_outputs(
    record_site: dict | None, alone: Path | None, k: int, train, held: dict[str, tuple], classes: int
) -> dict[str, dict[str, torch.Tensor]]:
    """Site ``k``'s going-alone reference: name → held-out set → its outputs. With a tuning record: the chosen
    one alone (the logistic regression refitted at its C on ``train``, the site's training rows); without one,
    the Regular model in ``alone/models`` where there is one."""
    from silofl.runner.decision import scored

    if record_site is not None and record_site["chosen"] == SKLEARN:
        clf = fit_logistic(train[0], train[1], record_site["sklearn"]["C"])
        if clf is None:
            return {}
        return {SKLEARN: {s: logistic_outputs(clf, x, classes) for s, (x, _, _, _) in held.items()}}
    if alone is not None and (alone / "models" / f"client{k}_private.json").is_file():
        return {REGULAR: scored(alone / "models", k, held, ["private"])["private"]}
    return {}


def compare_with_alone(cfg: RunConfig, summary: dict, console=None, trials: int | None = None) -> dict:
    """Run the go-it-alone baseline into ``OUT/alone`` (tuned per site for tables, :func:`tune_alone`, with
    :func:`budget`'s settings per kind: ``trials``, else the run's own tuning's count ``cfg.tuning_trials``,
    else :data:`DEFAULT_TRIALS`) and add the comparison to ``OUT/summary.json``."""
    from silofl.runner.loop import run

    metric = getattr(cfg, "metric", "accuracy")
    suffix = "_" + METRICS[metric]  # the figures compared: --metric's (accuracy by default)
    seed = summary.get("data_split_seed")
    base_cfg = alone_config(cfg, seed)
    record = None
    if tunes_alone(cfg):
        spent = budget(cfg, trials)
        record = tune_alone(base_cfg, spent["trials"], spent)
        base, alone_means = _tuned_mean(cfg, summary, record), {}
        note = (
            "training alone: per site the stronger on its own validation rows of Regular without DP (lr "
            "tuned) and a scikit-learn logistic regression (C tuned), on the same split; mean over sites on "
            "each site's external rows"
        )
    else:
        alone = run(base_cfg, progress=False)
        base = alone["final"][metric_field("private_acc", metric)]["mean"]
        alone_means = {
            k: v["mean"]
            for k, v in alone["final"].items()
            if k.startswith("private_") and isinstance(v, dict) and not k.endswith("_internal")
        }
        note = "training alone: Regular without DP on the same split, examples, rounds, features and "
        note += "architecture"
    fin = summary["final"]
    mine = {
        k: fin[k]["mean"]
        for k in fin
        if k.endswith(suffix) and isinstance(fin[k], dict) and fin[k].get("mean") is not None
    }
    eps = fin["epsilon"]["mean"]
    result = {
        f"alone_{metric_field('private_acc', metric)}": base,
        "alone_run": str(Path(cfg.out) / "alone"),
        "this_run": mine,
        "difference": {k: v - base for k, v in mine.items()} if base is not None else {},
        "epsilon": eps,
        "metric": metric,
        "alone": alone_means,
        "note": note,
    }
    if record is not None:
        result["tuned"] = {
            "trials": record["trials"],
            "trials_source": record["trials_source"],
            "budget": record["budget"],
            "chosen": {s["site"]: s["chosen"] for s in record["sites"]},
            "seconds": record["seconds"],
        }
    path = Path(cfg.out) / "summary.json"
    data = json.loads(path.read_text())
    data["vs_alone"] = result
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    _decide(cfg, data, console)
    if console is not None and base is not None:
        parts = ", ".join(f"{k.removesuffix(suffix)} {v:.3f} ({v - base:+.3f})" for k, v in mine.items())
        from silofl.runner.decision import threat_of

        threat = threat_of(cfg, data, 0).get("threat")
        eps_txt = (f" at ε = {eps:.2f}" + (f" {threat}" if threat else "")) if eps is not None else ""
        what = (
            ""
            if metric == "accuracy"
            else f", {metric_label(metric)}{'' if higher_is_better(metric) else ', lower is better'}"
        )
        how = (
            f"tuned per site on its own validation rows, {record['budget']}"
            if record is not None
            else "same split and rounds"
        )
        console.print(f"[bold]vs training alone[/] (no DP, {how}{what}: {base:.3f}): {parts}{eps_txt}")
    return result


def _split_of(cfg: RunConfig, summary: dict):
    from silofl.runner.data import prepare_split

    seed = summary.get("data_split_seed")
    return prepare_split(dataclasses.replace(cfg, split_seed=seed), torch.device("cpu"))


def _tuned_mean(cfg: RunConfig, summary: dict, record: dict) -> float | None:
    """The mean over sites of each site's chosen going-alone reference's figure on its external rows."""
    from silofl.runner.decision import held_out_sets

    split = _split_of(cfg, summary)
    held = held_out_sets(cfg, split, summary.get("data_split_seed"))
    alone, classes, figs = Path(cfg.out) / "alone", int(split.dataset.num_classes), []
    for k, site in enumerate(record["sites"]):
        ext = {"external": held[k]["external"]}
        refs = reference_outputs(site, alone, k, split.parts[k], ext, classes)
        for outs in refs.values():
            figs.append(figure(record["metric"], outs["external"], ext["external"][1]))
    ok = [f for f in figs if math.isfinite(f)]
    return float(np.mean(ok)) if ok else None


def _decide(cfg: RunConfig, summary: dict, console=None) -> None:
    """The run's decision report (silofl.runner.decision) again, now with going alone on the same rows: the
    split is drawn again from the recorded seed (the same rows the run and the alone run trained on)."""
    from silofl.runner.decision import report

    report(cfg, _split_of(cfg, summary), summary, Path(cfg.out), console, alone=Path(cfg.out) / "alone")
