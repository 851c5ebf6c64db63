"""A method's own options: its typed section of ``config.yaml``.

A method declares one dataclass, composed from the building blocks below, and only those options
appear under its name in ``config.yaml`` (a FedAvg run has no ``dml_alpha``, a ProxyFL run no
``server_lr``). :meth:`MethodOptions.resolve` fills values that depend on the common settings (the
shared model's KL weight β from the privacy mode; a server learning rate per optimizer) and is
idempotent; :meth:`MethodOptions.validate` raises a one-line ConfigError.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from typing import Any

from silofl.core.errors import ConfigError

GRAPHS = ("exponential", "ring")
DP_BACKENDS = ("auto", "ghost", "vmap")
OPTIMIZER_STATE = ("keep", "reset")
AGGREGATIONS = ("size", "uniform")
PRIVACY_UNITS = ("hospital", "subclient")


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
        return {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
                for f in fields(cls)}


@dataclass
class DPSGDOptions(MethodOptions):
    """Sites that train with Poisson-sampled (DP-)SGD and Adam."""

    lr: float = 1e-3
    weight_decay: float = 1e-4
    dp_backend: str = "auto"

    def validate(self, run: Any) -> None:
        super().validate(run)
        positive("lr", self.lr)
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ConfigError(f"weight_decay must be a finite non-negative number, got {self.weight_decay}")
        choice("dp_backend", self.dp_backend, DP_BACKENDS)


@dataclass
class SharedModelOptions(DPSGDOptions):
    """A model that leaves the site (ProxyFL's proxy, FedAvg's global model)."""

    proxy_model: str = "mlp"
    optimizer_state: str = "reset"  # Adam's moments when received weights replace the shared model

    def validate(self, run: Any) -> None:
        super().validate(run)
        check_model(self.proxy_model)
        choice("optimizer_state", self.optimizer_state, OPTIMIZER_STATE)


@dataclass
class PrivateModelOptions(MethodOptions):
    """A model that never leaves the site, one architecture for all sites or one each."""

    private_model: str = "lenet5"
    private_models: list[str] | None = None

    def validate(self, run: Any) -> None:
        super().validate(run)
        for name in [self.private_model, *(self.private_models or [])]:
            check_model(name)
        if self.private_models is not None and len(self.private_models) != run.clients:
            raise ConfigError(f"private_models lists {len(self.private_models)} architectures for {run.clients} clients")

    def private_model_of(self, client: int) -> str:
        """The private architecture of ``client``."""
        return self.private_models[client] if self.private_models else self.private_model


@dataclass
class MutualLearningOptions(PrivateModelOptions):
    """Deep mutual learning between the private model (KL weight α) and the shared one (β)."""

    dml_alpha: float = 0.5
    dml_beta: float | None = None  # default: 0 in strict mode, 0.5 in paper mode

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
            raise ConfigError("privacy 'strict' needs dml_beta = 0 (the proxy may learn only from labels under DP-SGD); "
                              "use privacy 'paper' for dml_beta > 0")


@dataclass
class GossipOptions(MethodOptions):
    """PushSum gossip on a time-varying directed graph."""

    graph: str = "exponential"
    self_weight: float = 0.0

    def validate(self, run: Any) -> None:
        super().validate(run)
        choice("graph", self.graph, GRAPHS)
        unit_interval("self_weight", self.self_weight)
        if self.self_weight == 1.0:
            raise ConfigError("self_weight 1 would never use a received proxy; use a value in [0, 1)")


@dataclass
class AveragingOptions(MethodOptions):
    """A server averaging the sites' shared models."""

    aggregation: str = "size"  # weight sites by data size, or uniformly

    def validate(self, run: Any) -> None:
        super().validate(run)
        choice("aggregation", self.aggregation, AGGREGATIONS)


def check_model(name: str) -> None:
    """Raise ConfigError unless ``name`` is a known architecture."""
    from silofl.models import MODEL_NAMES

    if name not in MODEL_NAMES:
        raise ConfigError(f"unknown model {name!r}; available models: {', '.join(MODEL_NAMES)}")
