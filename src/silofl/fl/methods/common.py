"""What the built-in example-level methods share: a DP-SGD site's settings from the run's plan."""

from __future__ import annotations

from typing import Any

from silofl.fl.options import DPSGDOptions, MutualLearningOptions, SharedModelOptions
from silofl.fl.plan import RunPlan, as_plan
from silofl.models import ModelSpec
from silofl.site.dpsgd import DPSGDSettings

# what a method reads of its run (the name of the protocol methods were typed against before plans)
PlannedRun = RunPlan


def dpsgd_settings(plan: RunPlan | Any, k: int) -> DPSGDSettings:
    """The settings of site ``k`` of an example-level method: the asked settings from ``plan.config``, the
    derived ones (batch size, σ) from the plan, its own budget ``plan.target_epsilon_of(k)``. ``plan``: the
    method's :class:`~silofl.fl.plan.RunPlan` (a config given in full is taken as its plan)."""
    p = as_plan(plan)
    cfg = p.config  # what the user asked
    o: DPSGDOptions = cfg.options  # an example-level method's options hold the DP-SGD recipe
    if p.batch_size is None:
        raise ValueError(
            "a DP-SGD site needs the planned batch size (silofl.runner.plan fills it from the data)"
        )
    return DPSGDSettings(
        seed=cfg.seed,
        batch_size=p.batch_size,
        lr=o.lr,
        weight_decay=o.weight_decay,
        private=cfg.is_private,
        noise_multiplier=p.noise_multiplier,
        clip=cfg.clip,
        delta=cfg.delta,
        accountant=cfg.accountant,
        target_epsilon=p.target_epsilon_of(k),
        dp_backend=o.dp_backend,
        optimizer_state=o.optimizer_state if isinstance(o, SharedModelOptions) else "reset",
        dml_alpha=o.dml_alpha if isinstance(o, MutualLearningOptions) else 0.5,
        dml_beta=float((o.dml_beta if isinstance(o, MutualLearningOptions) else 0.0) or 0.0),
        optimizer=o.optimizer,
        momentum=o.momentum,
        nesterov=o.nesterov,
        ema_decay=o.ema_decay,
        augmult=o.augmult,
        aug_pad=o.aug_pad,
        aug_flip=o.aug_flip,
        sample_rate=o.sample_rate,
        local_steps=o.local_steps,
        private_lr=o.private_lr,
    )


def spec(name: str, data: Any) -> ModelSpec:
    """A model spec of architecture ``name`` for the data's input shape and classes."""
    return ModelSpec(name, data.input_shape, data.num_classes)
