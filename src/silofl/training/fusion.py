"""Fusing several models' outputs into one prediction, fitted on held-out rows: PubSub-ML's fusion network
(:mod:`silofl.pubsub.customize`) and a site's combination of its own model with the DP models it holds
(:mod:`silofl.site.combine`) share these pieces.

* :class:`Fusion`: a linear layer over the models' concatenated log-probabilities (or predictions), started
  at the best model, at the plain ensemble or at zero, plus optionally one hidden layer; the penalty pulls the
  linear layer back to its start.
* :func:`fit_fusion`: full-batch L-BFGS of cross-entropy (or MSE) plus ``weight_decay · penalty``. With
  ``start="zero"`` and no hidden layer this is multinomial logistic regression with an L2 penalty on every
  weight and the intercept (scikit-learn's ``LogisticRegression(fit_intercept=False)`` on the features and a
  column of ones, ``C = 1 / (2 · weight_decay · n)``, finds the same optimum).
* :func:`fit_weights`: one non-negative weight per model, summing to one, on a grid (log-linear pooling:
  ``softmax(Σ_m w_m · log p_m)``), chosen by held-out cross-entropy.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import nn

FUSION_STARTS = ("best", "mean", "zero")


class Fusion(nn.Module):
    """A linear layer over m(x) that starts as the best model on the fitting rows (``start="best"``; the
    models come ranked), as the plain ensemble (``"mean"``: the mean of the models' log-probabilities, or of
    their predictions) or at zero (``"zero"``: plain logistic regression), plus optionally one hidden layer
    whose output starts at zero. Training moves it away from its start only as far as the fitting rows
    support: ``penalty`` is the squared distance of the linear layer from its start plus the squared weights
    of the hidden part."""

    def __init__(
        self,
        n_in: int,
        n_out: int,
        n_models: int,
        hidden: int,
        task: str,
        y_mean: float = 0.0,
        y_std: float = 1.0,
        start: str = "best",
    ):
        super().__init__()
        self.linear = nn.Linear(n_in, n_out)
        with torch.no_grad():
            w = torch.zeros(n_out, n_in)
            if start == "best":  # the first block: the best model on the fitting rows
                w[:, :n_out] = torch.eye(n_out) if task == "classification" else 1.0 / y_std
            elif (
                start != "zero"
            ):  # "mean", the plain ensemble: mean of the models' log-probabilities / predictions
                w[:] = (
                    torch.eye(n_out).repeat(1, n_models)
                    if task == "classification"
                    else torch.ones(n_out, n_in) / y_std
                ) / n_models
            self.linear.weight.copy_(w)
            self.linear.bias.fill_(0.0 if task == "classification" or start == "zero" else -y_mean / y_std)
        self.start = [p.detach().clone() for p in self.linear.parameters()]
        self.mlp = None
        if hidden:
            self.mlp = nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, n_out))
            with torch.no_grad():
                self.mlp[2].weight.zero_()
                self.mlp[2].bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.linear(x)
        return z if self.mlp is None else z + self.mlp(x)

    def penalty(self) -> torch.Tensor:
        """The squared distance of the linear layer from its start plus the hidden part's squared weights."""
        pen = sum(((p - s) ** 2).sum() for p, s in zip(self.linear.parameters(), self.start, strict=True))
        if self.mlp is not None:
            pen = pen + sum((p**2).sum() for p in self.mlp.parameters())
        return pen


def fit_fusion(
    fusion: Fusion,
    feats: torch.Tensor,
    target: torch.Tensor,
    task: str = "classification",
    weight_decay: float = 1e-2,
    epochs: int = 100,
    tolerance_grad: float = 1e-7,
    tolerance_change: float = 1e-9,
    class_weight: torch.Tensor | None = None,
) -> Fusion:
    """Fit ``fusion`` on (feats, target) by full-batch L-BFGS of the mean loss plus ``weight_decay ·
    penalty``; returns it in eval mode. ``class_weight``: each class's weight in the mean cross-entropy
    (classification). (Full batch L-BFGS: the objective is smooth and small; Adam's sign-like first steps
    swung the logits of log-probability inputs by whole units and lost the ensemble it started from.)"""
    opt = torch.optim.LBFGS(
        fusion.parameters(),
        lr=1.0,
        max_iter=epochs,
        line_search_fn="strong_wolfe",
        tolerance_grad=tolerance_grad,
        tolerance_change=tolerance_change,
    )

    def closure():
        opt.zero_grad()
        z = fusion(feats)
        loss = (
            F.cross_entropy(z, target, weight=class_weight)
            if task == "classification"
            else F.mse_loss(z.squeeze(1), target)
        )
        loss = loss + weight_decay * fusion.penalty()
        loss.backward()
        return loss

    if epochs > 0:
        opt.step(closure)
    return fusion.eval()


def weight_grid(n_models: int, step: float = 0.05) -> list[tuple[float, ...]]:
    """Every weight vector on the simplex with entries that are multiples of ``step``."""
    k = round(1 / step)
    return [
        tuple(c / k for c in combo) + ((k - sum(combo)) / k,)
        for combo in itertools.product(range(k + 1), repeat=n_models - 1)
        if sum(combo) <= k
    ]


def fit_weights(
    logps: list[torch.Tensor], y: torch.Tensor, step: float = 0.05, class_weight: torch.Tensor | None = None
) -> tuple[float, ...]:
    """The weights w (on the simplex, multiples of ``step``) minimising the cross-entropy of
    ``softmax(Σ_m w_m · logps[m])`` on (logps, y); ties go to the earlier grid point (more weight on the last
    model first)."""
    stacked = torch.stack(logps)  # (models, n, classes)
    best, best_loss = None, float("inf")
    for w in weight_grid(len(logps), step):
        z = torch.einsum("m,mnc->nc", torch.tensor(w, dtype=stacked.dtype), stacked)
        loss = float(F.cross_entropy(z, y, weight=class_weight))
        if loss < best_loss - 1e-12:
            best, best_loss = w, loss
    assert best is not None
    return best
