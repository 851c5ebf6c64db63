"""FML, Federated Mutual Learning (Shen et al.): a private model and a shared "meme" per site.

Local training is the same deep mutual learning as ProxyFL (private loss with α, meme loss with β,
DP-SGD on the meme), but the memes are averaged by a central server, as in FedAvg, instead of
gossiped. ``proxy_acc`` is the meme's accuracy (after averaging all sites hold the same one),
``private_acc`` the private model's — the method is judged by the private models.
"""

from __future__ import annotations

from dataclasses import dataclass

from silofl.fl.coordinator import Method
from silofl.fl.exchange.centralized import Centralized, CentralSite
from silofl.fl.exchange.secure_average import SecureAveragingOptions, SecureCentralized, SecureCentralSite
from silofl.fl.methods.common import dpsgd_settings, spec
from silofl.fl.options import AveragingOptions, MutualLearningOptions, SharedModelOptions
from silofl.fl.registry import register


@dataclass
class FMLOptions(SecureAveragingOptions, AveragingOptions, MutualLearningOptions, SharedModelOptions):
    """FML: a private model, a DP meme, mutual learning, server averaging."""


@register(
    "fml",
    options=FMLOptions,
    headline="private_acc",
    exchange="server",
    mutual_learning=True,
    metrics=("private_acc", "proxy_acc"),
    description="private + DP meme per client, memes averaged by a central server",
)
class FML(Method):
    opts: FMLOptions

    def make_site(self, k, x, y, data):
        o = self.opts
        secure = o.secure_average(self.plan)
        site = (SecureCentralSite if secure is not None else CentralSite)(
            k,
            x,
            y,
            spec(o.proxy_model, data),
            dpsgd_settings(self.plan, k),
            private_spec=spec(o.private_model_of(k), data),
            shared_field="proxy",
        )
        if secure is not None:
            site.enable_secure(secure, self.plan.seed)
        return site

    def make_coordinator(self, n_sites, data, device):
        args = (self.plan, n_sites, spec(self.opts.proxy_model, data), device)
        uniform = self.opts.aggregation == "uniform"
        secure = self.opts.secure_average(self.plan)
        if secure is not None:  # the memes' sum only (silofl.fl.exchange.secure_average)
            return SecureCentralized(*args, secure, uniform=uniform)
        return Centralized(*args, uniform=uniform)
