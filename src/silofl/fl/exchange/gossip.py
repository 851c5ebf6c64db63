"""Gossip with PushSum on a time-varying directed graph (ProxyFL, Algorithm 1; AvgPush).

Each round every active site trains, then sends its shared model and a PushSum weight to the round's
out-neighbours; the coordinator only routes the packets (it never reads them); each site mixes what it
receives (:func:`silofl.topology.combine`). With self-weight 0 and one in-neighbour the received model
replaces the local one (the paper's setting); 0.5 gives push-sum averaging.

When the engine loses a site, the senders take back the PushSum mass they sent it last round, so every
de-biased model stays a weighted average of live sites' models (without acknowledgements a lost
message's mass can only be estimated: a site that received nothing keeps its own model with weight 1).

Sites that share a step's wire cache (the simulator's, :func:`silofl.comm.engine.run_here`) compute each
received mass θ_j·w_j once (:func:`mix`); each site still adds them to its own kept mass in its own order
(own first, then by sender), as :func:`silofl.topology.combine` does, so the result is the same bits. One
average for all sites would not be: the sites add the same terms in different orders, float64 addition is
not associative, and on the complete graph with self-weight 1/K their float32 results differ (K = 12 and
48: in up to 0.8 % of a linear proxy's elements).
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
MASS_CACHE_BYTES = 1 << 28  # the received masses kept per step among a process's sites, at most


def mix(
    own: dict[str, torch.Tensor],
    kept_weight: float,
    received: list[tuple[dict[str, torch.Tensor], float]],
    cache: dict | None = None,
) -> tuple[dict[str, torch.Tensor], float]:
    """:func:`silofl.topology.combine`, bit for bit, with each received mass ``θ.double() * w`` computed once
    among the readers that share ``cache`` (a payload's decoded tensors are shared through it,
    :func:`silofl.comm.wire.read_model_shared`), up to :data:`MASS_CACHE_BYTES`. The sums stay each
    reader's: its kept mass first, then the received ones in order, in float64."""
    total = kept_weight + sum(w for _, w in received)
    if cache is None or not received or total <= 0.0:
        return combine(own, kept_weight, received)
    masses = [_mass(cache, params, w) for params, w in received]
    out = {}
    for k, v in own.items():
        acc = v.double() * kept_weight
        for (params, w), m in zip(received, masses, strict=True):
            acc.add_(m[k] if m is not None else params[k].double() * w)
        out[k] = (acc / total).to(v.dtype)
    return out, total


def _mass(cache: dict, params: dict[str, torch.Tensor], w: float) -> dict[str, torch.Tensor] | None:
    """{name: θ.double() * w} of one received model, shared through ``cache``; None past the budget."""
    key = ("pushsum mass", w, tuple((k, id(t)) for k, t in params.items()))
    held = cache.get(key)
    if held is not None and all(a is b for a, b in zip(held[0], params.values(), strict=True)):
        return held[1]
    size = sum(t.numel() for t in params.values()) * 8
    used = cache.get("pushsum mass bytes", 0)
    if used + size > MASS_CACHE_BYTES:
        return None
    masses = {k: t.double() * w for k, t in params.items()}
    cache[key] = (list(params.values()), masses)  # the tensors too: their ids stay theirs while cached
    cache["pushsum mass bytes"] = used + size
    return masses


