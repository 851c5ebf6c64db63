"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020) with example-level
DP-SGD.

FedAvg's round (:mod:`silofl.fl.exchange.centralized`: train, upload, average, broadcast, replace) with a
proximal term in every site's local objective, F_k(w) + (μ/2)·‖w − w_g‖², w_g the global model the site
received (its weights when the round's training starts). Its gradient μ·(w − w_g) is added to the shared
model's gradient after DP-SGD has clipped and noised the data term, before the optimizer steps
(:meth:`~silofl.site.dpsgd.DPSGDSite.shared_grad_hook`): it depends on no example, only on the current iterate
and the received global — itself a DP release — so it is post-processing of the DP gradient. The mechanism,
its accountant and ε are exactly FedAvg's; ``mu`` 0 is FedAvg. The server's ``server_lr``/``server_momentum``
apply as for FedAvg.

With ``--secure-aggregation`` the server sees only the sum of the sites' moves
(:mod:`silofl.fl.exchange.secure_average`). With ``noise_placement: pooled``
(:mod:`silofl.fl.exchange.pooled`) each site clips and sums its examples' gradients of the data term only —
the proximal term is not clipped, as without pooling: it depends on no example — and a round is one
full-batch gradient at the received global model w_g, where the proximal gradient μ·(w_g − w_g) is zero: a
pooled FedProx round is exactly a pooled FedAvg round (``mu`` has no effect; the test checks it bit for bit),
and its ε is pooled FedAvg's, per threat.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from silofl.core.errors import ConfigError
from silofl.fl.exchange.centralized import CentralSite
from silofl.fl.exchange.pooled import PooledSite
from silofl.fl.exchange.secure_average import SecureAveragingOptions, SecureCentralSite
from silofl.fl.methods.common import ServerAveraged, SiteClasses
from silofl.fl.options import AveragingOptions, SharedModelOptions, option
from silofl.fl.registry import register


def non_negative(name: str, value: float) -> None:
    """Raise ConfigError unless ``value`` is a finite number ≥ 0."""
    if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
        raise ConfigError(f"{name} must be a finite non-negative number, got {value}")


def proximal_hook(
    params: list[torch.nn.Parameter], anchor: list[torch.Tensor], weight: float
) -> Callable[[], None]:
    """A ``grad_hook`` adding ``weight``·(p − anchor) to every ``p.grad``: the gradient of (weight/2)·‖p −
    anchor‖²."""

    def hook() -> None:
        with torch.no_grad():
            for p, a in zip(params, anchor, strict=True):
                pull = (p.detach() - a).mul_(weight)
                if p.grad is None:
                    p.grad = pull
                else:
                    p.grad.add_(pull)

    return hook


def snapshot(model: torch.nn.Module) -> tuple[list[torch.nn.Parameter], list[torch.Tensor]]:
    """A model's trainable parameters and a detached copy of their current values."""
    params = [p for p in model.parameters() if p.requires_grad]
    return params, [p.detach().clone() for p in params]


@dataclass
class FedProxOptions(SecureAveragingOptions, AveragingOptions, SharedModelOptions):
    """FedProx: FedAvg with a proximal term μ/2·‖w − w_global‖² in the sites' local objective."""

    supports_pooled = True  # a pooled round is pooled FedAvg's (module doc)

    mu: float = option(0.01, "FedProx: the proximal weight μ of μ/2·‖w − w_global‖² (0: FedAvg).")

    def validate(self, run: Any) -> None:
        super().validate(run)
        non_negative("mu", self.mu)


class ProxSite(CentralSite):
    """A FedAvg site whose local steps are pulled towards the model it received (see the module doc)."""

    def __init__(self, *args: Any, mu: float = 0.0, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.mu = float(mu)

    def shared_grad_hook(self) -> Callable[[], None] | None:
        if self.mu == 0.0:
            return None
        params, anchor = snapshot(self.shared)  # the received global model: this round's start
        return proximal_hook(params, anchor, self.mu)


class SecureProxSite(ProxSite, SecureCentralSite):
    """A FedProx site uploading only the masked encoding of its move (secure aggregation)."""


class PooledProxSite(ProxSite, PooledSite):
    """A FedProx site taking pooled noise (module doc: its round is pooled FedAvg's)."""


@register(
    "fedprox",
    options=FedProxOptions,
    headline="global_acc",
    exchange="server",
    metrics=("global_acc",),
    description="FedAvg with a proximal term μ/2·‖w − w_global‖² in the local DP-SGD objective",
)
class FedProx(ServerAveraged):
    opts: FedProxOptions
    sites = SiteClasses(ProxSite, SecureProxSite, PooledProxSite)

    def make_site(self, k, x, y, data):
        return self.averaging_site(k, x, y, data, mu=self.opts.mu)
