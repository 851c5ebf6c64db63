"""FedAvg (McMahan et al.) with example-level DP-SGD at every site.

Each round every active site trains the shared model on its local data with DP-SGD (one epoch of
Poisson batches), uploads it with its aggregation weight (its data size, or 1 with
``aggregation: uniform``), the server averages and broadcasts, and every site replaces its copy
(:mod:`silofl.fl.exchange.centralized`). The accuracy reported is the *aggregated* model's
(``global_acc``).
"""

from __future__ import annotations

from dataclasses import dataclass

from silofl.fl.exchange.secure_average import SecureAveragingOptions
from silofl.fl.methods.common import ServerAveraged
from silofl.fl.options import AveragingOptions, SharedModelOptions
from silofl.fl.registry import register


@dataclass
class FedAvgOptions(SecureAveragingOptions, AveragingOptions, SharedModelOptions):
    """FedAvg: one DP model averaged by a server (or, ``noise_placement: pooled``, one pooled DP-GD step a
    round through the secure sum: :mod:`silofl.fl.exchange.pooled`)."""

    supports_pooled = True


@register(
    "fedavg",
    options=FedAvgOptions,
    headline="global_acc",
    exchange="server",
    metrics=("global_acc",),
    description="one DP model averaged by a central server",
)
class FedAvg(ServerAveraged):
    """FedAvg's sites and server, per the placement of the noise (:class:`ServerAveraged`)."""

    opts: FedAvgOptions