class GossipSite(DPSGDSite):
    """A DP-SGD site that gossips its shared model with PushSum de-bias weights."""

    def __init__(self, *args, self_weight: float = 0.0, max_weight: float = float("inf"), **kwargs):
        super().__init__(*args, **kwargs)
        self.self_weight = self_weight
        self.max_weight = (
            max_weight  # PushSum conserves the total weight: no share exceeds the number of sites
        )
        self.pushsum_weight = 1.0
        self._kept_weight = 1.0
        # the last two rounds' sends, newest last: (round, θ, w each, to) — a round's deliveries reach their
        # sites with the next round's request (silofl.comm.batch), so a node lost then may not have taken
        # either
        self._sends: list[tuple[int, dict[str, torch.Tensor], float, set[int]]] = []

    def state_dict(self) -> dict:
        sends = [{"round": r, "theta": t, "each": e, "to": sorted(to)} for r, t, e, to in self._sends]
        return {
            **super().state_dict(),
            "pushsum_weight": self.pushsum_weight,
            "kept_weight": self._kept_weight,
            "sends": sends,
        }

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.pushsum_weight, self._kept_weight = float(state["pushsum_weight"]), float(state["kept_weight"])
        sends = state.get("sends")
        if (
            sends is None and state.get("sent") is not None
        ):  # a checkpoint from before the sends were kept per round
            sends = [{"round": -1, **state["sent"]}]
        self._sends = [(int(x["round"]), x["theta"], float(x["each"]), set(x["to"])) for x in sends or []]

    def extra_metrics(self) -> dict:
        return {"pushsum_weight": self.pushsum_weight}

    # ------------------------------------------------------------------ steps
    def on_train_send(self, msg: Message) -> Message:
        """Train one round, then send the shared model to this round's out-neighbours ``to``."""
        rnd = int(msg.meta["round"])
        self.train(rnd)
        return Message(
            packets=[
                Packet(self.cid, d, data) for d, data in self.outgoing(rnd, list(msg.meta["to"])).items()
            ]
        )

    def on_receive(self, msg: Message) -> Message:
        """Mix the received models; report the ones refused."""
        return Message({"rejected": self.incoming(int(msg.meta["round"]), msg.packets)})

    def on_reclaim(self, msg: Message) -> Message:
        """Take back the mass sent to sites since lost (``since``: from which round, per lost site)."""
        since = msg.meta.get("since")
        self.reclaim(
            set(msg.meta["lost"]),
            int(msg.meta["round"]),
            None if since is None else {int(d): int(r) for d, r in dict(since).items()},
        )
        return Message()

    # ------------------------------------------------------------------ PushSum
    def outgoing(self, rnd: int, out_neighbors: list[int]) -> dict[int, bytes]:
        """{destination: payload} of this round (the same bytes to each)."""
        self._kept_weight, each = share(self.pushsum_weight, self.self_weight, len(out_neighbors))
        self._sends = self._sends[-1:]
        if not out_neighbors:
            return {}
        self._sends.append((rnd, self.shared_state(), each, set(out_neighbors)))
        data = self.payload(rnd, {PUSHSUM_KEY: torch.tensor(each, dtype=torch.float64)})
        return {d: data for d in out_neighbors}

    def reclaim(self, lost: set[int], rnd: int, since: dict[int, int] | None = None) -> None:
        """Take back the PushSum mass sent to nodes since lost (the mass never entered a live site), so that
        the live sites' total weight stays what it was: what was sent to each lost node ``d`` in rounds from
        ``since[d]`` on (the rounds whose deliveries it did not answer), or, without ``since``, in the last
        send."""
        kept = []
        for i, (r, theta, each, to) in enumerate(self._sends):
            last = i == len(self._sends) - 1
            gone = {d for d in to & lost if (r >= since.get(d, 0) if since is not None else last)}
            if gone:
                own = self.shared_state()
                back = {k: theta[k].to(v.device) for k, v in own.items()}
                new_state, self.pushsum_weight = combine(own, self.pushsum_weight, [(back, each * len(gone))])
                self.replace_shared(new_state)
                log.info(
                    "client %d took back the PushSum mass (weight %.4g) sent in round %d to lost node(s) %s "
                    "before round %d",
                    self.cid,
                    each * len(gone),
                    r,
                    sorted(gone),
                    rnd,
                )
            kept.append((r, theta, each, to - gone))
        self._sends = kept

    def incoming(self, rnd: int, packets: list[Packet]) -> list[dict]:
        """Validate and mix the received (model, weight) pairs; the refused ones as records."""
        own = self.shared_state()
        received, rejected = [], []
        for p, got in zip(packets, self.read_many(packets, (PUSHSUM_KEY,), rnd), strict=True):
            try:
                if isinstance(got, PeerModelRejected):
                    raise got
                tensors, extras, _ = got
                if extras[PUSHSUM_KEY] > self.max_weight:
                    raise PeerModelRejected(
                        f"PushSum weight {extras[PUSHSUM_KEY]:.3g} exceeds the total weight "
                        f"{self.max_weight:g} of all sites"
                    )
                received.append((tensors, extras[PUSHSUM_KEY]))
            except PeerModelRejected as e:
                rejected.append(self.reject(rnd, p, e))
        new_state, weight = mix(own, self._kept_weight, received, self.wire_cache)
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
            self._sends = [
                x for x in self._sends if x[0] != rnd
            ]  # so nothing more to take back from this round
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
        received = self.call(
            "receive", {k: Message({"round": rnd}, sorted(inbox[k], key=lambda p: p.src)) for k in active}
        )
        for r in received.values():
            events.rejected += r.meta.get("rejected", [])
        return events

    deferred_steps = frozenset({"receive", "receive_global"})  # a round's deliveries go with the next request

    def on_lost(self, nodes: set[int], rnd: int) -> None:
        since = {str(d): self.delivered.get(d, -1) + 1 for d in sorted(nodes)}  # the rounds it did not take
        self.call(
            "reclaim",
            {k: Message({"round": rnd, "lost": sorted(nodes), "since": since}) for k in self.active},
        )
