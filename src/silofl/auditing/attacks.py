"""Membership inference on real examples: signals, reference models, and the attacks' figures.

A *target* is any function from inputs to logits (a torch model, or a published model's
log-probabilities). For each target three attacks score every candidate (members: the audited site's
real training examples; non-members: pool examples of the same classes, :mod:`silofl.auditing.canaries`):

* ``loss`` — Yeom et al.: −cross-entropy of the true label (no reference models);
* ``lira_offline`` — Carlini et al. 2022, offline: the target's logit-scaled confidence φ against a
  Gaussian fitted to φ under reference models that never saw the candidate (one global standard
  deviation, as the paper advises for few reference models);
* ``rmia_offline`` — Zarifzadeh et al. 2024, offline (a = 0.3): the fraction of population points z the
  candidate dominates in likelihood ratio against the reference models.

Reference models are trained like the target on data disjoint from every candidate: the same
architecture and the site's local recipe (:class:`Recipe`) on as many pool examples as the site holds,
with the site's class proportions. They are standalone models — not federated — which is what an
outside attacker can train; the figures say so.

Reported per attack: AUC, TPR at 0.1% and 1% FPR, the best balanced accuracy, and the member and
non-member counts. TPR at 0.1% FPR rests on the 0.1% highest-scoring non-members: below 1000
non-members it is a figure about fewer than one false positive, and the result says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from silofl.auditing import mia
from silofl.auditing.canaries import Rows
from silofl.models import ModelSpec
from silofl.privacy import DPGradient, NoiseSource
from silofl.training import poisson_steps

Target = Callable[[torch.Tensor], np.ndarray]  # inputs -> logits (or log-probabilities), float64 [n, classes]
FPRS = (1e-3, 1e-2)
ATTACKS = ("loss", "lira_offline", "rmia_offline")


@torch.no_grad()
def model_logits(model: nn.Module, x: torch.Tensor, batch: int = 2048) -> np.ndarray:
    """The model's logits on ``x`` (eval mode, no gradient), float64."""
    was = model.training
    model.eval()
    out = [model(x[i : i + batch]).double().cpu() for i in range(0, len(x), batch)]
    model.train(was)
    return torch.cat(out).numpy() if out else np.zeros((0, 0))


def as_target(model: nn.Module) -> Target:
    """``model`` as an attack target: inputs → logits (numpy)."""
    return lambda x: model_logits(model, x)


def with_state(
    spec: ModelSpec, state: dict[str, torch.Tensor], device: torch.device | str = "cpu"
) -> nn.Module:
    """A model of ``spec`` holding ``state``."""
    m = spec.build().to(device)
    m.load_state_dict({k: v.to(device) for k, v in state.items()})
    return m


def phi(logits: np.ndarray, y: torch.Tensor | np.ndarray) -> np.ndarray:
    """LiRA's logit-scaled confidence of label ``y``: log p_y − log(1 − p_y), stable."""
    return mia.logit_confidence(logits, np.asarray(y.cpu() if isinstance(y, torch.Tensor) else y))


@dataclass(frozen=True)
class Recipe:
    """How the site trained the target, for reference models: Poisson batches of expected size
    ``batch_size``, ``steps`` steps, Adam (or SGD for client-level local training), DP-SGD if ``private``."""

    steps: int
    batch_size: int
    lr: float
    weight_decay: float = 0.0
    optimizer: str = "adam"
    private: bool = False
    noise_multiplier: float = 0.0
    clip: float = 1.0

    def describe(self) -> str:
        """The recipe in words (audit.json's ``reference_recipe``)."""
        dp = f"DP-SGD σ={self.noise_multiplier:g}, C={self.clip:g}" if self.private else "no DP"
        return (
            f"{self.optimizer} lr {self.lr:g}, {self.steps} Poisson steps of expected batch "
            f"{self.batch_size}, {dp}"
        )


