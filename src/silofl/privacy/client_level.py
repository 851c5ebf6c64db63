"""Client-level DP mechanisms (McMahan et al. 2018; Andrew et al. 2021): clipping an update in global L2
norm, and the adaptive clip that follows a privately estimated quantile of update norms. The
calibration arithmetic (the total noise multiplier of the joint release, the multiplier per privacy
unit) is pure analysis and lives in :mod:`silofl.privacy.analysis`.

Neighbouring data sets differ in one unit's contribution being present or absent (add/remove), at
either unit; v is fixed and public within a round.
"""

from __future__ import annotations

import math

import torch

from silofl.core.errors import ConfigError


def clip_update(update: torch.Tensor, bound: float) -> tuple[torch.Tensor, float]:
    """(update scaled to L2 norm ≤ bound, its norm before clipping). ``update`` is a flat vector."""
    norm = float(torch.linalg.vector_norm(update.double()))
    factor = min(1.0, bound / norm) if norm > 0 else 1.0
    return update * factor, norm


class AdaptiveClip:
    """Geometric update of the clip towards a target quantile of update norms (Andrew et al. 2021).

    Each round the server releases b̃ = (Σ (b_i − ½) + N(0, σ_b²)) / D + ½, the noised fraction of
    updates whose norm was at most the clip (b_i ∈ [0, 1] per privacy unit, centred so that one unit
    moves the sum by at most ½; D the expected number of units),
    and sets C ← C · exp(−η (b̃ − γ)). Only b̃, a privatised quantity, ever moves C.
    """

    def __init__(self, initial: float, quantile: float = 0.5, lr: float = 0.2, count_std: float = 1.0):
        if initial <= 0:
            raise ConfigError(f"initial clip must be positive, got {initial}")
        if not 0.0 < quantile < 1.0:
            raise ConfigError(f"target quantile must lie in (0, 1), got {quantile}")
        if lr <= 0:
            raise ConfigError(f"clip learning rate must be positive, got {lr}")
        self.clip = float(initial)
        self.quantile = float(quantile)
        self.lr = float(lr)
        self.count_std = float(count_std)

    def noisy_fraction(self, centred_unclipped: float, expected_units: float, noise: float) -> float:
        """b̃ = (Σ (b_i − ½) + σ_b·noise) / D + ½ from the centred indicator sum and one N(0, 1) draw."""
        return (centred_unclipped + self.count_std * noise) / expected_units + 0.5

    def update(self, noisy_fraction: float) -> float:
        """Move the clip geometrically towards the target quantile given the noised fraction."""
        self.clip *= math.exp(-self.lr * (noisy_fraction - self.quantile))
        return self.clip
