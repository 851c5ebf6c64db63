"""Split a labelled training set into disjoint client shards.

Every partitioner returns one index array per client; no index appears twice across clients.
"""

from __future__ import annotations

import numpy as np

from silofl.core.errors import ConfigError


def _check(labels: np.ndarray, n_clients: int, n_per_client: int) -> None:
    if n_clients < 1 or n_per_client < 1:
        raise ConfigError("need at least one client and one example per client")
    if n_clients * n_per_client > len(labels):
        raise ConfigError(
            f"{n_clients} clients × {n_per_client} examples = {n_clients * n_per_client} exceeds the "
            f"{len(labels)} training examples available"
        )


def iid(labels: np.ndarray, n_clients: int, n_per_client: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Equal random shares of the training set."""
    _check(labels, n_clients, n_per_client)
    perm = rng.permutation(len(labels))
    return [np.sort(perm[k * n_per_client : (k + 1) * n_per_client]) for k in range(n_clients)]


def p_major(
    labels: np.ndarray, n_clients: int, n_per_client: int, p: float, rng: np.random.Generator
) -> list[np.ndarray]:
    """The ProxyFL papers' skew: a fraction p of each client's n examples from one assigned class.

    Client k's major class is ``order[k % C]`` for a seeded permutation ``order`` of the C classes
    (distinct classes while K ≤ C; the published code drew them independently, so two clients could
    share one). The remaining n − ⌊p·n⌋ examples come uniformly from the other classes. No example is
    given to two clients.
    """
    if not 0.0 <= p <= 1.0:
        raise ConfigError(f"p_major must lie in [0, 1], got {p}")
    _check(labels, n_clients, n_per_client)
    classes = np.unique(labels)
    order = rng.permutation(classes)
    available = np.ones(len(labels), dtype=bool)
    n_major = int(n_per_client * p)
    shards = []
    for k in range(n_clients):
        major = order[k % len(classes)]
        major_pool = np.flatnonzero(available & (labels == major))
        minor_pool = np.flatnonzero(available & (labels != major))
        n_minor = n_per_client - n_major
        if len(major_pool) < n_major or len(minor_pool) < n_minor:
            raise ConfigError(
                f"client {k}: class {major} has {len(major_pool)} unused examples and the others "
                f"{len(minor_pool)}, but p_major={p} with {n_per_client} examples per client needs "
                f"{n_major} and {n_minor}; use fewer clients or fewer examples per client"
            )
        idx = np.concatenate(
            [rng.choice(major_pool, n_major, replace=False), rng.choice(minor_pool, n_minor, replace=False)]
        )
        available[idx] = False
        shards.append(np.sort(idx))
    return shards


def dirichlet(
    labels: np.ndarray, n_clients: int, n_per_client: int, alpha: float, rng: np.random.Generator
) -> list[np.ndarray]:
    """Each client's class proportions drawn from Dirichlet(α); n examples each, disjoint.

    When a class runs out, the shortfall is taken from the classes with the most unused examples.
    """
    if alpha <= 0:
        raise ConfigError(f"dirichlet alpha must be positive, got {alpha}")
    _check(labels, n_clients, n_per_client)
    classes = np.unique(labels)
    pools = {c: list(rng.permutation(np.flatnonzero(labels == c))) for c in classes}
    shards = []
    for _ in range(n_clients):
        counts = rng.multinomial(n_per_client, rng.dirichlet(np.full(len(classes), alpha)))
        idx: list[int] = []
        for c, m in zip(classes, counts, strict=True):
            take = min(int(m), len(pools[c]))
            idx += [pools[c].pop() for _ in range(take)]
        while len(idx) < n_per_client:
            c = max(classes, key=lambda c: len(pools[c]))
            idx.append(pools[c].pop())
        shards.append(np.sort(np.asarray(idx, dtype=np.int64)))
    return shards


def partition(
    name: str,
    labels: np.ndarray,
    n_clients: int,
    n_per_client: int,
    rng: np.random.Generator,
    *,
    p: float = 0.8,
    alpha: float = 0.5,
) -> list[np.ndarray]:
    """One index array per client by the named partitioner (p_major, iid, dirichlet)."""
    if name == "iid":
        return iid(labels, n_clients, n_per_client, rng)
    if name == "p_major":
        return p_major(labels, n_clients, n_per_client, p, rng)
    if name == "dirichlet":
        return dirichlet(labels, n_clients, n_per_client, alpha, rng)
    raise ConfigError(f"unknown partition {name!r}; choose one of: p_major, iid, dirichlet")
