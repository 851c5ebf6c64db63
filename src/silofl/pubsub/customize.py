"""Customization (PubSub-ML, Algorithm 2), run by a subscriber on its own data.

1. Split the local data into train / customize / test parts (default 60/20/20).
2. Train the subscriber's own model on the train part (never published, so not private).
3. Score every subscribed model and the own model on the customize part (accuracy, or −MSE for
   regression) and keep the top m (``top_m=None``: all).
4. Extend each input to the union of feature spaces: a feature a model uses but the subscriber lacks
   is filled with the broker's public default; each model reads only its own features, in its order.
5. m(x) = the selected models' outputs concatenated (class probabilities, or predictions).
6. Train a fully connected fusion network on {(m(x), y)} of the customize part (softmax/cross-entropy,
   or MSE; m(x) standardised per column on that part, small weight decay); the customized model is
   fusion ∘ m.

The subscriber spends no privacy budget: it only post-processes published DP models (each with its
publisher's own (ε, δ)) and its own data, which it keeps.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from silofl.core.errors import ConfigError
from silofl.pubsub.dp_models import Bounds, train
from silofl.pubsub.model import PublishedModel, is_nonprivate, outputs
from silofl.training.fusion import Fusion, fit_fusion

SMALL = 200  # customize parts smaller than this get a linear fusion layer (hidden="auto")


@dataclass
class LocalData:
    """A subscriber's data: rows of ``features`` (named columns), labels (class indices into ``classes``) or
    regression targets."""

    x: np.ndarray
    y: np.ndarray
    features: list[str]
    task: str = "classification"
    classes: list | None = None

    def __post_init__(self):
        self.x = np.asarray(self.x, dtype=np.float64)
        self.y = np.asarray(self.y)
        if self.x.ndim != 2 or self.x.shape[1] != len(self.features):
            raise ConfigError(f"data has shape {self.x.shape} for {len(self.features)} features")
        if len(self.y) != len(self.x):
            raise ConfigError(f"{len(self.x)} rows and {len(self.y)} labels")
        if self.task == "classification" and (not self.classes or len(self.classes) < 2):
            raise ConfigError("classification needs at least two class labels")


@dataclass
class Customized:
    """fusion ∘ m: the selected models (with the feature filling of each) and the fusion network."""

    models: list[PublishedModel]
    names: list[str]
    columns: list[
        list[int | None]
    ]  # per model: index of each of its features in the subscriber's data, or None
    fill: list[np.ndarray]  # per model: public defaults (used where the column is None)
    fusion: nn.Module
    task: str
    y_mean: float = 0.0
    y_std: float = 1.0
    report: dict = field(default_factory=dict)

    def features_of(self, x: np.ndarray) -> torch.Tensor:
        """The fusion network's input for raw rows: the selected models' outputs, concatenated."""
        return torch.cat(
            [
                _fusion_input(self.task, model_outputs(m, x, c, f))
                for m, c, f in zip(self.models, self.columns, self.fill, strict=True)
            ],
            1,
        ).float()

    @torch.no_grad()
    def predict(self, x: np.ndarray) -> np.ndarray:
        """Class indices (or regression predictions) of the customized model for raw rows."""
        z = self.fusion(self.features_of(x))
        if self.task == "classification":
            return z.argmax(1).numpy()
        return (z.squeeze(1) * self.y_std + self.y_mean).numpy()


def _fusion_input(task: str, out: torch.Tensor) -> torch.Tensor:
    """What the fusion network sees of one model: log-probabilities (classifiers) or predictions."""
    return torch.log(out.clamp_min(1e-6)) if task == "classification" else out


def model_outputs(
    m: PublishedModel, x: np.ndarray, columns: list[int | None], fill: np.ndarray
) -> torch.Tensor:
    """The model's outputs on the subscriber's rows, its missing features filled with public defaults."""
    xm = np.repeat(fill[None, :], len(x), 0)
    have = [i for i, c in enumerate(columns) if c is not None]
    if have:
        xm[:, have] = x[:, [columns[i] for i in have]]
    return outputs(m, xm)


def align(
    m: PublishedModel, features: list[str], defaults: dict[str, float]
) -> tuple[list[int | None], np.ndarray]:
    """Where each of the model's features is in the subscriber's data, and the public defaults for the
    rest."""
    index = {f: i for i, f in enumerate(features)}
    cols = [index.get(f) for f in m.features]
    missing = [f for f, c in zip(m.features, cols, strict=True) if c is None and f not in defaults]
    if missing:
        raise ConfigError(
            f"{m.publisher}'s model uses features {missing[:5]} that the subscriber lacks and the broker "
            "has no public default for"
        )
    fill = np.array(
        [float(defaults.get(f, 0.0)) if c is None else 0.0 for f, c in zip(m.features, cols, strict=True)]
    )
    return cols, fill


def split(n: int, fractions=(0.6, 0.2, 0.2), seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A seeded (train, customize, test) split of n row indices."""
    if len(fractions) != 3 or abs(sum(fractions) - 1) > 1e-9 or min(fractions) <= 0:
        raise ConfigError(f"split fractions must be three positive numbers summing to 1, got {fractions}")
    perm = np.random.default_rng(seed).permutation(n)
    a, b = int(round(fractions[0] * n)), int(round((fractions[0] + fractions[1]) * n))
    if a == 0 or b == a or b == n:
        raise ConfigError(f"{n} rows are too few to split {fractions}")
    return perm[:a], perm[a:b], perm[b:]


