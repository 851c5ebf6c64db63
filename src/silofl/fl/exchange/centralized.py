"""A central server averaging the sites' shared models (FedAvg, FML).

Every round each active site trains, uploads its shared model with an aggregation weight (its data
size, or 1 with ``aggregation: uniform``), the server — a role the coordinator plays, node ``K`` —
validates each upload like any site would (names, shapes, dtypes, finite values), averages them in
float64 and broadcasts the result, and every site replaces its copy. Before round 1 the server
broadcasts its initial model so all sites start from the same weights. A rejected upload is logged and
left out of the average; if none is usable the server keeps the previous global model.

With ``server_lr`` ≠ 1 or ``server_momentum`` > 0 the server steps instead of replacing: Δ̄ = average − w,
m ← μ·m + Δ̄, w ← w + η·m (FedAvgM, :class:`silofl.training.server_opt.ServerMomentum`) — post-processing of
the sites' DP uploads, no budget. With the defaults the global model *is* the average, as before. A method may
name another server optimizer (``server_optimizer``: FedAdam, FedYogi — :mod:`silofl.fl.methods.fedopt`), also
post-processing of the average.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from silofl.comm.messages import Message, Packet
from silofl.comm.wire import encode, read_model
from silofl.core.errors import PeerModelRejected
from silofl.core.randomness import party_seeds
from silofl.fl.coordinator import Coordinator, RoundEvents
from silofl.models import ModelSpec
from silofl.site.dpsgd import DPSGDSite
from silofl.topology import combine
from silofl.training import accuracy
from silofl.training.local_sgd import flat, unflat
from silofl.training.server_opt import ServerOptimizer, make_optimizer

log = logging.getLogger("silofl")

WEIGHT_KEY = "__aggregation_weight__"


class CentralSite(DPSGDSite):
    """A DP-SGD site that uploads its shared model to a server and takes the server's broadcast."""

    def on_train_upload(self, msg: Message) -> Message:
        """Train one round and upload the shared model with its aggregation weight."""
        rnd = int(msg.meta["round"])
        self.train(rnd)
        w = 1.0 if msg.meta.get("uniform") else float(self.n)
        data = self.payload(rnd, {WEIGHT_KEY: torch.tensor(w, dtype=torch.float64)})
        return Message(packets=[Packet(self.cid, int(msg.meta["server"]), data)])

    def on_receive_global(self, msg: Message) -> Message:
        """Take the server's broadcast, validated first (:meth:`take_global`)."""
        rnd = int(msg.meta["round"])
        rejected = []
        for p in msg.packets:
            try:
                self.take_global(self.read_global(p, rnd), rnd)
            except PeerModelRejected as e:
                rejected.append(self.reject(rnd, p, e))
        return Message({"rejected": rejected})

    def read_global(self, packet: Packet, rnd: int) -> Any:
        """The server's broadcast in ``packet``, validated (PeerModelRejected otherwise): its model
        tensors."""
        tensors, _, _ = self.read(packet, rnd=rnd)
        return tensors

    def take_global(self, tensors: Any, rnd: int) -> None:
        """What the site does with the server's validated broadcast: its shared model becomes it."""
        self.replace_shared(tensors, token=("server", rnd))


