"""Classification metrics as pure functions of one model's class scores on labelled examples.

Every evaluation computes all of them from the one forward pass that accuracy already needs
(:func:`silofl.training.evaluation.scores`); ``--metric`` only picks which one is the headline. Definitions
(the tests compare each with scikit-learn 1.7 as the independent reference, ties and absent classes included):

- ``acc``: top-1 accuracy, the share of examples whose arg-max class is the label.
- ``auroc``: area under the ROC curve, ties counted half (Mann–Whitney U with mid-ranks). Two classes: the
AUROC
  of class 1's score (``roc_auc_score(y, p[:, 1])``). More classes: one-vs-rest, macro-averaged over the
  classes
  **present in the labels** — each class's AUROC of its own score column against all other examples, averaged
  without weights (``roc_auc_score(multi_class="ovr", average="macro")`` when every class is present; with a
  class
  absent from the labels, whose one-vs-rest AUROC is undefined, it is left out of the mean: scikit-learn's
  macro
  average over the present classes' indicator columns). Undefined (NaN) when fewer than two classes are
  present.
- ``balanced_accuracy``: the mean recall over the classes present in the labels (``balanced_accuracy_score``).
- ``f1``: macro F1 over the classes present in the labels or the predictions, a class predicted but never
present
  scoring 0 (``f1_score(average="macro")``, its default ``zero_division``).
- ``ece``: expected calibration error with 15 equal-width bins of the confidence (the largest class
probability):
  bins (0, 1/15], (1/15, 2/15], …, (14/15, 1]; ECE = Σ_b (n_b / n) · |accuracy_b − mean confidence_b| (Guo et
  al.,
  ICML 2017). Lower is better; every other metric: higher is better.

A metric that is undefined (AUROC with one class present; anything on no examples) is NaN here and reported as
``null`` (None) in metrics.jsonl and summary.json. Scores may be probabilities or any per-class transform that
is monotone in them (log-probabilities) for AUROC; ECE needs probabilities.
"""

from __future__ import annotations

import math

import numpy as np
import torch

# --metric NAME -> the key suffix of its figures (private_acc, private_auroc, …)
METRICS = {
    "accuracy": "acc",
    "auroc": "auroc",
    "balanced_accuracy": "balanced_accuracy",
    "f1": "f1",
    "ece": "ece",
    # segmentation (silofl.training.segmentation): per-image Dice and IoU of the foreground, averaged
    "dice": "dice",
    "iou": "iou",
    # a survival target (silofl.training.survival): Harrell's C-index of the model's risk scores
    "c_index": "c_index",
}
LOWER_IS_BETTER = frozenset({"ece"})
ECE_BINS = 15
SUFFIXES = tuple(METRICS.values())
EXTRA_SUFFIXES = tuple(s for s in SUFFIXES if s != "acc")  # the figures added next to each <role>_acc


def metric_field(acc_field: str, metric: str) -> str:
    """The figure of ``metric`` for the model of an accuracy field: ``("private_acc", "auroc")`` →
    ``private_auroc``."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of: {', '.join(METRICS)}")
    return acc_field.removesuffix("_acc") + "_" + METRICS[metric]


def acc_field_of(key: str) -> str | None:
    """The accuracy field of the same model as a metric figure (``private_auroc`` → ``private_acc``); None for
    a key that is no metric figure."""
    for sfx in EXTRA_SUFFIXES:
        if key.endswith("_" + sfx) and len(key) > len(sfx) + 1:
            return key[: -len(sfx) - 1] + "_acc"
    return None


def prefixed(acc_field: str, scores: dict) -> dict:
    """A model's metrics ``{acc: …, auroc: …}`` as its figures ``{private_acc: …, private_auroc: …}``."""
    return {acc_field.removesuffix("_acc") + "_" + k: v for k, v in scores.items()}


def higher_is_better(metric: str) -> bool:
    """Whether a larger value of ``metric`` is better (all but ECE)."""
    return metric not in LOWER_IS_BETTER


def metric_label(metric: str) -> str:
    """How ``metric`` is named in tables: ``accuracy``, ``AUROC``, ``balanced accuracy``, ``F1 (macro)``,
    ``ECE``."""
    return {
        "auroc": "AUROC",
        "balanced_accuracy": "balanced accuracy",
        "f1": "F1 (macro)",
        "ece": "ECE",
        "dice": "Dice",
        "iou": "IoU",
        "c_index": "C-index",
    }.get(metric, metric)