def train_reference(
    spec: ModelSpec, rows: Rows, recipe: Recipe, seed: int, device: torch.device | str = "cpu"
) -> nn.Module:
    """One reference model of ``spec`` trained on ``rows`` with ``recipe`` (cross-entropy)."""
    torch.manual_seed(seed)
    model = spec.build().to(device)
    x, y = rows.x.to(device), rows.y.to(device)
    n = len(y)
    q = min(1.0, recipe.batch_size / max(1, n))
    if recipe.optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=recipe.lr)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    dp = None
    if recipe.private:
        dp = DPGradient(
            model,
            clip=recipe.clip,
            noise_multiplier=recipe.noise_multiplier,
            expected_batch_size=q * n,
            noise=NoiseSource(seed + 1, device=device),
            backend="auto",
            sample_rate=q,
        )

    def loss_fn(out, target, _partner=None):
        return F.cross_entropy(out, target, reduction="none")

    poisson_steps(
        model,
        opt,
        x,
        y,
        sample_rate=q,
        steps=recipe.steps,
        sampler=torch.Generator().manual_seed(seed + 2),
        loss_fn=loss_fn,
        dp=dp,
    )
    return model.eval()


def metrics(scores: np.ndarray, is_member: np.ndarray) -> dict:
    """AUC, TPR at 0.1% and 1% FPR, balanced accuracy, counts, and a note on low-FPR resolution."""
    r = mia.attack_metrics(scores, is_member, FPRS)
    out = {
        "auc": r["auc"],
        "tpr_at_0.1%_fpr": float(r["tpr@0.001fpr"]),
        "tpr_at_1%_fpr": float(r["tpr@0.01fpr"]),
        "balanced_accuracy": r["balanced_acc"],
        "members": r["n_members"],
        "nonmembers": r["n_nonmembers"],
    }
    if r["n_nonmembers"] < 1000:
        out["note"] = (
            f"TPR at 0.1% FPR rests on fewer than one false positive with {r['n_nonmembers']} non-members "
            "(it needs at least 1000 to mean anything)"
        )
    return out


def roc_points(scores: np.ndarray, is_member: np.ndarray, max_points: int = 400) -> dict:
    """A thinned ROC curve for plots: {fpr, tpr}."""
    fpr, tpr, _ = mia.roc_curve(scores, is_member)
    if len(fpr) > max_points:
        keep = np.unique(np.r_[np.geomspace(1, len(fpr) - 1, max_points).astype(int), 0, len(fpr) - 1])
        fpr, tpr = fpr[keep], tpr[keep]
    return {"fpr": fpr.tolist(), "tpr": tpr.tolist()}


def membership_inference(
    target: Target, references: list[Target], members: Rows, nonmembers: Rows, population: Rows
) -> tuple[dict, dict]:
    """(figures per attack, ROC curves per attack) of ``target`` on members vs non-members."""
    x = torch.cat([members.x, nonmembers.x])
    y = torch.cat([members.y, nonmembers.y])
    is_member = np.r_[np.ones(len(members), bool), np.zeros(len(nonmembers), bool)]
    logits = target(x)
    scores = {"loss": mia.loss_score(logits, y.cpu().numpy())}
    if references:
        phi_t = phi(logits, y)
        ref_logits = [r(x) for r in references]
        phi_ref = np.stack([phi(lg, y) for lg in ref_logits])
        scores["lira_offline"] = mia.lira_offline(phi_t, phi_ref, global_std=True)
        yz = population.y.cpu().numpy()
        p_x = mia.true_label_prob(logits, y.cpu().numpy())
        p_ref_x = np.stack([mia.true_label_prob(lg, y.cpu().numpy()) for lg in ref_logits])
        p_z = mia.true_label_prob(target(population.x), yz)
        p_ref_z = np.stack([mia.true_label_prob(r(population.x), yz) for r in references])
        scores["rmia_offline"] = mia.rmia(p_x, p_ref_x, p_z, p_ref_z, offline_a=0.3)
    figures = {name: metrics(s, is_member) for name, s in scores.items()}
    curves = {name: roc_points(s, is_member) for name, s in scores.items()}
    return figures, curves
