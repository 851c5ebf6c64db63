"""A method's own options: its typed section of ``config.yaml``.

A method declares one dataclass, composed from the building blocks below, and only those options
appear under its name in ``config.yaml`` (a FedAvg run has no ``dml_alpha``, a ProxyFL run no
``server_lr``). :meth:`MethodOptions.resolve` fills values that depend on the common settings (the
shared model's KL weight β from the privacy mode; a server learning rate per optimizer) and is
idempotent; :meth:`MethodOptions.validate` raises a one-line ConfigError.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field, fields
from typing import Any

from silofl.core.errors import ConfigError

GRAPHS = ("exponential", "ring", "complete")  # silofl.topology.graphs.GRAPH_TYPES
DP_BACKENDS = ("auto", "ghost", "vmap")
OPTIMIZER_STATE = ("keep", "reset")
AGGREGATIONS = ("size", "uniform")
DP_OPTIMIZERS = ("adam", "sgd")
MAX_STEPS_PER_ROUND = 100_000  # a round's DP steps (local_steps, or ⌊1/q⌋ from sample_rate)
IMAGE_DATASETS = ("fashion-mnist", "mnist", "cifar10", "digits", "npz", "folder")
PRIVACY_UNITS = ("hospital", "subclient")


def option(default: Any, help: str, panel: str = "method") -> Any:
    """A method option's dataclass field: its default, and the help text and help panel (data / privacy /
    method / engine / output) of the flag :mod:`silofl.cli.config_options` generates for it —
    ``field(default=…, metadata={"help": …, "panel": …})``, as a plug-in method's options may also write.
    Every built-in option has its help here, with the option (a test checks)."""
    return field(default=default, metadata={"help": help, "panel": panel})


def choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    """Raise ConfigError unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ConfigError(f"unknown {name} {value!r}; choose one of: {', '.join(allowed)}")


def positive(name: str, value: float) -> None:
    """Raise ConfigError unless ``value`` is a finite positive number."""
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{name} must be a finite positive number, got {value}")


def unit_interval(name: str, value: float, open_hi: bool = False) -> None:
    """Raise ConfigError unless 0 ≤ value ≤ 1 (value < 1 with ``open_hi``)."""
    if not (0.0 <= value <= 1.0) or (open_hi and value >= 1.0):
        raise ConfigError(f"{name} must lie in [0, 1{')' if open_hi else ']'}, got {value}")


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    """Log ``message`` as a warning once per process (options are validated more than once per run)."""
    if message not in _WARNED:
        _WARNED.add(message)
        logging.getLogger("silofl").warning(message)


@dataclass
class MethodOptions:
    """Base of every method's options."""

    def resolve(self, run: Any) -> MethodOptions:
        """Fill values that depend on the run's common settings (``run``: the RunConfig); idempotent."""
        return self

    def validate(self, run: Any) -> None:
        """Raise ConfigError for an invalid or inconsistent value."""
        return None

    def to_dict(self) -> dict[str, Any]:
        """The section as plain data."""
        return dataclasses.asdict(self)

    @classmethod
    def field_names(cls) -> list[str]:
        """Every option of this section."""
        return [f.name for f in fields(cls)]

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Each option's default value."""
        return {
            f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            for f in fields(cls)
        }


