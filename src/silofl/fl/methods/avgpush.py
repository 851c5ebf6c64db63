"""AvgPush: FedAvg's single DP model, exchanged peer to peer with PushSum on ProxyFL's graph.

No private model and no server: each site trains the shared model with DP-SGD on cross-entropy, then
sends it with its PushSum weight to the round's out-neighbours and mixes what it receives — exactly
ProxyFL's exchange. Every site holds its own copy, so ``global_acc`` is per site.
"""

from __future__ import annotations

from dataclasses import dataclass

from silofl.fl.coordinator import Method
from silofl.fl.exchange.gossip import Gossip, GossipSite
from silofl.fl.methods.common import dpsgd_settings, spec
from silofl.fl.options import GossipOptions, SharedModelOptions
from silofl.fl.registry import register
from silofl.topology import make_graph


@dataclass
class AvgPushOptions(GossipOptions, SharedModelOptions):
    """AvgPush: one DP model per site, PushSum gossip."""


@register(
    "avgpush",
    options=AvgPushOptions,
    headline="global_acc",
    exchange="gossip",
    metrics=("global_acc",),
    description="one DP model per client, gossiped with PushSum",
)
class AvgPush(Method):
    opts: AvgPushOptions

    def make_site(self, k, x, y, data):
        return GossipSite(
            k,
            x,
            y,
            spec(self.opts.proxy_model, data),
            dpsgd_settings(self.plan, k),
            shared_field="global",
            self_weight=self.opts.self_weight,
            max_weight=self.plan.config.clients,
        )

    def make_coordinator(self, n_sites, data, device):
        return Gossip(self.plan, n_sites, make_graph(self.opts.graph))
