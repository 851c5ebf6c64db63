"""The client/round abstraction every method shares.

A :class:`Client` is one site: it trains locally, evaluates, and reports its privacy spend. A
:class:`Protocol` runs one round over all clients (and, for centralized methods, a server node)
through a :class:`~silofl.runtime.transport.Transport`; it never knows whether that transport is
in-process or spans machines. Node ids: clients are ``0..K-1``; a server, where a method has one,
is node ``K`` — just another role in the runtime.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from silofl.runtime.transport import Transport

log = logging.getLogger("silofl")


def client_seeds(run_seed: int, client: int, n: int = 4) -> list[int]:
    """Independent per-client seeds derived from the run seed (model init, sampling, noise, …)."""
    return [int(s) for s in np.random.SeedSequence([int(run_seed), int(client)]).generate_state(n)]


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1000) -> float:
    """Top-1 accuracy over (x, y) in batches, under no_grad, in eval mode."""
    was_training = model.training
    model.eval()
    correct = 0
    for i in range(0, len(y), batch_size):
        correct += int((model(x[i : i + batch_size]).argmax(1) == y[i : i + batch_size]).sum())
    model.train(was_training)
    return correct / max(1, len(y))


@dataclass
class RoundEvents:
    left: list[int] = field(default_factory=list)  # budget spent
    rejected: list[dict] = field(default_factory=list)
    lost: dict[int, str] = field(default_factory=dict)  # client -> why its process was lost


class Client(ABC):
    cid: int
    active: bool = True
    left_at: int | None = None

    @abstractmethod
    def can_continue(self) -> bool:
        """False when one more round would exceed the client's privacy budget."""

    @abstractmethod
    def train_round(self, rnd: int) -> dict: ...

    @abstractmethod
    def evaluate(self, x: torch.Tensor, y: torch.Tensor, cache: dict | None = None) -> dict[str, float]: ...

    @abstractmethod
    def epsilon(self) -> float | None: ...

    @abstractmethod
    def privacy_report(self) -> dict: ...

    @abstractmethod
    def final_models(self) -> dict[str, tuple[nn.Module, object]]:
        """name -> (model, ModelSpec) for the run folder."""

    def leave(self, rnd: int) -> None:
        self.active = False
        self.left_at = rnd

    def state_dict(self) -> dict:
        """Everything needed to continue exactly where this client stopped (for checkpoints)."""
        return {"active": self.active, "left_at": self.left_at}

    def load_state_dict(self, state: dict) -> None:
        self.active, self.left_at = bool(state["active"]), state["left_at"]


class RemoteClient(Client):
    """A client another process runs: this process only tracks whether it is still in the protocol."""

    def __init__(self, cid: int):
        self.cid = cid
        self.active, self.left_at = True, None

    def _remote(self, *_, **__):
        raise RuntimeError(f"client {self.cid} runs in another process")

    can_continue = train_round = evaluate = epsilon = privacy_report = final_models = _remote


class RemoteNode:
    """A server role another process runs."""

    def __init__(self, node: int):
        self.node = node


def sites(parts, transport: Transport, make) -> list[Client]:
    """``make(k, x, y)`` for the clients this process runs, :class:`RemoteClient` for the others."""
    return [make(k, x, y) if transport.is_local(k) else RemoteClient(k) for k, (x, y) in enumerate(parts)]


class Protocol(ABC):
    """One method's round logic (how it is judged lives in :mod:`silofl.methods.registry`)."""

    def __init__(self, clients: list[Client], transport: Transport):
        self.clients = clients
        self.transport = transport

    @property
    def active_ids(self) -> list[int]:
        return [c.cid for c in self.clients if c.active]

    @property
    def server_id(self) -> int:
        return len(self.clients)

    def start(self) -> None:
        """Anything that happens before round 1 (e.g. a server broadcasting its initial model)."""
        return None

    def local(self, clients: list[Client]) -> list[Client]:
        """The clients this process runs (all of them in the simulator)."""
        return [c for c in clients if self.transport.is_local(c.cid)]

    def retire_spent(self, rnd: int, events: RoundEvents) -> list[Client]:
        """Clients whose budget cannot pay for another round leave, and so do clients whose process was
        lost (crashed or stopped answering; between processes only); returns the active ones. Each
        process decides for its own clients and every process learns every decision."""
        mine = {c.cid: c.can_continue() for c in self.local(self.clients) if c.active}
        verdict = self.transport.agree(mine, len(self.clients))
        lost = self.transport.lost_nodes()
        if getattr(self, "server", None) is not None and self.server_id in lost:
            lost.update({c.cid: f"the server's {lost[self.server_id]}" for c in self.clients if c.cid not in lost})
        if self.transport.isolated:
            lost.update({c.cid: "every other process was lost (this one may be the one cut off)"
                         for c in self.local(self.clients)})
        for c in self.clients:
            if not c.active:
                continue
            if c.cid in lost:
                c.leave(rnd)
                events.lost[c.cid] = lost[c.cid]
                if self.transport.writes_reports or self.transport.is_local(c.cid):
                    log.warning("client %d leaves the protocol before round %d: process lost (%s)", c.cid, rnd,
                                lost[c.cid])
            elif not verdict.get(c.cid, True):
                c.leave(rnd)
                events.left.append(c.cid)
                log.info("client %d spent its budget and leaves the protocol before round %d", c.cid, rnd)
        if events.lost:
            self.on_lost(set(events.lost), rnd)
        return [c for c in self.clients if c.active]

    def on_lost(self, nodes: set[int], rnd: int) -> None:
        """Repair after losing ``nodes`` (e.g. take back PushSum mass sent to them)."""
        return None

    @abstractmethod
    def run_round(self, rnd: int) -> RoundEvents: ...

    def evaluate(self, x: torch.Tensor, y: torch.Tensor, rnd: int) -> dict[int, dict[str, float]]:
        """Metrics per client still active, or leaving this round (its last evaluation)."""
        cache: dict = {}
        return {c.cid: c.evaluate(x, y, cache) for c in self.local(self.clients) if c.active or c.left_at == rnd}

    def extra_metrics(self, client: Client) -> dict:
        return {}

    def state_dict(self) -> dict:
        """Every node's state: ``{node id: state}`` (clients 0..K-1, a server as node K)."""
        states = {c.cid: c.state_dict() for c in self.local(self.clients)}
        server = getattr(self, "server", None)
        if server is not None and self.transport.is_local(self.server_id):
            states[self.server_id] = server.state_dict()
        return states

    def load_state_dict(self, states: dict) -> None:
        for c in self.local(self.clients):
            c.load_state_dict(states[c.cid])
        server = getattr(self, "server", None)
        if server is not None and self.transport.is_local(self.server_id):
            server.load_state_dict(states[self.server_id])

    def budget_message(self) -> str:
        """Why no client can train a single round within its budget."""
        c = self.local(self.clients)[0]
        cfg = c.cfg
        one = c.accountant.epsilon_after(cfg.noise_multiplier, c.sample_rate, c.steps_per_round, cfg.delta)
        return (f"target_epsilon {c.budget.target_epsilon:g} is below the ε of a single round ({one:.3f} at "
                f"δ={cfg.delta:g}) for every client: no client could train; raise the budget or the noise multiplier, "
                "or lower the batch size")

    def privacy_summary(self) -> dict:
        """Method-specific entries of summary.json's ``privacy`` section."""
        return {}

    def round_history(self) -> list[dict]:
        """Per-round records of a server role (written to summary.json), if the method has one."""
        return []