def score(task: str, out: torch.Tensor, y: np.ndarray) -> float:
    """Accuracy (classification) or −MSE (regression) of model outputs."""
    if task == "classification":
        return float((out.argmax(1).numpy() == y).mean())
    return -float(((out[:, 0].numpy() - y) ** 2).mean())


def check_compatible(models: list[PublishedModel], data: LocalData) -> None:
    """Raise ConfigError unless every model has the subscriber's task and class labels."""
    for m in models:
        if m.task != data.task:
            raise ConfigError(f"{m.publisher}'s model is for {m.task}, the subscriber's task is {data.task}")
        if data.task == "classification" and [str(c) for c in m.classes] != [str(c) for c in data.classes]:
            raise ConfigError(
                f"{m.publisher}'s model has class labels {m.classes}, the subscriber's are "
                f"{data.classes}: mismatched class labels"
            )


def customize(
    models: list[PublishedModel],
    data: LocalData,
    defaults: dict[str, float],
    *,
    top_m: int | None = None,
    fractions=(0.6, 0.2, 0.2),
    own: str | None = "auto",
    seed: int = 0,
    hidden: int | str = "auto",
    epochs: int = 100,
    weight_decay: float = 1e-2,
    start: str = "best",
    idx=None,
) -> Customized:
    """Algorithm 2. ``own``: the subscriber's own model type (``auto``: logistic / linear regression; None:
    no own model); ``idx``: given (train, customize, test) row indices instead of a random split."""
    t0 = time.perf_counter()
    check_compatible(models, data)
    if top_m is not None and top_m < 1:
        raise ConfigError(f"top_m must be ≥ 1 or 'all', got {top_m}")
    tr, cu, te = idx if idx is not None else split(len(data.x), fractions, seed)
    names = [f"{m.publisher}" + (f"#{m.chunk}" if m.chunk is not None else "") for m in models]
    cands = list(models)
    own_note = None
    if own == "auto" and data.task == "classification" and len(np.unique(data.y[tr])) < 2:
        own, own_note = None, "no own model: the subscriber's training rows hold a single class"
    if own is not None:
        cands.append(_own_model(data, tr, own, seed))
        names.append("own")
    if not cands:
        raise ConfigError("nothing to customize: no subscribed models and no own model")
    aligned = [align(m, data.features, defaults) for m in cands]
    t_own = time.perf_counter() - t0

    # select: score each candidate on the customize part
    t1 = time.perf_counter()
    outs = [model_outputs(m, data.x[cu], c, f) for m, (c, f) in zip(cands, aligned, strict=True)]
    usable = [bool(torch.isfinite(o).all()) for o in outs]  # a model whose outputs overflow here is left out
    scores = [
        score(data.task, o, data.y[cu]) if ok else -math.inf for o, ok in zip(outs, usable, strict=True)
    ]
    order = sorted((i for i in range(len(cands)) if usable[i]), key=lambda i: (-scores[i], i))
    if not order:
        raise ConfigError("no subscribed model gives finite outputs on the subscriber's rows")
    keep = order if top_m is None else order[:top_m]
    t_select = time.perf_counter() - t1

    # fuse: train the fusion network on the selected models' outputs
    t2 = time.perf_counter()
    fusion, y_mean, y_std = _fuse(data, outs, keep, cu, seed, hidden, start, weight_decay, epochs)
    t_fuse = time.perf_counter() - t2
    result = Customized(
        [cands[i] for i in keep],
        [names[i] for i in keep],
        [aligned[i][0] for i in keep],
        [aligned[i][1] for i in keep],
        fusion,
        data.task,
        y_mean,
        y_std,
    )
    test_pred = result.predict(data.x[te])
    metric = "accuracy" if data.task == "classification" else "mse"
    test = (
        float((test_pred == data.y[te]).mean())
        if data.task == "classification"
        else float(((test_pred - data.y[te]) ** 2).mean())
    )
    own_test = None
    if own is not None:
        own_out = model_outputs(cands[-1], data.x[te], *aligned[-1])
        own_test = score(data.task, own_out, data.y[te])
        own_test = own_test if data.task == "classification" else -own_test
    result.report = {
        "metric": metric,
        "test": test,
        "own_test": own_test,
        "own_note": own_note,
        "selected": result.names,
        "scores": dict(zip(names, scores, strict=True)),
        "candidates": len(cands),
        "skipped_nonfinite": [names[i] for i in range(len(cands)) if not usable[i]],
        "rows": {"train": len(tr), "customize": len(cu), "test": len(te)},
        "seconds": {"own": t_own, "select": t_select, "fuse": t_fuse},
        "publisher_budgets": {
            names[i]: {
                "epsilon": cands[i].epsilon,
                "delta": cands[i].delta,
                "private": not is_nonprivate(cands[i]),
            }
            for i in keep
            if names[i] != "own"
        },
        "privacy": "the subscriber spends no privacy budget: customization post-processes published DP "
        "models (each under its publisher's own (ε, δ)) and the subscriber's own data, which never leaves it",
    }
    return result


