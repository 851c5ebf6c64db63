"""The client/round abstraction every method shares.

A :class:`Client` is one site: it trains locally, says what it sends to which peer (bytes), takes
what it received, evaluates, and reports its privacy spend. A :class:`Protocol` runs one round over
all clients through a :class:`~silofl.runtime.transport.Transport`; it never knows whether that
transport is in-process or spans machines.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from silofl.runtime.transport import Envelope, Transport


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
    left: list[int] = field(default_factory=list)
    rejected: list[dict] = field(default_factory=list)


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
    def outgoing(self, rnd: int, out_neighbors: list[int]) -> dict[int, bytes]: ...

    @abstractmethod
    def incoming(self, rnd: int, envelopes: list[Envelope]) -> list[dict]:
        """Use received messages; return a record per rejected message."""

    @abstractmethod
    def evaluate(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]: ...

    @abstractmethod
    def privacy_report(self) -> dict: ...

    @abstractmethod
    def final_models(self) -> dict[str, tuple[nn.Module, object]]:
        """name -> (model, ModelSpec) for the run folder."""

    def leave(self, rnd: int) -> None:
        self.active = False
        self.left_at = rnd


class Protocol(ABC):
    def __init__(self, clients: list[Client], transport: Transport):
        self.clients = clients
        self.transport = transport

    @property
    def active_ids(self) -> list[int]:
        return [c.cid for c in self.clients if c.active]

    @abstractmethod
    def run_round(self, rnd: int) -> RoundEvents: ...
