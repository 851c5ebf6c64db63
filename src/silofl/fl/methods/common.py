"""What the built-in example-level methods share: a DP-SGD site's settings from the run config."""

from __future__ import annotations

from typing import Any

from silofl.models import ModelSpec
from silofl.site.dpsgd import DPSGDSettings


def dpsgd_settings(cfg: Any, k: int) -> DPSGDSettings:
    """The settings of site ``k`` of an example-level method (its own budget: ``target_epsilon_of(k)``)."""
    o = cfg.options
    return DPSGDSettings(
        seed=cfg.seed, batch_size=cfg.batch_size, lr=o.lr, weight_decay=o.weight_decay, private=cfg.is_private,
        noise_multiplier=cfg.noise_multiplier, clip=cfg.clip, delta=cfg.delta, accountant=cfg.accountant,
        target_epsilon=cfg.target_epsilon_of(k), dp_backend=o.dp_backend,
        optimizer_state=getattr(o, "optimizer_state", "reset"), dml_alpha=getattr(o, "dml_alpha", 0.5),
        dml_beta=float(getattr(o, "dml_beta", 0.0) or 0.0),
        optimizer=o.optimizer, momentum=o.momentum, nesterov=o.nesterov, ema_decay=o.ema_decay, augmult=o.augmult,
        aug_pad=o.aug_pad, aug_flip=o.aug_flip, sample_rate=o.sample_rate, local_steps=o.local_steps,
        private_lr=getattr(o, "private_lr", None))


def spec(name: str, data: Any) -> ModelSpec:
    """A model spec of architecture ``name`` for the data's input shape and classes."""
    return ModelSpec(name, data.input_shape, data.num_classes)
