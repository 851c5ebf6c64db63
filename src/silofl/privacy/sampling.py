"""Poisson sampling: every example joins a batch independently with probability q.

This is the sampling the subsampled-Gaussian accountants assume; batch sizes vary and may be 0.
"""

from __future__ import annotations

import torch


def poisson_batch(n: int, sample_rate: float, generator: torch.Generator) -> torch.Tensor:
    """Indices of one Poisson-sampled batch from ``n`` examples (possibly empty)."""
    return torch.nonzero(torch.rand(n, generator=generator) < sample_rate).flatten()
