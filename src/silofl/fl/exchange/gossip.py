"""Gossip with PushSum on a time-varying directed graph (ProxyFL, Algorithm 1; AvgPush).

Each round every active site trains, then sends its shared model and a PushSum weight to the round's
out-neighbours; the coordinator only routes the packets (it never reads them); each site mixes what it
receives (:func:`silofl.topology.combine`). With self-weight 0 and one in-neighbour the received model
replaces the local one (the paper's setting); 0.5 gives push-sum averaging.

When the engine loses a site, the senders take back the PushSum mass they sent it last round, so every
de-biased model stays a weighted average of live sites' models (without acknowledgements a lost
message's mass can only be estimated: a site that received nothing keeps its own model with weight 1).
"""

from __future__ import annotations

import logging

import torch

from silofl.comm.messages import Message, Packet
from silofl.core.errors import PeerModelRejected
from silofl.fl.coordinator import Coordinator, RoundEvents
from silofl.site.dpsgd import DPSGDSite
from silofl.topology import combine, share

log = logging.getLogger("silofl")

PUSHSUM_KEY = "__pushsum_weight__"


class GossipSite(DPSGDSite):
    """A DP-SGD site that gossips its shared model with PushSum de-bias weights."""

    def __init__(self, *args, self_weight: float = 0.0, max_weight: float = float("inf"), **kwargs):
        super().__init__(*args, **kwargs)
        self.self_weight = self_weight
        self.max_weight = max_weight  # PushSum conserves the total weight: no share exceeds the number of sites
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

    def extra_metrics(self) -> dict:
        return {"pushsum_weight": self.pushsum_weight}

    # ------------------------------------------------------------------ steps
    def on_train_send(self, msg: Message) -> Message:
        """Train one round, then send the shared model to this round's out-neighbours ``to``."""
        rnd = int(msg.meta["round"])
        self.train(rnd)
        return Message(packets=[Packet(self.cid, d, data) for d, data in self.outgoing(rnd, list(msg.meta["to"])).items()])

    def on_receive(self, msg: Message) -> Message:
        """Mix the received models; report the ones refused."""
        return Message({"rejected": self.incoming(int(msg.meta["round"]), msg.packets)})

    def on_reclaim(self, msg: Message) -> Message:
        """Take back the mass sent last round to sites since lost."""
        self.reclaim(set(msg.meta["lost"]), int(msg.meta["round"]))
        return Message()

    # ------------------------------------------------------------------ PushSum
    def outgoing(self, rnd: int, out_neighbors: list[int]) -> dict[int, bytes]:
        """{destination: payload} of this round (the same bytes to each)."""
        self._kept_weight, each = share(self.pushsum_weight, self.self_weight, len(out_neighbors))
        if not out_neighbors:
            self._sent = None
            return {}
        self._sent = (self.shared_state(), each, set(out_neighbors))
        data = self.payload(rnd, {PUSHSUM_KEY: torch.tensor(each, dtype=torch.float64)})
        return {d: data for d in out_neighbors}

    def reclaim(self, lost: set[int], rnd: int) -> None:
        """Take back the PushSum mass sent last round to nodes since lost (the mass never entered a live
        site), so that the live sites' total weight stays what it was."""
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

    def incoming(self, rnd: int, packets: list[Packet]) -> list[dict]:
        """Validate and mix the received (model, weight) pairs; the refused ones as records."""
        own = self.shared_state()
        received, rejected = [], []
        for p in packets:
            try:
                tensors, extras, _ = self.read(p, (PUSHSUM_KEY,), rnd)
                if extras[PUSHSUM_KEY] > self.max_weight:
                    raise PeerModelRejected(f"PushSum weight {extras[PUSHSUM_KEY]:.3g} exceeds the total weight "
                                            f"{self.max_weight:g} of all sites")
                received.append((tensors, extras[PUSHSUM_KEY]))
            except PeerModelRejected as e:
                rejected.append(self.reject(rnd, p, e))
        new_state, weight = combine(own, self._kept_weight, received)
        if received:
            try:
                self.probe(new_state)  # the mix of valid models is valid; checked anyway before it is used
            except PeerModelRejected as e:
                rejected += [self.reject(rnd, p, e) for p in packets]
                received = []
                new_state, weight = combine(own, self._kept_weight, received)
        self.pushsum_weight = weight
        if received:
            self.replace_shared(new_state)
        elif self._kept_weight == 0.0:  # combine gave it back its own model with weight 1
            self._sent = None  # so nothing more to take back from this round
            log.warning("client %d received no usable model in round %d and keeps its own", self.cid, rnd)
        return rejected


class Gossip(Coordinator):
    """One round: retire, train, push shared models along the graph, mix."""

    def __init__(self, cfg, n_sites: int, graph):
        super().__init__(cfg, n_sites)
        self.graph = graph

    def run_round(self, rnd: int) -> RoundEvents:
        events = RoundEvents()
        active = self.retire(rnd, events)
        edges = self.graph.out_neighbors(rnd, active)
        sent = self.call("train_send", {k: Message({"round": rnd, "to": edges[k]}) for k in active})
        inbox: dict[int, list[Packet]] = {k: [] for k in active}
        for k in sorted(sent):
            for p in self.routable(rnd, k, sent, set(edges[k]) & set(inbox), events):
                inbox[p.dst].append(p)
        received = self.call("receive", {k: Message({"round": rnd}, sorted(inbox[k], key=lambda p: p.src))
                                         for k in active})
        for r in received.values():
            events.rejected += r.meta.get("rejected", [])
        return events

    def on_lost(self, nodes: set[int], rnd: int) -> None:
        self.call("reclaim", {k: Message({"round": rnd, "lost": sorted(nodes)}) for k in self.active})
