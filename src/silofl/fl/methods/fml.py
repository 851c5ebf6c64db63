"""FML, Federated Mutual Learning (Shen et al.): a private model and a shared "meme" per site.

Local training is the same deep mutual learning as ProxyFL (private loss with α, meme loss with β,
DP-SGD on the meme), but the memes are averaged by a central server, as in FedAvg, instead of
gossiped. ``proxy_acc`` is the meme's accuracy (after averaging all sites hold the same one),
``private_acc`` the private model's — the method is judged by the private models.
"""

from __future__ import annotations

from dataclasses import dataclass

from silofl.fl.exchange.secure_average import SecureAveragingOptions
from silofl.fl.methods.common import ServerAveraged, spec
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
class FML(ServerAveraged):
    opts: FMLOptions
    shared_field = "proxy"

    def make_site(self, k, x, y, data):
        return self.averaging_site(k, x, y, data, private_spec=spec(self.opts.private_model_of(k), data))
