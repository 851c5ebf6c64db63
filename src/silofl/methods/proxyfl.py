"""ProxyFL (Kalra et al., "Decentralized federated learning through proxy model sharing"), Algorithm 1.

Per client: a private model f (any architecture, never leaves the site) and a proxy h (shared
architecture), trained by deep mutual learning (:class:`~silofl.methods.client.SiteClient`).
Then the proxy and its PushSum weight go to the round's out-neighbours; received proxies are
mixed with PushSum (self-weight 0: the received proxy replaces the local one).

KL(f‖h) follows the paper's notation and the published code: the model being trained is
distilled toward the other model's (detached) output distribution, Σ p_h (log p_h − log p_f).

Privacy modes: ``strict`` (β = 0, default) — the proxy's per-example gradient depends only on the
example and its label, so DP-SGD's guarantee holds for the proxy and everything derived from it;
``paper`` (α = β = 0.5) — the proxy also distils from the private model, which is a non-private
function of the whole local data set, so the reported ε is *not* a formal guarantee; ``off``.

Proxy optimizer state when the weights are replaced: ``reset`` (default) clears Adam's moments;
``keep`` keeps them, as the published code does. At the paper's settings ``reset`` measured higher
private and proxy accuracy on every seed (docs/proxyfl.md); the moments are post-processing of DP
gradients either way, so the choice has no privacy cost.
"""

from __future__ import annotations

import logging

import torch

from silofl.errors import PeerModelRejected
from silofl.methods.base import Protocol, RoundEvents, sites
from silofl.methods.client import SiteClient, dml_loss
from silofl.runtime.transport import Envelope, Transport
from silofl.topology import combine, share
from silofl.topology.graphs import in_neighbors

log = logging.getLogger("silofl")

PUSHSUM_KEY = "__pushsum_weight__"

__all__ = ["PUSHSUM_KEY", "Gossip", "ProxyFL", "ProxyFLClient", "PushSumClient", "dml_loss"]


class PushSumClient(SiteClient):
    """A site that gossips its shared model with PushSum de-bias weights (ProxyFL, AvgPush)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pushsum_weight = 1.0
        self._kept_weight = 1.0
        self._sent: tuple[dict[str, torch.Tensor], float, set[int]] | None = None  # last round's (θ, w each, to)

    def state_dict(self) -> dict:
        sent = None if self._sent is None else {"theta": self._sent[0], "each": self._sent[1], "to": sorted(self._sent[2])}
        return {**super().state_dict(), "pushsum_weight": self.pushsum_weight, "kept_weight": self._kept_weight,
                "sent": sent}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.pushsum_weight, self._kept_weight = float(state["pushsum_weight"]), float(state["kept_weight"])
        sent = state.get("sent")
        self._sent = None if sent is None else (sent["theta"], float(sent["each"]), set(sent["to"]))

    def outgoing(self, rnd: int, out_neighbors: list[int]) -> dict[int, bytes]:
        self._kept_weight, each = share(self.pushsum_weight, self.cfg.self_weight, len(out_neighbors))
        if not out_neighbors:
            self._sent = None
            return {}
        self._sent = (self.shared_state(), each, set(out_neighbors))
        data = self.payload(rnd, {PUSHSUM_KEY: torch.tensor(each, dtype=torch.float64)})
        return {d: data for d in out_neighbors}

    def reclaim(self, lost: set[int], rnd: int) -> None:
        """Take back the PushSum mass sent last round to nodes since lost (their process crashed or hung,
        so the mass never entered a live client), so that the live clients' total weight stays what it
        was. Every de-biased proxy stays a weighted average of live clients' proxies either way. (A client
        that received nothing that round already kept its own proxy with weight 1 and takes nothing back;
        without acknowledgements a lost message's mass can only be estimated, not tracked exactly.)"""
        if self._sent is None:
            return
        theta, each, to = self._sent
        gone = to & lost
        if not gone:
            return
        self._sent = (theta, each, to - gone)
        own = self.shared_state()
        theta = {k: theta[k].to(v.device) for k, v in own.items()}
        new_state, self.pushsum_weight = combine(own, self.pushsum_weight, [(theta, each * len(gone))])
        self.replace_shared(new_state)
        log.info("client %d took back the PushSum mass (weight %.4g) sent to lost node(s) %s before round %d",
                 self.cid, each * len(gone), sorted(gone), rnd)

    def incoming(self, rnd: int, envelopes: list[Envelope]) -> list[dict]:
        own = self.shared_state()
        received, rejected = [], []
        for env in envelopes:
            try:
                tensors, extras, _ = self.read(env, (PUSHSUM_KEY,))
                received.append((tensors, extras[PUSHSUM_KEY]))
            except PeerModelRejected as e:
                rejected.append(self.reject(rnd, env, e))
        new_state, self.pushsum_weight = combine(own, self._kept_weight, received)
        if received:
            self.replace_shared(new_state)
        elif self._kept_weight == 0.0:  # combine gave it back its own proxy with weight 1
            self._sent = None  # so nothing more to take back from this round

            log.warning("client %d received no usable model in round %d and keeps its own", self.cid, rnd)
        return rejected


class ProxyFLClient(PushSumClient):
    """A PushSum site with a private model and a proxy (kept for the published name)."""

    @property
    def proxy(self):
        return self.shared


class Gossip(Protocol):
    """One round: leave if the budget is spent, train, push shared models along the graph, mix
    (ProxyFL's exchange; AvgPush runs it on clients without private models)."""

    def __init__(self, clients: list[PushSumClient], transport: Transport, graph):
        super().__init__(clients, transport)
        self.graph = graph

    def run_round(self, rnd: int) -> RoundEvents:
        events = RoundEvents()
        active = self.retire_spent(rnd, events)
        mine = self.local(active)
        for c in mine:
            c.train_round(rnd)
        edges = self.graph.out_neighbors(rnd, [c.cid for c in active])
        senders = in_neighbors(edges)
        for c in mine:
            for dst, data in c.outgoing(rnd, edges[c.cid]).items():
                self.transport.send(c.cid, dst, data)
        for c in mine:
            events.rejected += c.incoming(rnd, self.transport.receive(c.cid, senders.get(c.cid, [])))
        return events

    def on_lost(self, nodes: set[int], rnd: int) -> None:
        for c in self.local(self.clients):
            if c.active:
                c.reclaim(nodes, rnd)

    def extra_metrics(self, client) -> dict:
        return {"pushsum_weight": client.pushsum_weight}


ProxyFL = Gossip  # the published name of the protocol


def build(cfg, data, parts, transport: Transport) -> Gossip:
    from silofl.models import ModelSpec
    from silofl.topology import make_graph

    proxy_spec = ModelSpec(cfg.proxy_model, data.input_shape, data.num_classes)
    clients = sites(parts, transport, lambda k, x, y: ProxyFLClient(
        k, x, y, proxy_spec, cfg, private_spec=ModelSpec(cfg.private_model_of(k), data.input_shape, data.num_classes)))
    return Gossip(clients, transport, make_graph(cfg.graph))
