"""The SecAgg+ communication graph (Bell et al., CCS 2020): each party shares with and masks against k
neighbours, a random k-regular (Harary) graph over the round's participants, drawn from a public seed
that every party checks by recomputing it; the complete graph when the round is small."""

from __future__ import annotations

import math
import random


def default_neighbours(n: int) -> int:
    """k: the complete graph up to 10 parties, else the even number at least 3·log2(n) (SecAgg+'s
    O(log n))."""
    if n <= 10:
        return n - 1
    k = math.ceil(3 * math.log2(n))
    return min(n - 1, k + (k % 2))


def default_threshold(k: int) -> int:
    """t: a majority of the neighbours (t > k/2 is what makes a lying server unable to collect both
    kinds of secret of one party — see :meth:`silofl.secure.protocol.Party.unmask`)."""
    return k // 2 + 1


def neighbours(participants: list[int], k: int, seed: bytes) -> dict[int, list[int]]:
    """Each participant's neighbours: the complete graph if k ≥ n − 1, else the Harary graph H(k, n) on
    the participants in an order shuffled by ``seed`` (k even: k/2 on each side of the ring)."""
    nodes = sorted(participants)
    n = len(nodes)
    if k >= n - 1:
        return {u: [v for v in nodes if v != u] for u in nodes}
    if k < 2 or k % 2:
        raise ValueError(f"a sparse graph needs an even number of neighbours >= 2, got {k}")
    order = list(nodes)
    random.Random(seed).shuffle(order)
    pos = {u: i for i, u in enumerate(order)}
    out = {}
    for u in nodes:
        i = pos[u]
        out[u] = sorted(
            {order[(i + d) % n] for d in range(1, k // 2 + 1)}
            | {order[(i - d) % n] for d in range(1, k // 2 + 1)}
        )
    return out
