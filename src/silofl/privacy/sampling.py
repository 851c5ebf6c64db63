"""Poisson sampling: every example joins a batch independently with probability q.

This is the sampling the subsampled-Gaussian accountants assume; batch sizes vary and may be 0. The
amplification it gives holds only if the adversary cannot predict the batches, so by default the
draws come from a :class:`~silofl.core.randomness.SecureRandom`; a seeded ``torch.Generator`` serves
reproducible research runs.
"""

from __future__ import annotations

import torch

from silofl.core.randomness import SecureRandom

Sampler = torch.Generator | SecureRandom


def uniforms(n: int, rng: Sampler) -> torch.Tensor:
    """``n`` uniforms in [0, 1) from a secure or a seeded generator."""
    if isinstance(rng, SecureRandom):
        return rng.uniform(n)
    return torch.rand(n, generator=rng)


def poisson_batch(n: int, sample_rate: float, rng: Sampler) -> torch.Tensor:
    """Indices of one Poisson-sampled batch from ``n`` examples (possibly empty)."""
    return torch.nonzero(uniforms(n, rng) < sample_rate).flatten()


def make_sampler(seed: int | None) -> Sampler:
    """A secure sampler (no seed) or a seeded ``torch.Generator`` (research runs)."""
    return SecureRandom() if seed is None else torch.Generator().manual_seed(int(seed))


def sampler_state(rng: Sampler) -> dict:
    """A seeded sampler's state for checkpoints (a secure one has none)."""
    return {"secure": True} if isinstance(rng, SecureRandom) else {"secure": False, "state": rng.get_state()}


def load_sampler_state(rng: Sampler, state) -> None:
    """Restore :func:`sampler_state` (a secure sampler starts afresh; an old checkpoint's bare tensor state is
    a seeded generator's)."""
    if isinstance(state, torch.Tensor):
        state = {"secure": False, "state": state}
    if bool(state.get("secure")) != isinstance(rng, SecureRandom):
        raise ValueError("sampler state and sampler disagree on 'secure'")
    if not isinstance(rng, SecureRandom):
        rng.set_state(state["state"])
