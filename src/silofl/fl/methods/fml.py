"""FML, Federated Mutual Learning (Shen et al.): a private model and a shared "meme" per site.

Local training is the same deep mutual learning as ProxyFL (private loss with α, meme loss with β,
DP-SGD on the meme), but the memes are averaged by a central server, as in FedAvg, instead of
gossiped. ``proxy_acc`` is the meme's accuracy (after averaging all sites hold the same one),
``private_acc`` the private model's — the method is judged by the private models.

With ``--secure-aggregation`` the server sees only the sum of the memes' moves
(:mod:`silofl.fl.exchange.secure_average`). With ``noise_placement: pooled``
(:mod:`silofl.fl.exchange.pooled`) it decodes only the noisy sum of the sites' clipped full-batch gradients
of the meme at the received one, and the meme is pooled FedAvg's, its ε pooled FedAvg's per threat. That
needs each example's term of the meme's loss to depend on that example alone, so the meme learns from the
labels only: ``dml_beta`` 0 (the default under pooled noise; another is refused) — the KL to the private
model, trained without DP on every row, would couple the examples, which pooled noise's sensitivity does not
cover. The private model still takes its round of mutual learning against the received meme at the site
(:meth:`~silofl.fl.exchange.pooled.PooledSite.local_round`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from silofl.core.errors import ConfigError
from silofl.fl.exchange.secure_average import SecureAveragingOptions
from silofl.fl.methods.common import ServerAveraged, spec
from silofl.fl.options import AveragingOptions, MethodOptions, MutualLearningOptions, SharedModelOptions
from silofl.fl.registry import register


@dataclass
class FMLOptions(SecureAveragingOptions, AveragingOptions, MutualLearningOptions, SharedModelOptions):
    """FML: a private model, a DP meme, mutual learning, server averaging."""

    supports_pooled = True  # the meme takes pooled noise when it learns from the labels alone (module doc)

    def resolve(self, run: Any) -> MethodOptions:
        if self.noise_placement == "pooled" and self.dml_beta is None:  # the meme learns from labels only
            return dataclasses.replace(self, dml_beta=0.0).resolve(run)
        return super().resolve(run)

    def validate_pooled(self, run: Any) -> None:
        super().validate_pooled(run)
        if self.dml_beta:
            raise ConfigError(
                "noise_placement pooled clips each example's gradient of the meme's own loss: dml_beta must "
                "be 0 (a KL to the private model, trained on every row, makes each example's term depend on "
                "the others)"
            )


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