@dataclass
class DPSGDOptions(MethodOptions):
    """Sites that train with Poisson-sampled (DP-)SGD and Adam."""

    lr: float = option(1e-3, "DP-SGD methods: the DP model's learning rate.")
    weight_decay: float = option(1e-4, "DP-SGD methods: weight decay.")
    dp_backend: str = option("auto", "DP-SGD methods: how per-example gradients are computed.")
    # the DP-SGD recipe (silofl.site.dpsgd; defaults: today's Adam, one epoch of batch_size per round)
    optimizer: str = option("adam", "DP-SGD methods: the DP model's optimizer.")
    momentum: float = option(0.0, "--optimizer sgd: momentum.")  # sgd: heavy-ball momentum
    nesterov: bool = option(False, "--optimizer sgd: Nesterov momentum.")
    ema_decay: float = option(
        0.0,
        "DP-SGD methods: evaluate and save an EMA of the DP model's round-end weights with this decay "
        "(0: off).",
    )
    augmult: int = option(
        0, "DP-SGD methods, images: K augmented views per sampled example, averaged before clipping (0: off)."
    )
    aug_pad: int = option(4, "--augmult: random-crop padding in pixels.")
    aug_flip: bool = option(False, "--augmult: random horizontal flips.")
    sample_rate: float | None = option(
        None, "DP-SGD methods: Poisson rate q per step, up to 1 (default: batch size / n)."
    )
    local_steps: int | None = option(None, "DP-SGD methods: DP steps per round (default: one epoch).")
    # the non-DP models' Adam learning rate (a private model, combination's own model, going alone): None: lr
    private_lr: float | None = option(
        None,
        "DP-SGD methods: the non-DP models' Adam learning rate (a private model, --combine's own model, "
        "--vs-alone; default: --lr).",
    )

    def validate(self, run: Any) -> None:
        super().validate(run)
        positive("lr", self.lr)
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ConfigError(f"weight_decay must be a finite non-negative number, got {self.weight_decay}")
        choice("dp_backend", self.dp_backend, DP_BACKENDS)
        choice("optimizer", self.optimizer, DP_OPTIMIZERS)
        unit_interval("momentum", self.momentum, open_hi=True)
        if self.optimizer != "sgd" and (self.momentum != 0.0 or self.nesterov):
            raise ConfigError(
                "momentum and nesterov apply to optimizer 'sgd' (Adam has its own moments); add optimizer=sgd"
            )
        if self.nesterov and self.momentum == 0.0:
            raise ConfigError("nesterov needs momentum > 0")
        unit_interval("ema_decay", self.ema_decay, open_hi=True)
        if self.augmult < 0:
            raise ConfigError(
                f"augmult must be 0 (off) or a number of augmented views ≥ 1, got {self.augmult}"
            )
        if self.aug_pad < 0:
            raise ConfigError(f"aug_pad must be a non-negative number of pixels, got {self.aug_pad}")
        if self.augmult and getattr(run, "dataset", None) not in IMAGE_DATASETS:
            raise ConfigError(f"augmult augments images; dataset {getattr(run, 'dataset', None)!r} has none")
        if self.augmult and str(getattr(run, "features", None) or "none") != "none":
            raise ConfigError(
                "augmult augments raw images; with features the model sees features computed once per "
                "image, not images (use features none)"
            )
        if self.sample_rate is not None and not (
            math.isfinite(self.sample_rate) and 0.0 < self.sample_rate <= 1.0
        ):
            raise ConfigError(f"sample_rate must lie in (0, 1], got {self.sample_rate}")
        if self.local_steps is not None and not 1 <= self.local_steps <= MAX_STEPS_PER_ROUND:
            raise ConfigError(f"local_steps must lie in [1, {MAX_STEPS_PER_ROUND}], got {self.local_steps}")
        if (
            self.sample_rate is not None
            and self.local_steps is None
            and math.floor(1.0 / self.sample_rate + 1e-9) > MAX_STEPS_PER_ROUND
        ):
            raise ConfigError(
                f"sample_rate {self.sample_rate:g} plans ⌊1/q⌋ = {math.floor(1.0 / self.sample_rate):,} "
                f"DP steps a round (at most {MAX_STEPS_PER_ROUND:,}): raise it or set local_steps"
            )
        if self.private_lr is not None:
            positive("private_lr", self.private_lr)


@dataclass
class SharedModelOptions(DPSGDOptions):
    """A model that leaves the site (ProxyFL's proxy, FedAvg's global model)."""

    proxy_model: str = option(
        "mlp", "The shared model's architecture (ProxyFL's proxy, FedAvg's global model)."
    )
    optimizer_state: str = option(
        "reset",
        "Keep or reset the shared model's optimizer state (Adam's moments, SGD's momentum) when a received "
        "model replaces it.",
    )

    def validate(self, run: Any) -> None:
        super().validate(run)
        check_model(self.proxy_model)
        choice("optimizer_state", self.optimizer_state, OPTIMIZER_STATE)
        if (
            self.optimizer == "sgd"
            and self.momentum
            and self.optimizer_state == "reset"
            and self.local_steps == 1
        ):
            _warn_once(
                f"momentum {self.momentum:g} does nothing here: with one local step a round and "
                "optimizer_state 'reset' the momentum buffer is cleared every time a received model replaces "
                "the shared one; set optimizer_state keep (or server_momentum for FedAvg/FML)"
            )


