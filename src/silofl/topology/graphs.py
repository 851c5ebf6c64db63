"""Time-varying directed communication graphs over the clients still in the protocol.

``out_neighbors(round, active)`` maps every active client to the clients it sends to in that
round. Clients that left (e.g. budget spent) are not in ``active``, so the graph skips them: the
schedule is applied to the active clients in ring order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from silofl.core.errors import ConfigError


def exponential_hops(n_active: int) -> list[int]:
    """Hop lengths 2^0, …, 2^⌊log2(K−1)⌋ cycled over rounds (empty for K < 2)."""
    if n_active < 2:
        return []
    return [2**i for i in range(int(math.floor(math.log2(n_active - 1))) + 1)]


class ExponentialGraph:
    """Round t: every client sends to the peer 2^(t mod (⌊log2(K−1)⌋+1)) places ahead in the ring
    and receives from the one as far behind (one peer each way per round)."""

    name = "exponential"

    def out_neighbors(self, round_: int, active: Sequence[int]) -> dict[int, list[int]]:
        """Each active client's out-neighbours in this round."""
        hops = exponential_hops(len(active))
        if not hops:
            return {c: [] for c in active}
        h = hops[round_ % len(hops)]
        K = len(active)
        return {c: [active[(i + h) % K]] for i, c in enumerate(active)}


class RingGraph:
    """Static directed ring: every client sends to the next active client."""

    name = "ring"

    def out_neighbors(self, round_: int, active: Sequence[int]) -> dict[int, list[int]]:
        """Each active client's out-neighbours in this round."""
        K = len(active)
        return {c: ([active[(i + 1) % K]] if K > 1 else []) for i, c in enumerate(active)}


class StaticGraph:
    """A fixed directed graph from an adjacency list (client -> out-neighbours)."""

    name = "static"

    def __init__(self, adjacency: dict[int, list[int]]):
        self.adjacency = {int(k): [int(v) for v in vs] for k, vs in adjacency.items()}

    def out_neighbors(self, round_: int, active: Sequence[int]) -> dict[int, list[int]]:
        """Each active client's out-neighbours in this round."""
        alive = set(active)
        return {c: [d for d in self.adjacency.get(c, []) if d in alive and d != c] for c in active}


def in_neighbors(out: dict[int, list[int]]) -> dict[int, list[int]]:
    """Who sends to each node, from who each node sends to."""
    inn: dict[int, list[int]] = {c: [] for c in out}
    for src, dsts in out.items():
        for d in dsts:
            inn.setdefault(d, []).append(src)
    return inn


class CompleteGraph:
    """Every client sends to every other active client each round (K − 1 peers: K − 1 times the exponential
    graph's bytes). With PushSum self-weight 1/K every live site holds the exact average of the round's
    models, so the proxies mix as a server's average would, without a server."""

    name = "complete"

    def out_neighbors(self, round_: int, active: Sequence[int]) -> dict[int, list[int]]:
        """Each active client's out-neighbours in this round: all the others."""
        return {c: [d for d in active if d != c] for c in active}


GRAPH_TYPES = {g.name: g for g in (ExponentialGraph, RingGraph, CompleteGraph)}


def make_graph(name: str):
    """A graph by name (one of :data:`GRAPH_TYPES`)."""
    if name not in GRAPH_TYPES:
        raise ConfigError(f"unknown graph {name!r}; choose one of: {', '.join(GRAPH_TYPES)}")
    return GRAPH_TYPES[name]()