class AveragingServer:
    """The aggregator role (node ``K``): validate, average in float64, broadcast."""

    def __init__(
        self,
        node: int,
        spec: ModelSpec,
        seed: int,
        device: torch.device,
        opt: ServerOptimizer | None = None,
        keys: tuple[str, ...] | None = None,
    ):
        torch.manual_seed(seed)
        self.node = node
        self.spec = spec
        self.model = spec.build().to(device)
        self.version = 0
        self._encoded: tuple | None = None
        self.opt = opt  # None: the global model is the average
        self.keys = keys  # the tensors the sites share (FedPer: the body); None: all of them

    def state(self) -> dict[str, torch.Tensor]:
        """The global model's weights (the shared ones, with ``keys``)."""
        state = dict(self.model.state_dict())
        return state if self.keys is None else {k: state[k] for k in self.keys}

    def payload(self, rnd: int, client: int | None = None) -> bytes:
        """The broadcast of round ``rnd`` (the same bytes for every site: encoded once per round)."""
        if self._encoded is None or self._encoded[0] != (rnd, self.version):
            data = encode(
                self.state(), meta={"round": rnd, "src": self.node, "model": self.spec.name, "global": True}
            )
            self._encoded = ((rnd, self.version), data)
        return self._encoded[1]

    def state_dict(self) -> dict:
        """The global model and the round it was last updated."""
        return {
            "model": self.model.state_dict(),
            "version": self.version,
            **({"opt": self.opt.state_dict()} if self.opt is not None else {}),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        self.model.load_state_dict(state["model"])
        self.version = int(state["version"])
        self._encoded = None
        if self.opt is not None and "opt" in state:
            self.opt.load_state_dict(state["opt"])

    def aggregate(
        self, rnd: int, packets: list[Packet], weights: dict[int, float] | None = None
    ) -> list[dict]:
        """Average the valid uploads into the global model; the refused ones as records. ``weights``: each
        site's aggregation weight (its public data size, or 1): an upload claiming another is refused."""
        template = {k: v.detach().clone() for k, v in self.state().items()}
        received, rejected = [], []
        for p in packets:
            try:
                tensors, w, _ = read_model(
                    p.data, template, (WEIGHT_KEY,), positive=True, expect={"round": rnd, "src": p.src}
                )
                if weights is not None and w[WEIGHT_KEY] != weights.get(p.src):
                    raise PeerModelRejected(
                        f"aggregation weight {w[WEIGHT_KEY]:g}, expected {weights.get(p.src)}"
                    )
                received.append((tensors, w[WEIGHT_KEY]))
            except PeerModelRejected as e:
                log.warning("server rejected the model from client %d in round %d: %s", p.src, rnd, e)
                rejected.append({"round": rnd, "client": self.node, "src": p.src, "reason": str(e)})
        if not received:
            log.warning(
                "server received no usable model in round %d and keeps the previous global model", rnd
            )
            return rejected
        average, _ = combine(template, 0.0, received)  # weighted mean in float64, as PushSum mixes
        average = self.absorb(
            average, len(received)
        )  # a method's extra averaged tensors (SCAFFOLD's), taken out
        template = {k: template[k] for k in average}
        if self.opt is not None:
            average = self._server_step(template, average)
        self.model.load_state_dict(average, strict=self.keys is None)
        self.version = rnd
        return rejected

    def absorb(self, average: dict[str, torch.Tensor], received: int) -> dict[str, torch.Tensor]:
        """Take a method's own averaged tensors out of ``average`` (``received`` uploads were averaged) and
        return the model's; the plain server has none."""
        return average

    def _server_step(
        self, current: dict[str, torch.Tensor], average: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """w + the server optimizer's step for Δ̄ = average − w, in float64 (floating tensors; others: the
        average)."""
        assert self.opt is not None
        keys = [k for k, v in current.items() if v.is_floating_point()]
        w = flat({k: current[k].to(torch.float64) for k in keys})
        delta = flat({k: average[k].to(torch.float64) for k in keys}) - w
        new = unflat(w + self.opt.step(delta), {k: current[k] for k in keys})
        return {k: new[k].to(current[k].dtype) if k in new else average[k] for k in current}

    def accuracy(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """The global model's accuracy on (x, y)."""
        return accuracy(self.model, x, y)


class Centralized(Coordinator):
    """Train locally → upload → aggregate → broadcast → replace."""

    def __init__(
        self,
        cfg,
        n_sites: int,
        spec: ModelSpec,
        device: torch.device,
        uniform: bool = False,
        server_optimizer: str | None = None,
        shared_keys: tuple[str, ...] | None = None,
    ):
        super().__init__(cfg, n_sites)
        o = cfg.options
        lr, momentum = getattr(o, "server_lr", None) or 1.0, float(getattr(o, "server_momentum", 0.0) or 0.0)
        opt = make_optimizer("fedavgm", o) if (lr != 1.0 or momentum > 0.0) else None
        if server_optimizer is not None:  # FedOpt (silofl.fl.methods.fedopt): e.g. fedadam, fedyogi on Δ̄
            opt = make_optimizer(server_optimizer, o)
        self.server = AveragingServer(
            n_sites, spec, party_seeds(cfg.seed, n_sites)[0], device, opt, shared_keys
        )
        self.uniform = uniform

    def broadcast(self, rnd: int, sites: list[int], events: RoundEvents) -> None:
        """Send the global model to ``sites``; they validate and replace."""
        self.send_from_server(rnd, sites, self.server.payload, events)

    def start(self) -> None:
        self.broadcast(0, list(range(self.n_sites)), RoundEvents())

    def run_round(self, rnd: int) -> RoundEvents:
        events = RoundEvents()
        active = self.retire(rnd, events)
        if not active:
            return events
        meta = {"round": rnd, "uniform": self.uniform, "server": self.server_id}
        uploads = self.call("train_upload", {k: Message(dict(meta)) for k in active})
        packets = [
            p for k in sorted(uploads) for p in self.routable(rnd, k, uploads, {self.server_id}, events)
        ]
        weights = {k: 1.0 if self.uniform else float(self.info[k]["n"]) for k in active}
        events.rejected += self.server.aggregate(rnd, packets, weights)
        self.broadcast(rnd, active, events)
        return events

    def state_dict(self) -> dict:
        return {**super().state_dict(), "server": self.server.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.server.load_state_dict(state["server"])
