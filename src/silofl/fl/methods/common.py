"""What the built-in example-level methods share: a DP-SGD site's settings from the run as it runs."""

from __future__ import annotations

from typing import Any, Protocol

from silofl.fl.options import DPSGDOptions, MutualLearningOptions, SharedModelOptions
from silofl.models import ModelSpec
from silofl.site.dpsgd import DPSGDSettings


class PlannedRun(Protocol):
    """What a method reads of its run: the config as it runs — the user's settings with the values the run
    planned
    from the data filled in (:meth:`silofl.run.plan.RunPlan.config_as_run`: batch size, σ given or calibrated)
    — and
    the method's own options."""

    seed: int | None
    batch_size: int | None
    noise_multiplier: float
    clip: float
    delta: float
    accountant: str
    clients: int
    options: Any

    @property
    def is_private(self) -> bool:
        """Whether DP is on."""
        ...

    def target_epsilon_of(self, client: int) -> float | None:
        """Client ``client``'s budget."""
        ...


def dpsgd_settings(cfg: PlannedRun, k: int) -> DPSGDSettings:
    """The settings of site ``k`` of an example-level method (its own budget: ``target_epsilon_of(k)``)."""
    o: DPSGDOptions = cfg.options  # an example-level method's options hold the DP-SGD recipe
    batch: int = cfg.batch_size  # type: ignore[assignment]  # planned from the data before any site is built
    return DPSGDSettings(
        seed=cfg.seed,
        batch_size=batch,
        lr=o.lr,
        weight_decay=o.weight_decay,
        private=cfg.is_private,
        noise_multiplier=cfg.noise_multiplier,
        clip=cfg.clip,
        delta=cfg.delta,
        accountant=cfg.accountant,
        target_epsilon=cfg.target_epsilon_of(k),
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
