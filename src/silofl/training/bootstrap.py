"""Percentile bootstrap confidence intervals for evaluation figures, over rows or over persons.

An interval here is evaluation, not a privacy mechanism: its resampling is an ordinary generator (a seed only
makes a report repeatable; nothing secret depends on it). :func:`interval` resamples the units of a held-out
set with replacement — its rows, or with ``clusters`` whole persons (every row of a drawn person, as often as
the person is drawn) — recomputes the statistic on each resample and reports the ``(1 - level) / 2`` and
``(1 + level) / 2`` percentiles (Efron's percentile interval; scipy.stats.bootstrap's "percentile" method).
A paired comparison of two models on the same rows is one statistic of both (:func:`paired_difference`): each
resample draws the same rows for both, so the interval is that of the gain, not of two separate figures.

A held-out set with fewer than :data:`MIN_UNITS` units gets no interval: the figure alone, labelled
(``"interval": null`` and a note); so does one where more than a tenth of the resamples leave the statistic
undefined (an AUROC resample with a single class).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

MIN_UNITS = 20  # fewer held-out rows (or persons) than this: no interval, the figure is labelled alone
RESAMPLES = 1000
LEVEL = 0.95
Statistic = Callable[[np.ndarray], float]  # the figure on the rows at these indices (repeats allowed)


def _groups(n: int, clusters) -> list[np.ndarray]:
    """Each unit's row indices: one row each, or every row of one person (``clusters``: a person id per
    row)."""
    if clusters is None:
        return [np.array([i]) for i in range(n)]
    ids = np.asarray(clusters.cpu() if isinstance(clusters, torch.Tensor) else clusters).reshape(-1)
    if len(ids) != n:
        raise ValueError(f"clusters: {len(ids)} ids for {n} rows")
    order = np.argsort(ids, kind="stable")
    cuts = np.flatnonzero(np.diff(ids[order])) + 1
    return np.split(order, cuts)


def interval(
    stat: Statistic,
    n: int,
    clusters=None,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int | None = None,
    min_units: int = MIN_UNITS,
) -> dict:
    """``{estimate, low, high, level, resamples, units, unit}`` of ``stat`` on ``n`` held-out rows: its value
    on every row, and the percentile bootstrap interval over the rows (or the persons of ``clusters``).
    ``low``/``high`` are None, with a ``note``, when there are too few units or the statistic is undefined
    on too many resamples."""
    groups = _groups(n, clusters)
    unit = "rows" if clusters is None else "persons"
    est = _finite(stat(np.arange(n)))
    out = {"estimate": est, "low": None, "high": None, "level": level, "resamples": 0}
    out.update(units=len(groups), unit=unit)
    if len(groups) < min_units:
        out["note"] = f"no interval: {len(groups)} held-out {unit}, fewer than {min_units}"
        return out
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(groups), size=(resamples, len(groups)))
    if clusters is None:
        values = np.array([stat(d) for d in draws], dtype=np.float64)
    else:
        values = np.array([stat(np.concatenate([groups[g] for g in d])) for d in draws], dtype=np.float64)
    ok = values[np.isfinite(values)]
    if len(ok) < 0.9 * resamples:
        out["note"] = (
            f"no interval: the figure is undefined on {resamples - len(ok)} of {resamples} resamples"
        )
        return out
    lo, hi = np.percentile(ok, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    out.update(low=float(lo), high=float(hi), resamples=int(len(ok)))
    return out


def paired_difference(
    stat_a: Statistic, stat_b: Statistic, n: int, clusters=None, seed: int | None = None, **kw
) -> dict:
    """:func:`interval` of ``stat_a − stat_b`` on the same resampled rows (or persons): the gain of model a
    over model b with its paired interval."""
    return interval(lambda idx: stat_a(idx) - stat_b(idx), n, clusters=clusters, seed=seed, **kw)


def _finite(v: float) -> float | None:
    return float(v) if v is not None and math.isfinite(v) else None


def metric_statistic(metric: str, outputs: torch.Tensor, y: torch.Tensor) -> Statistic:
    """The figure of ``metric`` (:data:`silofl.training.metrics.METRICS`) on a subset of one model's held-out
    outputs: logits (n, C) of a classifier, a survival model's outputs, or per-image segmentation counts
    (:func:`silofl.training.segmentation.segmentation_counts`) with masks ``y``. Equal to the run's figure of
    the same model on the same rows (only the asked metric is computed, on arrays prepared once)."""
    from silofl.training import metrics as m
    from silofl.training.evaluation import metrics_of
    from silofl.training.tasks import target_task

    key = m.METRICS[metric]
    if y.dim() == 3:  # masks: the outputs are the per-image counts the segmentation figures reduce
        from silofl.training.segmentation import metrics_from_counts

        pixels = int(y.shape[1] * y.shape[2])
        return lambda idx: _nan(metrics_from_counts(outputs[torch.as_tensor(idx)], pixels).get(key))
    own = target_task(y)
    if own is not None and own.scores is not None:  # a survival target: its task scores it
        return lambda idx: _nan(metrics_of(outputs[torch.as_tensor(idx)], y[torch.as_tensor(idx)]).get(key))
    logp = outputs.detach().to(torch.float64).log_softmax(-1).cpu().numpy()
    t = y.detach().cpu().numpy().astype(np.int64)
    pred = logp.argmax(1)
    c = logp.shape[1]
    figures: dict[str, Statistic] = {
        "acc": lambda i: float((pred[i] == t[i]).mean()) if len(i) else math.nan,
        "auroc": lambda i: m.auroc(logp[i], t[i]),
        "balanced_accuracy": lambda i: m.balanced_accuracy(t[i], pred[i], c),
        "f1": lambda i: m.f1_macro(t[i], pred[i], c),
        "ece": lambda i: m.ece(np.exp(logp[i]), t[i], pred[i]),
    }
    return figures[key]


def _nan(v) -> float:
    return math.nan if v is None else float(v)
