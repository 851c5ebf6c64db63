"""FedAvg (McMahan et al.) with example-level DP-SGD at every site.

Each round every active site trains the shared model on its local data with DP-SGD (one epoch of
Poisson batches), uploads it with its aggregation weight (its data size, or 1 with
``aggregation: uniform``), the server averages and broadcasts, and every site replaces its copy
(:mod:`silofl.fl.exchange.centralized`). The accuracy reported is the *aggregated* model's
(``global_acc``).
"""

from __future__ import annotations

from dataclasses import dataclass

from silofl.fl.coordinator import Method
from silofl.fl.exchange.centralized import Centralized, CentralSite
from silofl.fl.exchange.pooled import PooledCentralized, PooledSite, pooled_settings
from silofl.fl.exchange.secure_average import SecureAveragingOptions, SecureCentralized, SecureCentralSite
from silofl.fl.methods.common import dpsgd_settings, spec
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
class FedAvg(Method):
    opts: FedAvgOptions

    def make_site(self, k, x, y, data):
        if self.opts.noise_placement == "pooled":
            site = PooledSite(
                k,
                x,
                y,
                spec(self.opts.proxy_model, data),
                dpsgd_settings(self.plan, k),
                shared_field="global",
            )
            site.enable_pooled(pooled_settings(self.opts, self.plan), self.plan.seed)
            return site
        secure = self.opts.secure_average(self.plan)
        site = (SecureCentralSite if secure is not None else CentralSite)(
            k, x, y, spec(self.opts.proxy_model, data), dpsgd_settings(self.plan, k), shared_field="global"
        )
        if secure is not None:
            site.enable_secure(secure, self.plan.seed)
        return site

    def make_coordinator(self, n_sites, data, device):
        args = (self.plan, n_sites, spec(self.opts.proxy_model, data), device)
        uniform = self.opts.aggregation == "uniform"
        if self.opts.noise_placement == "pooled":  # the server decodes only the noisy gradient sum
            return PooledCentralized(*args, pooled_settings(self.opts, self.plan), uniform=uniform)
        secure = self.opts.secure_average(self.plan)
        if secure is not None:  # the server sees only the sum (silofl.fl.exchange.secure_average)
            return SecureCentralized(*args, secure, uniform=uniform)
        return Centralized(*args, uniform=uniform)