def _np(a) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        return a.detach().to("cpu", torch.float64 if a.is_floating_point() else torch.int64).numpy()
    return np.asarray(a)


def _midranks(s: np.ndarray) -> np.ndarray:
    """1-based ranks of ``s``, tied values sharing the mean of their ranks."""
    order = np.argsort(s, kind="mergesort")
    sv = s[order]
    n = len(sv)
    start = np.flatnonzero(np.r_[True, sv[1:] != sv[:-1]])  # first position of each run of equal values
    end = np.r_[start[1:], n]  # one past its last
    ranks = np.empty(n, dtype=np.float64)
    ranks[order] = np.repeat((start + end + 1) / 2.0, end - start)  # mean of the 1-based ranks start+1 … end
    return ranks


def binary_auroc(score, positive) -> float:
    """AUROC of ``score`` for the boolean labels ``positive`` (ties count half); NaN without both kinds."""
    s, pos = _np(score).astype(np.float64), _np(positive).astype(bool)
    n1 = int(pos.sum())
    n0 = len(pos) - n1
    if n1 == 0 or n0 == 0:
        return math.nan
    r = _midranks(s)
    return float((r[pos].sum() - n1 * (n1 + 1) / 2.0) / (n1 * n0))


def auroc(scores, y) -> float:
    """AUROC (binary) or one-vs-rest macro AUROC over the classes present in ``y`` (see the module doc).
    ``scores``: (n, C) per-class scores; ``y``: (n,) class indices."""
    p, t = _np(scores), _np(y).astype(np.int64)
    if p.ndim != 2 or len(p) != len(t):
        raise ValueError(f"scores must be (n, classes) for n = {len(t)} labels, got shape {p.shape}")
    if p.shape[1] == 2:
        return binary_auroc(p[:, 1], t == 1)
    n, c = p.shape
    n1 = np.bincount(t, minlength=c).astype(np.float64)
    n0 = n - n1
    present = (n1 > 0) & (n0 > 0)
    if present.sum() < 2:
        return math.nan
    ranks = _row_midranks(
        np.ascontiguousarray(p.T, dtype=np.float64)
    )  # (C, n): each class's score column ranked
    r1 = np.bincount(
        t, weights=ranks[t, np.arange(n)], minlength=c
    )  # per class: the rank sum of its positives
    auc = (r1[present] - n1[present] * (n1[present] + 1) / 2.0) / (
        n1[present] * n0[present]
    )  # Mann–Whitney U / n1 n0
    return float(np.mean(auc))


def _row_midranks(s: np.ndarray) -> np.ndarray:
    """:func:`_midranks` of every row of ``s`` at once (one sort; tie runs resolved only where a row has
    ties)."""
    c, n = s.shape
    order = np.argsort(s, axis=1)
    sv = np.take_along_axis(s, order, 1)
    neq = sv[:, 1:] != sv[:, :-1]
    if neq.all():  # no ties: ranks 1 … n in sorted order
        mid = np.broadcast_to(np.arange(1, n + 1, dtype=np.float64), (c, n))
    else:
        idx = np.broadcast_to(np.arange(n), (c, n))
        edge = np.ones((c, 1), dtype=bool)
        start = np.maximum.accumulate(
            np.where(np.hstack([edge, neq]), idx, 0), axis=1
        )  # first index of the tie run
        end = np.minimum.accumulate(np.where(np.hstack([neq, edge]), idx, n)[:, ::-1], axis=1)[
            :, ::-1
        ]  # its last
        mid = (start + end) / 2.0 + 1.0
    ranks = np.empty((c, n), dtype=np.float64)
    np.put_along_axis(ranks, order, mid, 1)
    return ranks


def _confusion(y, pred, classes: int) -> np.ndarray:
    t, q = _np(y).astype(np.int64), _np(pred).astype(np.int64)
    return np.bincount(t * classes + q, minlength=classes * classes).reshape(classes, classes)


def balanced_accuracy(y, pred, classes: int | None = None) -> float:
    """Mean recall over the classes present in ``y``; NaN on no examples."""
    t, q = _np(y).astype(np.int64), _np(pred).astype(np.int64)
    if len(t) == 0:
        return math.nan
    c = classes or int(max(t.max(), q.max())) + 1
    cm = _confusion(t, q, c)
    support = cm.sum(1)
    present = support > 0
    return float(np.mean(np.diag(cm)[present] / support[present]))


