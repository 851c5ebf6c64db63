"""An observer around the engine seam: what an auditor sees of a run.

The coordinator talks to sites only through ``engine.call(step, {site: request})``, and everything that
leaves a site is a :class:`~silofl.comm.messages.Packet` in its reply (ProxyFL's proxy to its neighbour,
FedAvg's upload, a client-level update), while a server's broadcast is a packet from node K in the
requests. :class:`TappedEngine` is the in-process engine with observers called before and after every
call, so an auditor reads exactly those packets — no method is changed. :func:`model_tensors` decodes a
packet's model (the wire format's scalars, ``__name__`` keys, dropped).
"""

from __future__ import annotations

from typing import Protocol

import torch

from silofl.comm.engine import Engine, InProcessEngine, SiteHandle
from silofl.comm.messages import Message, Packet
from silofl.comm.wire import decode


class Observer(Protocol):
    """Sees every engine call: the requests before the sites run, the replies after."""

    def before(self, step: str, requests: dict[int, Message], engine: TappedEngine) -> None:
        """Called with a step's requests before any site runs it."""

    def after(
        self, step: str, requests: dict[int, Message], replies: dict[int, Message], engine: TappedEngine
    ) -> None:
        """Called with a step's requests and the sites' replies after they ran it."""


class TappedEngine(InProcessEngine):
    """The simulator's engine with observers (bytes are counted as usual)."""

    name = "simulator (audited)"

    def __init__(self, sites: dict[int, SiteHandle], observers: list[Observer]):
        super().__init__(sites)
        self.observers = list(observers)

    def call(self, step: str, requests: dict[int, Message]) -> dict[int, Message]:
        from silofl.comm import batch

        if step == batch.BATCH:  # its parts come back through this call, one step at a time
            return super().call(step, requests)
        for o in self.observers:
            o.before(step, requests, self)
        replies = super().call(step, requests)
        for o in self.observers:
            o.after(step, requests, replies, self)
        return replies


def released_by(site: int, replies: dict[int, Message]) -> list[Packet]:
    """The packets ``site`` sent in this call (what left it)."""
    reply = replies.get(site)
    return [p for p in reply.packets if p.src == site] if reply is not None else []


def model_tensors(packet: Packet) -> dict[str, torch.Tensor]:
    """The model weights a packet carries (its protocol scalars, ``__name__`` keys, left out)."""
    tensors, _ = decode(packet.data)
    return {k: v for k, v in tensors.items() if not (k.startswith("__") and k.endswith("__"))}


def tap(engine: Engine, observers: list[Observer]) -> Engine:
    """Any engine — the torch.distributed one included — with ``observers`` called around every call, as
    :class:`TappedEngine` does for the simulator. Observers that read a site's state (``engine.sites[k]``)
    need that site in this process: over torch.distributed, a site on rank 0 (site 0 always is)."""
    inner = engine.call
    if not isinstance(engine, InProcessEngine):
        # an engine that runs a batch elsewhere would show the observers its parts only all at once: each step
        # is sent on its own instead (the simulator runs a batch's parts through engine.call, seen one by one)
        engine.batches = False

    def call(step: str, requests: dict[int, Message]) -> dict[int, Message]:
        if step == "batch":  # the simulator's: its parts come back through this call, one step at a time
            return inner(step, requests)
        for o in observers:
            o.before(step, requests, engine)  # type: ignore[arg-type]
        replies = inner(step, requests)
        for o in observers:
            o.after(step, requests, replies, engine)  # type: ignore[arg-type]
        return replies

    engine.call = call  # type: ignore[method-assign]
    return engine