def _own_model(data: LocalData, tr, own: str, seed: int) -> PublishedModel:
    """The subscriber's own (non-private) model on its training rows (``auto``: logistic or linear
    regression)."""
    kind = ("dp-logreg" if data.task == "classification" else "dp-linreg") if own == "auto" else own
    xb = data.x[tr]
    return train(
        kind,
        xb,
        data.y[tr],
        publisher="own",
        features=data.features,
        task=data.task,
        bounds=Bounds(xb.min(0), xb.max(0)),
        epsilon=1.0,
        delta=1e-5,
        classes=data.classes,
        seed=seed,
        nonprivate=True,
    )


def _fuse(data: LocalData, outs: list, keep: list, cu, seed: int, hidden, start: str, weight_decay, epochs):
    """The fusion network trained on the selected (``keep``) models' outputs on the customize rows ``cu``;
    (fusion, y_mean, y_std)."""
    feats = torch.cat([_fusion_input(data.task, outs[i]) for i in keep], 1).float()
    torch.manual_seed(seed)
    n_out = len(data.classes) if data.task == "classification" else 1
    if hidden == "auto":  # no hidden layer when the customize part is small (it over-fits less)
        hidden = 0 if len(cu) < SMALL else 64
    y_mean, y_std = 0.0, 1.0
    if data.task == "classification":
        target = torch.as_tensor(data.y[cu], dtype=torch.long)
    else:
        y_mean, y_std = float(data.y[cu].mean()), float(data.y[cu].std() or 1.0)
        target = torch.as_tensor((data.y[cu] - y_mean) / y_std, dtype=torch.float32)
    fusion = Fusion(feats.shape[1], n_out, len(keep), hidden, data.task, y_mean, y_std, start=start)
    # full batch L-BFGS: the objective is smooth and small; Adam's sign-like first steps swung the logits
    # of log-probability inputs by whole units and lost the ensemble it started from
    fit_fusion(fusion, feats, target, data.task, weight_decay, epochs)
    return fusion, y_mean, y_std