def f1_macro(y, pred, classes: int | None = None) -> float:
    """Macro F1 over the classes in ``y`` or ``pred`` (a class predicted but absent from ``y`` scores 0); NaN
    on no examples."""
    t, q = _np(y).astype(np.int64), _np(pred).astype(np.int64)
    if len(t) == 0:
        return math.nan
    c = classes or int(max(t.max(), q.max())) + 1
    cm = _confusion(t, q, c)
    tp = np.diag(cm).astype(np.float64)
    fp, fn = cm.sum(0) - tp, cm.sum(1) - tp
    labels = (cm.sum(0) + cm.sum(1)) > 0
    return float(np.mean(2 * tp[labels] / (2 * tp[labels] + fp[labels] + fn[labels])))


def ece(probs, y, pred=None, bins: int = ECE_BINS) -> float:
    """Expected calibration error with ``bins`` equal-width bins (lo, hi] of the confidence max_c p_c; the
    prediction is ``pred`` (default: the arg-max of ``probs``). NaN on no examples."""
    p, t = _np(probs).astype(np.float64), _np(y).astype(np.int64)
    if len(t) == 0:
        return math.nan
    conf = p.max(1)
    q = p.argmax(1) if pred is None else _np(pred).astype(np.int64)
    edges = np.linspace(0.0, 1.0, bins + 1)
    b = np.clip(
        np.searchsorted(edges[1:-1], conf, side="left"), 0, bins - 1
    )  # conf in (edges[b], edges[b + 1]]
    gap = np.bincount(
        b, weights=(q == t).astype(np.float64) - conf, minlength=bins
    )  # Σ (correct − confidence)
    return float(np.abs(gap).sum() / len(t))


def classification_metrics(
    logits: torch.Tensor, y: torch.Tensor, pred: torch.Tensor | None = None
) -> dict[str, float]:
    """Every metric of one model from its logits (n, C) on labels y (n,): ``{acc, auroc, balanced_accuracy,
    f1, ece}`` (NaN where undefined). ``pred``: the predictions accuracy counts (default: the logits'
    arg-max). Scores for AUROC are the float64 log-probabilities (monotone in the probabilities, without
    float32 saturation ties)."""
    n = len(y)
    if pred is None:
        pred = logits.argmax(-1)
    correct = int((pred == y).sum())
    acc = correct / max(1, n)
    if n == 0:
        return {"acc": acc, "auroc": math.nan, "balanced_accuracy": math.nan, "f1": math.nan, "ece": math.nan}
    logp = logits.detach().to(torch.float64).log_softmax(-1)
    classes = int(logits.shape[-1])
    return {
        "acc": acc,
        "auroc": auroc(logp, y),
        "balanced_accuracy": balanced_accuracy(y, pred, classes),
        "f1": f1_macro(y, pred, classes),
        "ece": ece(logp.exp(), y, pred),
    }


def finite_or_none(v: float) -> float | None:
    """``v``, or None where it is NaN or infinite (what JSON and the reports hold for an undefined metric)."""
    return v if isinstance(v, (int, float)) and math.isfinite(v) else None


def c_index(risk, y) -> float:
    """Harrell's C-index of risk scores ``risk`` (n,) (higher: the event comes sooner) against a survival
    target ``y`` (n, 2): [time, event] per row (:mod:`silofl.training.survival`); NaN without a comparable
    pair. Higher is better."""
    from silofl.training.survival import c_index as harrell

    y = _np(y).reshape(-1, 2)
    return harrell(_np(risk).reshape(-1), y[:, 0], y[:, 1])


# segmentation (silofl.training.segmentation): the metrics a run on masks computes (``acc``: pixel accuracy)
SEGMENTATION_METRICS = ("accuracy", "dice", "iou")


def metric_task(metric: str) -> str:
    """The task whose runs compute ``metric``: ``segmentation`` (Dice, IoU), ``any`` (accuracy),
    ``survival`` (C-index) or ``classification`` (AUROC, balanced accuracy, F1, ECE): the task registry's
    answer (:func:`silofl.training.tasks.metric_task`)."""
    from silofl.training.tasks import metric_task as of_registry

    return of_registry(metric)
