"""The DP model types a publisher may choose, each trained to meet its (ε, δ) exactly.

Inputs are clipped to the *public* feature bounds a site declares when it joins (never computed
from its private data at publish time) and scaled to [0, 1]; the bounds travel with the model
(tensors ``input_lo``/``input_hi``) so that a subscriber feeds raw feature values.

| kind (``--model``) | mechanism | guarantee |
|---|---|---|
| ``dp-nn`` | DP-SGD (silofl's per-example clipping, Gaussian noise, Poisson sampling); σ from Opacus'
``get_noise_multiplier`` for the target (ε, δ), ε then reported by the RDP accountant that recorded the steps
| (ε, δ) |
| ``dp-logreg`` | diffprivlib ``LogisticRegression`` (objective perturbation, Chaudhuri et al.) on rows of
norm ≤ √F | ε (δ = 0) |
| ``dp-nb`` | diffprivlib ``GaussianNB`` (Laplace / bounded noise on counts, means and variances) | ε (δ = 0)
|
| ``dp-forest`` | diffprivlib ``RandomForestClassifier`` (random trees, noisy leaf counts) | ε (δ = 0) |
| ``dp-linreg`` | diffprivlib ``LinearRegression`` (functional mechanism), regression | ε (δ = 0) |

``nonprivate=True`` trains the same model type without DP (PubSub-ML*, a baseline): ε = ∞ and the
mechanism says so. No DP gradient-boosted trees: the one DP GBDT package on the package index here,
``dp-xgboost`` 0.2.10 (Sarus), was last released in January 2024 and comes only as a source archive (no
wheel: installing it means building XGBoost's C++ core), so it does not install cleanly.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F

from silofl.core.errors import ConfigError
from silofl.core.extras import require
from silofl.pubsub.model import PublishedModel, scale_inputs

KINDS = ("dp-nn", "dp-logreg", "dp-nb", "dp-forest", "dp-linreg")
CLASSIFIERS = ("dp-nn", "dp-logreg", "dp-nb", "dp-forest")
REGRESSORS = ("dp-nn", "dp-linreg")


@dataclass
class Bounds:
    """Public per-feature bounds [lo, hi] (in the model's feature order)."""

    lo: np.ndarray
    hi: np.ndarray

    def scale(self, x: np.ndarray) -> np.ndarray:
        """Rows clipped to the bounds and scaled to [0, 1]."""
        t = partial(torch.as_tensor, dtype=torch.float64)
        return scale_inputs(t(x), t(self.lo), t(self.hi)).numpy()


def train(
    kind: str,
    x: np.ndarray,
    y: np.ndarray,
    *,
    publisher: str,
    features: list[str],
    task: str,
    bounds: Bounds,
    epsilon: float,
    delta: float,
    classes: list | None = None,
    seed: int | None = None,
    nonprivate: bool = False,
    chunk: int | None = None,
    y_bounds: tuple[float, float] | None = None,
    epochs: int = 20,
    hidden: int = 64,
    batch_size: int = 64,
    clip: float = 1.0,
    lr: float = 0.05,
    trees: int = 10,
    depth: int = 5,
    dp_hook=None,
) -> PublishedModel:
    """Train one model of ``kind`` on (x, y) under (ε, δ) and return it in the published format. Without a
    ``seed`` (the default) the mechanism's randomness is cryptographically secure (silofl's noise and
    sampling; diffprivlib's ``secrets.SystemRandom``); a seed makes a reproducible research model whose
    guarantee holds only while the seed stays secret. ``dp_hook`` (research, :mod:`silofl.auditing.gradient`;
    dp-nn only) is called as ``dp_hook(dp, model, opt, n)`` before training (``dp`` None without DP)."""
    _check(kind, x, y, features, task, bounds, epsilon, delta, classes, nonprivate)
    xs = bounds.scale(np.asarray(x, dtype=np.float64))
    if kind == "dp-nn":
        tensors, mech, eps = _dp_nn(
            xs,
            y,
            task,
            classes,
            epsilon,
            delta,
            seed,
            nonprivate,
            epochs,
            hidden,
            batch_size,
            clip,
            lr,
            dp_hook,
        )
    elif kind in ("dp-logreg", "dp-nb", "dp-forest", "dp-linreg"):
        tensors, mech = _diffprivlib(
            kind, xs, y, task, classes, epsilon, seed, nonprivate, y_bounds, trees, depth
        )
        eps = math.inf if nonprivate else float(epsilon)
    tensors["input_lo"] = torch.as_tensor(bounds.lo, dtype=torch.float64)
    tensors["input_hi"] = torch.as_tensor(bounds.hi, dtype=torch.float64)
    published_kind = {
        "dp-nn": "mlp",
        "dp-logreg": "linear",
        "dp-linreg": "linear",
        "dp-nb": "gnb",
        "dp-forest": "forest",
    }[kind]
    return PublishedModel(
        publisher=publisher,
        kind=published_kind,
        features=list(features),
        task=task,
        tensors=tensors,
        epsilon=eps,
        delta=0.0 if nonprivate else float(delta),
        mechanism=mech,
        classes=list(classes) if task == "classification" else None,
        chunk=chunk,
    )


def _check(kind, x, y, features, task, bounds, epsilon, delta, classes, nonprivate) -> None:
    if kind not in KINDS:
        raise ConfigError(f"unknown model type {kind!r}; choose one of: {', '.join(KINDS)}")
    if task == "classification" and kind not in CLASSIFIERS:
        raise ConfigError(
            f"{kind} is a regression model; for classification use one of: {', '.join(CLASSIFIERS)}"
        )
    if task == "regression" and kind not in REGRESSORS:
        raise ConfigError(f"{kind} is a classifier; for regression use one of: {', '.join(REGRESSORS)}")
    if x.ndim != 2 or x.shape[1] != len(features):
        raise ConfigError(f"data has shape {x.shape} but {len(features)} features are declared")
    if len(y) != len(x) or len(x) == 0:
        raise ConfigError(f"{len(x)} rows of features and {len(y)} labels")
    if (
        bounds.lo.shape != (len(features),)
        or bounds.hi.shape != (len(features),)
        or np.any(bounds.hi < bounds.lo)
    ):
        raise ConfigError("public bounds must give lo ≤ hi for every feature")
    if task == "classification":
        if not classes or len(classes) < 2:
            raise ConfigError("classification needs at least two class labels")
        unknown = set(np.unique(y).tolist()) - set(range(len(classes)))
        if unknown:
            raise ConfigError(f"labels must be class indices 0…{len(classes) - 1}; got {sorted(unknown)[:5]}")
        if kind == "dp-logreg" and nonprivate and len(np.unique(y)) < 2:
            raise ConfigError(
                f"a non-private logistic regression needs rows of at least two classes; this data holds "
                f"only class {classes[int(y[0])]!r}"
            )
        if kind == "dp-nb" and not nonprivate and len(np.unique(y)) < len(classes):
            raise ConfigError(
                "dp-nb (diffprivlib's GaussianNB) publishes an exact zero count for a declared class the "
                "rows lack, which DP does not cover; use dp-logreg, dp-forest or dp-nn for these rows"
            )
    if not nonprivate and not (epsilon > 0 and math.isfinite(epsilon) and 0 < delta < 1):
        raise ConfigError(f"a DP model needs 0 < ε < ∞ and 0 < δ < 1, got ε={epsilon}, δ={delta}")


# ---------------------------------------------------------------------------------------------- DP-SGD
def _dp_nn(
    x, y, task, classes, epsilon, delta, seed, nonprivate, epochs, hidden, batch_size, clip, lr, dp_hook=None
):
    """An MLP trained with the core's Poisson DP-SGD loop (:func:`silofl.training.poisson_steps`), σ
    calibrated by Opacus for (ε, δ) at the exact q and step count; the ε published is the accountant's for
    what ran."""
    from silofl.core.randomness import party_seeds
    from silofl.models import MLP
    from silofl.privacy import Accountant, DPGradient, NoiseSource, noise_multiplier_for
    from silofl.privacy.sampling import make_sampler
    from silofl.training import poisson_steps

    n, d = x.shape
    outputs = len(classes) if task == "classification" else 1
    torch.manual_seed(seed if seed is not None else party_seeds(None, 0)[0])
    model = MLP((d,), outputs, hidden=(hidden,))
    xt = torch.as_tensor(x, dtype=torch.float32)
    yt = torch.as_tensor(y, dtype=torch.long if task == "classification" else torch.float32)
    q = min(1.0, batch_size / n)
    steps = max(1, round(epochs / q))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    gen = make_sampler(seed)  # Poisson sampling: secure unless seeded

    def loss_fn(out, target, _partner_logp=None):
        if task == "classification":
            return F.cross_entropy(out, target, reduction="none")
        return (out.squeeze(1) - target) ** 2

    if nonprivate:
        if dp_hook is not None:
            dp_hook(None, model, opt, n)
        poisson_steps(model, opt, xt, yt, sample_rate=q, steps=steps, sampler=gen, loss_fn=loss_fn)
        return dict(model.state_dict()), {"name": "none (non-private)"}, math.inf
    try:
        sigma = noise_multiplier_for(epsilon, delta, q, steps)
    except ValueError:
        raise ConfigError(
            f"the budget ε={epsilon:g}, δ={delta:g} cannot be met by DP-SGD with {steps} steps at "
            f"sampling rate {q:.3g}: raise ε, or train fewer epochs"
        ) from None
    dp = DPGradient(
        model,
        clip,
        sigma,
        q * n,
        NoiseSource(seed + 1 if seed is not None else None),
        backend="vmap",
        sample_rate=q,
    )
    if dp_hook is not None:
        dp_hook(dp, model, opt, n)
    poisson_steps(model, opt, xt, yt, sample_rate=q, steps=steps, sampler=gen, loss_fn=loss_fn, dp=dp)
    acc = Accountant("rdp")
    acc.record(dp.take_run())
    eps = acc.epsilon(delta)
    if eps > epsilon * (1 + 1e-6):
        raise RuntimeError(
            f"DP-SGD spent ε={eps:.4f} above the target {epsilon}"
        )  # cannot happen: σ is calibrated
    mech = {
        "name": "dp-sgd",
        "noise_multiplier": sigma,
        "sample_rate": q,
        "steps": steps,
        "clip": clip,
        "accountant": acc.name,
        "epsilon_spent": eps,
    }
    return dict(model.state_dict()), mech, eps


# ---------------------------------------------------------------------------------------------- diffprivlib
def _diffprivlib(kind, x, y, task, classes, epsilon, seed, nonprivate, y_bounds, trees, depth):
    if not nonprivate:
        require("diffprivlib", "pubsub", f"a {kind} model (diffprivlib)")
    d = x.shape[1]
    unit = (np.zeros(d), np.ones(d))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # diffprivlib warns about settings we pass on purpose
        if kind == "dp-logreg":
            if (
                nonprivate
            ):  # one-vs-rest like diffprivlib's, so that the published form (and its inference) match
                from sklearn.linear_model import LogisticRegression as LR
                from sklearn.multiclass import OneVsRestClassifier

                m = LR(max_iter=1000).fit(x, y)
                if len(m.classes_) > 2:
                    ovr = OneVsRestClassifier(LR(max_iter=1000)).fit(x, y)
                    m.coef_ = np.vstack([e.coef_ for e in ovr.estimators_])
                    m.intercept_ = np.concatenate([e.intercept_ for e in ovr.estimators_])
            else:
                m = _declared_class_logreg(x, y, len(classes), epsilon, math.sqrt(d), seed)
            coef, icpt = _full_linear(m.coef_, m.intercept_, m.classes_, len(classes))
            tensors = {"coef": coef, "intercept": icpt}
            mech = {
                "name": "diffprivlib.LogisticRegression (objective perturbation)",
                "data_norm": math.sqrt(d),
            }
        elif kind == "dp-linreg":
            lo, hi = y_bounds if y_bounds is not None else (float(np.min(y)), float(np.max(y)))
            if nonprivate:
                from sklearn.linear_model import LinearRegression as LinR

                m = LinR().fit(x, y)
            else:
                if y_bounds is None:
                    raise ConfigError("dp-linreg needs public bounds of the target (y_bounds)")
                from diffprivlib.models import LinearRegression

                m = LinearRegression(
                    epsilon=epsilon, bounds_X=unit, bounds_y=(lo, hi), random_state=seed
                ).fit(x, y)
            tensors = {
                "coef": torch.as_tensor(np.atleast_2d(m.coef_), dtype=torch.float64),
                "intercept": torch.as_tensor(np.atleast_1d(m.intercept_), dtype=torch.float64),
            }
            mech = {"name": "diffprivlib.LinearRegression (functional mechanism)", "bounds_y": [lo, hi]}
        elif kind == "dp-nb":
            if nonprivate:
                from sklearn.naive_bayes import GaussianNB as NB

                m = NB().fit(x, y)
            else:
                from diffprivlib.models import GaussianNB

                m = GaussianNB(epsilon=epsilon, bounds=unit, random_state=seed)
                m.fit(x, y)
            tensors = _full_nb(m, len(classes))
            mech = {"name": "diffprivlib.GaussianNB"}
        else:  # dp-forest
            if nonprivate:
                from sklearn.ensemble import RandomForestClassifier as RF

                m = RF(n_estimators=trees, max_depth=depth, random_state=seed).fit(x, y)
            else:
                from diffprivlib.models import RandomForestClassifier

                m = RandomForestClassifier(
                    n_estimators=trees,
                    epsilon=epsilon,
                    bounds=unit,
                    max_depth=depth,
                    classes=np.arange(len(classes)),
                    random_state=seed,
                ).fit(x, y)
            tensors = _forest_tensors(m, len(classes))
            mech = {"name": "diffprivlib.RandomForestClassifier", "trees": trees, "max_depth": depth}
    if nonprivate:
        mech = {
            "name": "none (non-private)",
            "model": mech["name"].split(" ")[0].replace("diffprivlib.", "sklearn."),
        }
    else:
        mech.update({"epsilon": float(epsilon), "delta": 0.0})
    return tensors, mech


def _declared_class_logreg(x, y, k: int, epsilon: float, data_norm: float, seed):
    """diffprivlib's DP logistic regression (objective perturbation, one-vs-rest, ε split evenly over the
    classes) fitted over the *declared* classes 0…k−1 rather than the classes present in the rows —
    diffprivlib's own fit takes its classes from the data, so a class missing from a site's rows would show in
    the published model. Every step is diffprivlib's (``_logistic_regression_path`` per class, the same random
    state), so when every declared class is present the result is the one ``LogisticRegression.fit`` gives."""
    from diffprivlib.models import LogisticRegression
    from diffprivlib.models.logistic_regression import _logistic_regression_path
    from diffprivlib.utils import check_random_state

    m = LogisticRegression(epsilon=epsilon, data_norm=data_norm, random_state=seed, max_iter=1000)
    random_state = check_random_state(m.random_state)
    x = m._clip_to_norm(np.ascontiguousarray(x, dtype=float), data_norm)
    m.classes_ = np.arange(k)
    fitted = m.classes_[1:] if k == 2 else m.classes_  # binary: one model for the second class, the whole ε
    coefs = [
        _logistic_regression_path(
            x,
            y,
            epsilon=epsilon / len(fitted),
            data_norm=data_norm,
            pos_class=c,
            Cs=[m.C],
            fit_intercept=m.fit_intercept,
            max_iter=m.max_iter,
            tol=m.tol,
            verbose=m.verbose,
            coef=None,
            random_state=random_state,
            check_input=False,
        )[0]
        for c in fitted
    ]
    coef = np.asarray(coefs).reshape(len(fitted), x.shape[1] + 1)
    m.coef_, m.intercept_ = coef[:, :-1], coef[:, -1]
    return m


def _full_linear(coef, icpt, seen, k):
    """coef/intercept over all k classes (a class absent from the data gets −∞-like scores)."""
    coef, icpt = np.atleast_2d(coef), np.atleast_1d(icpt)
    if k == 2 and coef.shape[0] == 1:
        if len(seen) == 2:
            return torch.as_tensor(coef, dtype=torch.float64), torch.as_tensor(icpt, dtype=torch.float64)
    full_c, full_i = np.zeros((k, coef.shape[1])), np.full(k, -30.0)
    if coef.shape[0] == 1:  # binary fit on two of k classes
        full_c[seen[1]], full_i[seen[1]] = coef[0], icpt[0]
        full_c[seen[0]], full_i[seen[0]] = -coef[0], -icpt[0]
    else:
        for j, c in enumerate(seen):
            full_c[c], full_i[c] = coef[j], icpt[j]
    return torch.as_tensor(full_c, dtype=torch.float64), torch.as_tensor(full_i, dtype=torch.float64)


def _full_nb(m, k):
    d = m.theta_.shape[1]
    theta, var, prior = np.zeros((k, d)), np.ones((k, d)), np.full(k, 1e-12)
    for j, c in enumerate(np.asarray(m.classes_).astype(int)):
        theta[c], var[c], prior[c] = m.theta_[j], np.maximum(m.var_[j], 1e-9), max(m.class_prior_[j], 1e-12)
    return {
        "theta": torch.as_tensor(theta, dtype=torch.float64),
        "var": torch.as_tensor(var, dtype=torch.float64),
        "class_prior": torch.as_tensor(prior / prior.sum(), dtype=torch.float64),
    }


def _forest_tensors(m, k):
    tensors = {}
    for t, est in enumerate(m.estimators_):
        tree = est.tree_
        value = tree.value[:, 0, :]
        cls = np.asarray(getattr(est, "classes_", np.arange(value.shape[1]))).astype(int)
        full = np.zeros((tree.node_count, k))
        full[:, cls] = value
        full = np.maximum(full, 0)
        tot = full.sum(1, keepdims=True)
        full = np.where(tot > 0, full / np.where(tot > 0, tot, 1), 1.0 / k)
        tensors.update(
            {
                f"tree{t}.left": torch.as_tensor(tree.children_left, dtype=torch.int64),
                f"tree{t}.right": torch.as_tensor(tree.children_right, dtype=torch.int64),
                f"tree{t}.feature": torch.as_tensor(tree.feature, dtype=torch.int64),
                f"tree{t}.threshold": torch.as_tensor(tree.threshold, dtype=torch.float64),
                f"tree{t}.value": torch.as_tensor(full, dtype=torch.float64),
            }
        )
    return tensors
