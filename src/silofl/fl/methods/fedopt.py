"""FedOpt for example-level FedAvg (Reddi et al., "Adaptive Federated Optimization", ICLR 2021): FedAdam and
FedYogi server steps on the average of the sites' DP models.

The sites are FedAvg's (DP-SGD, upload, replace by the broadcast). The server takes the average Δ̄ of the
uploads minus its current global model w as a pseudo-gradient and steps with Adam or Yogi
(:class:`~silofl.training.server_opt.FedAdam`, :class:`~silofl.training.server_opt.FedYogi`): m ← β₁m +
(1−β₁)Δ̄; Adam u ← β₂u + (1−β₂)Δ̄², Yogi u ← u − (1−β₂)Δ̄²·sign(u − Δ̄²); w ← w + η·m/(√u + τ). The server
sees only the sites' DP uploads, so its optimizer is post-processing: ε is FedAvg's, per site.

With ``--secure-aggregation`` the server sees only the sum of the sites' moves
(:mod:`silofl.fl.exchange.secure_average`), and with ``noise_placement: pooled`` only the noisy sum of their
clipped full-batch gradients (:mod:`silofl.fl.exchange.pooled`): the pseudo-gradient Δ̄ is then the pooled
DP-GD step −lr·(ĝ/N + weight_decay·w) and Adam/Yogi step on it — post-processing of the decoded sum, so ε is
pooled FedAvg's, per threat.

Two registrations, ``fedavg-adam`` and ``fedavg-yogi`` (``fedadam`` names the client-level non-DP upper
bound);
options ``server_lr`` η (default 0.03), ``adam_beta1``, ``adam_beta2``, ``server_tau`` τ, ``bias_correction``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from silofl.core.errors import ConfigError
from silofl.fl.exchange.secure_average import SecureAveragingOptions
from silofl.fl.methods.common import ServerAveraged
from silofl.fl.options import (
    AveragingOptions,
    MethodOptions,
    SharedModelOptions,
    option,
    positive,
    unit_interval,
)
from silofl.fl.registry import register

DEFAULT_SERVER_LR = 0.03  # as client-level FedAdam's (dp-fedadam)


@dataclass
class FedOptOptions(SecureAveragingOptions, AveragingOptions, SharedModelOptions):
    """FedAvg's sites with an adaptive server optimizer (FedAdam / FedYogi)."""

    supports_pooled = True  # the optimizer steps on the pooled step: post-processing of the decoded sum

    adam_beta1: float = option(0.9, "Adaptive server optimizers: β1.")
    adam_beta2: float = option(
        0.99, "Adaptive server optimizers: β2 (DP²-RMSProp: the preconditioner's decay)."
    )
    server_tau: float = option(1e-3, "Adaptive server optimizers: the adaptivity τ.")  # adaptivity τ
    bias_correction: bool = option(False, "FedAdam: Adam's bias correction.")

    def resolve(self, run: Any) -> MethodOptions:
        if self.server_lr is None:
            return dataclasses.replace(self, server_lr=DEFAULT_SERVER_LR).resolve(run)
        return super().resolve(run)

    def validate(self, run: Any) -> None:
        super().validate(run)
        if self.server_momentum != 0.0:
            raise ConfigError(
                "server_momentum is FedAvgM's; the adaptive server optimizers have their own first "
                "moment: set adam_beta1 instead"
            )
        for name in ("adam_beta1", "adam_beta2"):
            unit_interval(name, getattr(self, name), open_hi=True)
        positive("server_tau", self.server_tau)


class FedOpt(ServerAveraged):
    """FedAvg's sites, a server stepping with :attr:`server_optimizer` on the average of their DP models (or
    on the pooled DP-GD step)."""

    opts: FedOptOptions


@register(
    "fedavg-adam",
    options=FedOptOptions,
    headline="global_acc",
    exchange="server",
    metrics=("global_acc",),
    description="FedAvg's DP sites, FedAdam's server step on the average of their models",
)
class FedAvgAdam(FedOpt):
    server_optimizer = "fedadam"


@register(
    "fedavg-yogi",
    options=FedOptOptions,
    headline="global_acc",
    exchange="server",
    metrics=("global_acc",),
    description="FedAvg's DP sites, FedYogi's server step on the average of their models",
)
class FedAvgYogi(FedOpt):
    server_optimizer = "fedyogi"