@dataclass
class PrivateModelOptions(MethodOptions):
    """A model that never leaves the site, one architecture for all sites or one each."""

    private_model: str = option("lenet5", "The private model's architecture (never leaves the site).")
    private_models: list[str] | None = option(None, "One private architecture per client, comma-separated.")

    def validate(self, run: Any) -> None:
        super().validate(run)
        for name in [self.private_model, *(self.private_models or [])]:
            check_model(name)
        if self.private_models is not None and len(self.private_models) != run.clients:
            raise ConfigError(
                f"private_models lists {len(self.private_models)} architectures for {run.clients} clients"
            )

    def private_model_of(self, client: int) -> str:
        """The private architecture of ``client``."""
        return self.private_models[client] if self.private_models else self.private_model


@dataclass
class MutualLearningOptions(PrivateModelOptions):
    """Deep mutual learning between the private model (KL weight α) and the shared one (β)."""

    dml_alpha: float = option(0.5, "α, private model's KL weight.")
    dml_beta: float | None = option(None, "β, proxy's KL weight (0 in strict mode).")

    def resolve(self, run: Any) -> MethodOptions:
        if self.dml_beta is not None:
            return super().resolve(run)
        return dataclasses.replace(self, dml_beta=0.0 if run.privacy == "strict" else 0.5).resolve(run)

    def validate(self, run: Any) -> None:
        super().validate(run)
        unit_interval("dml_alpha", self.dml_alpha)
        if self.dml_beta is not None:
            unit_interval("dml_beta", self.dml_beta)
        if run.privacy == "strict" and self.dml_beta not in (None, 0.0):
            raise ConfigError(
                "privacy 'strict' needs dml_beta = 0 (the proxy may learn only from labels under DP-SGD); "
                "use privacy 'paper' for dml_beta > 0"
            )


@dataclass
class GossipOptions(MethodOptions):
    """PushSum gossip on a time-varying directed graph."""

    graph: str = option("exponential", "Gossip methods: the time-varying directed graph.")
    self_weight: float = option(0.0, "PushSum self weight (0: replace).")

    def validate(self, run: Any) -> None:
        super().validate(run)
        choice("graph", self.graph, GRAPHS)
        unit_interval("self_weight", self.self_weight)
        if self.self_weight == 1.0:
            raise ConfigError("self_weight 1 would never use a received proxy; use a value in [0, 1)")


@dataclass
class AveragingOptions(MethodOptions):
    """A server averaging the sites' shared models."""

    aggregation: str = option("size", "FedAvg/FML server weights.")  # weight sites by data size, or uniformly
    # the server's step on the average Δ̄ of the uploads (post-processing): w ← w + server_lr·m, m ← μ·m + Δ̄
    server_lr: float | None = option(
        None, "FedAvg/FML: step on the average of the sites' DP models (default 1)."
    )
    server_momentum: float = option(
        0.0, "FedAvg/FML: server momentum on the average of the sites' DP models."
    )

    def resolve(self, run: Any) -> MethodOptions:
        if self.server_lr is not None:
            return super().resolve(run)
        return dataclasses.replace(self, server_lr=1.0).resolve(run)

    def validate(self, run: Any) -> None:
        super().validate(run)
        choice("aggregation", self.aggregation, AGGREGATIONS)
        if self.server_lr is not None:
            positive("server_lr", self.server_lr)
        unit_interval("server_momentum", self.server_momentum, open_hi=True)


def check_model(name: str) -> None:
    """Raise ConfigError unless ``name`` is a known architecture."""
    from silofl.models import MODEL_NAMES

    if name not in MODEL_NAMES:
        raise ConfigError(f"unknown model {name!r}; available models: {', '.join(MODEL_NAMES)}")
