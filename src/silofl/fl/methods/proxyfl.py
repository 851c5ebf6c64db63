"""ProxyFL (Kalra et al., "Decentralized federated learning through proxy model sharing"), Algorithm 1.

Per site: a private model f (any architecture, never leaves the site) and a proxy h (one architecture
for all), trained by deep mutual learning (:class:`~silofl.site.dpsgd.DPSGDSite`). Then the proxy and
its PushSum weight go to the round's out-neighbours on the exponential graph and are mixed with
PushSum (:mod:`silofl.fl.exchange.gossip`; self-weight 0: the received proxy replaces the local one).

KL(f‖h) follows the paper's notation and the published code: the model being trained is distilled
toward the other model's (detached) output distribution, Σ p_h (log p_h − log p_f).

Privacy modes (:mod:`silofl.privacy.guarantee`): ``strict`` (β = 0, default) — the proxy's
per-example gradient depends only on the example and its label, so DP-SGD's guarantee holds for the
proxy and everything derived from it; ``paper`` (α = β = 0.5) — the proxy also distils from the
private model, a non-private function of the whole local data set, so the ε is *not* a formal
guarantee; ``off``.

Proxy optimizer state when the weights are replaced: ``reset`` (default) clears Adam's moments;
``keep`` keeps them, as the published code does. At the paper's settings ``reset`` measured higher
private and proxy accuracy on every seed (docs/proxyfl.md); the moments are post-processing of DP
gradients either way, so the choice has no privacy cost.
"""

from __future__ import annotations

from dataclasses import dataclass

from silofl.fl.coordinator import Method
from silofl.fl.exchange.gossip import Gossip, GossipSite
from silofl.fl.methods.common import dpsgd_settings, spec
from silofl.fl.options import GossipOptions, MutualLearningOptions, SharedModelOptions
from silofl.fl.registry import register
from silofl.topology import make_graph


@dataclass
class ProxyFLOptions(GossipOptions, MutualLearningOptions, SharedModelOptions):
    """ProxyFL: a private model, a DP proxy, mutual learning, PushSum gossip."""


@register(
    "proxyfl",
    options=ProxyFLOptions,
    headline="private_acc",
    exchange="gossip",
    mutual_learning=True,
    metrics=("private_acc", "proxy_acc"),
    description="private + DP proxy per client, proxies gossiped with PushSum",
)
class ProxyFL(Method):
    opts: ProxyFLOptions

    def make_site(self, k, x, y, data):
        o = self.opts
        return GossipSite(
            k,
            x,
            y,
            spec(o.proxy_model, data),
            dpsgd_settings(self.plan, k),
            private_spec=spec(o.private_model_of(k), data),
            shared_field="proxy",
            self_weight=o.self_weight,
            max_weight=self.plan.config.clients,
        )

    def make_coordinator(self, n_sites, data, device):
        return Gossip(self.plan, n_sites, make_graph(self.opts.graph))
