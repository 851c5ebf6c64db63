"""FedBN (Li et al., "FedBN: Federated Learning on Non-IID Features via Local Batch Normalization", ICLR
2021) with example-level DP: every site keeps its **normalisation layers**, everything else is averaged as
in FedAvg.

Every site trains its whole model (``proxy_model``, default ``cnn-gn``: a small CNN with GroupNorm) with
DP-SGD, as FedAvg does, then uploads every tensor **except** those of its normalisation layers
(:func:`norm_keys`); the server averages what was sent (:mod:`silofl.fl.exchange.centralized` with
``shared_keys``) and broadcasts the average, which each site loads under its own normalisation parameters.
Those never leave the site.

**GroupNorm, not BatchNorm, under DP.** BatchNorm normalises an example by statistics of its whole batch,
so one example's output — and its gradient — depends on the other examples: per-example clipping no longer
bounds one example's influence (and its running statistics are un-noised functions of the data). The DP
variant of FedBN keeps GroupNorm's affine parameters (γ, β per channel) private instead: GroupNorm
normalises each example over its own channels. A DP run with a BatchNorm model is refused with a one-line
error naming ``cnn-gn``; without DP (``--privacy off``) BatchNorm layers (weights and running statistics)
stay at the site as in the paper.

**Why the private normalisation parameters are trained with DP too.** They never leave the site, but the
body's gradient flows through them: the body's DP-SGD step is Σ_i clip(∇_θ ℓ(θ, γ; x_i)) + N(0, σ²C²). If
γ were trained without DP, γ = γ(D) would be a function of the whole local data set, and replacing one
example would change every term of that sum through γ(D) — the sum's sensitivity would no longer be C and
the accountant's ε would be wrong (the reason ProxyFL's ``paper`` mode is no formal guarantee). With γ
inside the DP model every step is one DP-SGD step on one model (the clip bounds the whole per-example
gradient, γ's part included): adaptive composition over the steps gives the accountant's ε for everything
the site computes from its data, and keeping some coordinates at the site while sending the others is
post-processing. So ε is exactly FedAvg's for the steps that ran, and the site's personalised model
(shared layers + its own normalisation, ``private_acc``) is a DP model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from silofl.core.errors import ConfigError
from silofl.fl.methods.fedper import SharedKeysMethod
from silofl.fl.options import AveragingOptions, SharedModelOptions
from silofl.fl.registry import register
from silofl.models import ModelSpec

NORM_LAYERS = (
    nn.modules.batchnorm._BatchNorm,
    nn.GroupNorm,
    nn.LayerNorm,
    nn.modules.instancenorm._InstanceNorm,
)
GN_MODEL = "cnn-gn"  # the registered GroupNorm variant a DP run is pointed to


def norm_keys(model: nn.Module) -> tuple[str, ...]:
    """The state-dict keys of a model's normalisation layers (their affine parameters and, for BatchNorm,
    running statistics): what FedBN keeps at each site."""
    prefixes = [name + "." for name, m in model.named_modules() if isinstance(m, NORM_LAYERS) and name]
    return tuple(k for k in model.state_dict() if any(k.startswith(p) for p in prefixes))


def shared_keys(model: nn.Module, name: str, private: bool) -> tuple[str, ...]:
    """The keys FedBN averages (everything but the normalisation layers) of ``model`` (architecture ``name``);
    ConfigError for a BatchNorm model under DP, a model without normalisation layers, or one that is nothing
    else."""
    if private and any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        raise ConfigError(
            f"FedBN under DP needs GroupNorm: {name!r} has BatchNorm layers, whose batch statistics break "
            f"per-example clipping; use the GroupNorm variant (--proxy-model {GN_MODEL})"
        )
    own = set(norm_keys(model))
    if not own:
        raise ConfigError(
            f"FedBN keeps a model's normalisation layers at each site; {name!r} has none: "
            f"use --proxy-model {GN_MODEL} (GroupNorm)"
        )
    rest = tuple(k for k in model.state_dict() if k not in own)
    if not rest:
        raise ConfigError(f"FedBN shares everything but the normalisation layers; {name!r} has nothing else")
    return rest


def fedbn_keys(s: ModelSpec, private: bool) -> tuple[str, ...]:
    """:func:`shared_keys` of architecture ``s`` (built without drawing from the run's random streams)."""
    with torch.random.fork_rng(devices=[]):
        model = s.build()
    return shared_keys(model, s.name, private)


@dataclass
class FedBNOptions(AveragingOptions, SharedModelOptions):
    """FedBN: one DP model per site; everything but the normalisation layers is averaged by a server."""

    proxy_model: str = field(
        default=GN_MODEL,
        metadata={"help": "The model's architecture; FedBN needs normalisation layers (GroupNorm under DP)."},
    )

    def validate(self, run: Any) -> None:
        super().validate(run)
        check_layout(self.proxy_model, bool(getattr(run, "is_private", True)))


def check_layout(name: str, private: bool) -> None:
    """:func:`shared_keys`' refusals before any data is read (a comparison fails before anything runs), on
    :func:`stand_in` ``name``."""
    model = stand_in(name)
    if model is not None:
        shared_keys(model, name, private)


def stand_in(name: str) -> nn.Module | None:
    """Architecture ``name`` built for a stand-in input of its kind (to read its layers before the data is
    loaded), drawing nothing from the run's random streams; None where only the data's own shape can build
    it."""
    from silofl.models import MODELS, build_model

    inputs = MODELS.entry(name).meta.get("inputs", "any")
    if inputs == "bags":
        return None
    try:
        with torch.random.fork_rng(devices=[]):
            return build_model(name, (16,) if inputs == "rows" else (1, 32, 32), 2)
    except (ConfigError, ValueError, RuntimeError):  # not buildable for a stand-in: the data decides later
        return None


@register(
    "fedbn",
    options=FedBNOptions,
    headline="private_acc",
    exchange="server",
    metrics=("private_acc",),
    description="one DP model per client; the server averages all but the normalisation layers (GroupNorm), "
    "which each client keeps",
)
class FedBN(SharedKeysMethod):
    opts: FedBNOptions

    def shared_keys(self, s: ModelSpec) -> tuple[str, ...]:
        """All but the normalisation layers (and, without DP, BatchNorm's running statistics)."""
        return fedbn_keys(s, self.plan.config.is_private)
