"""The one Poisson-sampled (DP-)SGD loop, optionally with a mutual-learning partner.

Every step draws a Poisson batch (each example independently with probability q, so batches vary and
may be empty), computes the model's per-example losses and either the DP-SGD gradient
(:class:`~silofl.privacy.DPGradient`: clip, sum, noise, divide by the expected batch size) or the
plain mean gradient, and steps the optimizer. An empty batch is still a DP step (noise only) and the
mechanism counts it; without DP it is skipped.

With a :class:`Partner` (deep mutual learning, ProxyFL/FML) the partner model — the site's private
model, never released — is trained on the same batch after the shared model: its loss is
``(1-α)·CE + α·KL(partner‖shared)`` against the shared model's (detached) output, plain optimizer, no
DP. The shared model's loss receives the partner's detached log-probabilities as an extra input
(used when β > 0, ``paper`` mode). Sites (:mod:`silofl.site`) and PubSub-ML's DP network
(:mod:`silofl.pubsub.dp_models`) both train through :func:`poisson_steps`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from silofl.privacy.dpsgd import DPGradient
from silofl.privacy.person import PersonIndex
from silofl.privacy.sampling import Sampler, poisson_batch
from silofl.training.augment import AugMult

LossFn = Callable[..., torch.Tensor]  # (logits, y, partner log-probs or a (B, 1) placeholder) -> (B,) losses


def dml_loss(
    logits: torch.Tensor, y: torch.Tensor, other_logp: torch.Tensor | None, weight: float
) -> torch.Tensor:
    """Per-example (1-w)·CE + w·KL(other ‖ model) with the other model's log-probs detached (masks: per image
    Dice + CE and the per-pixel KL, :func:`silofl.training.segmentation.segmentation_dml_loss`)."""
    if logits.dim() == 4 and y.dim() == 3:
        from silofl.training.segmentation import segmentation_dml_loss

        return segmentation_dml_loss(logits, y, other_logp, weight)
    from silofl.training.tasks import target_task

    own = target_task(y)  # a task with its own per-example loss (a survival target) and distillation
    if own is not None and own.distill is not None:
        return own.distill(logits, y, other_logp, weight)
    if own is not None and own.loss is not None:
        return own.loss(logits, y)
    ce = F.cross_entropy(logits, y, reduction="none")
    if weight == 0.0 or other_logp is None:
        return ce
    kl = F.kl_div(F.log_softmax(logits, dim=1), other_logp, reduction="none", log_target=True).sum(1)
    return (1.0 - weight) * ce + weight * kl


@dataclass
class Partner:
    """A model trained alongside by mutual learning (never released, never DP)."""

    model: nn.Module
    opt: torch.optim.Optimizer
    alpha: float  # the partner's KL weight


def poisson_steps(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    sample_rate: float,
    steps: int,
    sampler: Sampler,
    loss_fn: LossFn,
    dp: DPGradient | None = None,
    partner: Partner | None = None,
    augment: AugMult | None = None,
    grad_hook: Callable[[], None] | None = None,
    persons: PersonIndex | None = None,
) -> dict:
    """Run ``steps`` Poisson-sampled steps on (x, y); returns what was seen (examples, empty batches, and
    under DP the mean per-example gradient norm and the fraction clipped — per-example statistics of the
    site's data, NOT privatised). ``augment``: augmentation multiplicity — the model steps on K views of each
    sampled example, an example's loss the mean over its views (clipped as one example under DP); a partner
    trains on the un-augmented batch. ``grad_hook``: called after every step's gradient is in ``p.grad``
    (under DP: the noised one) and before the optimizer steps — a data-independent term such as a proximal
    pull towards a received model (FedProx, Ditto, MR-MTL) added there is post-processing of the DP gradient.
    ``persons`` (person-level DP, :mod:`silofl.privacy.person`): Poisson sampling of persons at rate
    ``sample_rate``, each with all of their rows, and under DP each person's rows clipped together (the
    statistics are then per person)."""
    model.train()
    if partner is not None:
        partner.model.train()
    n = len(y)
    if persons is not None and augment is not None:
        raise ValueError("person-level sampling does not take augmentation multiplicity")
    clipped, norms, seen, empty, units = 0.0, 0.0, 0, 0, 0
    for _ in range(steps):
        groups = None
        if persons is not None:
            idx, groups = persons.batch(sample_rate, sampler)
            idx, groups = idx.to(x.device), groups.to(x.device)
        else:
            idx = poisson_batch(n, sample_rate, sampler).to(x.device)
        xb, yb = x[idx], y[idx]
        B = len(idx)
        opt.zero_grad(set_to_none=True)
        no_logp = torch.zeros(B, 1, device=xb.device)
        if B == 0:
            empty += 1
            if dp is not None:  # a noise-only step, still counted by the mechanism
                dp.compute(xb, loss_fn, yb, no_logp, groups=groups)
                if grad_hook is not None:
                    grad_hook()
                opt.step()
            continue
        partner_logits = partner.model(xb) if partner is not None else None
        partner_logp = partner_view(partner_logits.detach(), yb) if partner_logits is not None else no_logp
        if augment is not None:
            logits, ast = _augmented_step(
                model, augment, xb, yb, partner_logp, loss_fn, dp, partner is not None
            )
            if ast is not None:
                clipped += ast.clipped_fraction * B
                norms += ast.mean_norm * B
                units += B
        elif dp is not None:
            logits, st = dp.compute(xb, loss_fn, yb, partner_logp, groups=groups)
            clipped += st.clipped_fraction * st.batch_size
            norms += st.mean_norm * st.batch_size
            units += st.batch_size
        else:
            out = model(xb)
            loss_fn(out, yb, partner_logp).mean().backward()
            logits = out.detach()
        if grad_hook is not None:
            grad_hook()
        opt.step()
        seen += B
        if partner is not None and partner_logits is not None:
            loss = dml_loss(partner_logits, yb, partner_view(logits, yb), partner.alpha).mean()
            partner.opt.zero_grad(set_to_none=True)
            loss.backward()
            partner.opt.step()
    return {
        "examples_seen": seen,
        "empty_batches": empty,
        "clipped_fraction": clipped / units if units else 0.0,
        "mean_grad_norm": norms / units if units else 0.0,
    }


def partner_view(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """What a mutual-learning partner sees of a model's (detached) outputs: its log-probabilities, or its
    task's own view (a survival model's log hazards, :mod:`silofl.training.tasks`)."""
    from silofl.training.tasks import target_task

    own = target_task(y)
    if own is not None and own.partner_view is not None:
        return own.partner_view(out)
    return F.log_softmax(out, dim=1)


def _augmented_step(
    model: nn.Module,
    augment: AugMult,
    xb: torch.Tensor,
    yb: torch.Tensor,
    logp: torch.Tensor,
    loss_fn: LossFn,
    dp: DPGradient | None,
    want_logits: bool,
):
    """Gradients of one augmentation-multiplicity step in ``p.grad``: (the model's logits on the un-augmented
    batch when a partner needs them, else None; the DP step's statistics or None)."""
    K = augment.views
    xv = augment(xb)
    logits = None
    if want_logits:
        with torch.no_grad():
            logits = model(xb)
    if dp is not None:
        _, st = dp.compute(xv, loss_fn, yb, logp, views=K)
        return logits, st
    out = model(xv)
    loss_fn(out, yb.repeat_interleave(K, 0), logp.repeat_interleave(K, 0)).mean().backward()
    return logits, None
