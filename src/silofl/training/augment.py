"""Augmentation multiplicity (De et al., "Unlocking High-Accuracy Differentially Private Image
Classification through Scale", 2022): K augmented views of every sampled image.

:class:`AugMult` turns a batch of B images (B, C, H, W) into B·K views, example-major (the K views of
example i are rows iK … iK+K−1): each view a random crop of the image reflect-padded by ``pad`` pixels
per side, optionally flipped left-right. DP-SGD then averages an example's K views' gradients before
clipping (:meth:`silofl.privacy.DPGradient.compute` with ``views=K``), so the sensitivity stays C.

The augmentation's randomness is independent of the data and the guarantee holds for every draw of it,
so it needs no secrecy; it comes from the run's seed in a research run and from a fresh secret seed
otherwise, and never touches torch's global generator (seeded runs without augmentation are unchanged).
"""

from __future__ import annotations

import secrets

import torch
import torch.nn.functional as F

from silofl.core.errors import ConfigError


class AugMult:
    """K random crop (and flip) views of each image; see the module doc."""

    def __init__(self, views: int, pad: int = 4, flip: bool = False, seed: int | None = None):
        if views < 1:
            raise ConfigError(f"augmult needs at least 1 view, got {views}")
        self.views, self.pad, self.flip = int(views), int(pad), bool(flip)
        self.generator = torch.Generator().manual_seed(
            int(seed) if seed is not None else secrets.randbits(63)
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4:
            raise ConfigError(f"augmult augments images (N, C, H, W); got inputs of shape {tuple(x.shape)}")
        B, C, H, W = x.shape
        K, p = self.views, self.pad
        xs = x.repeat_interleave(K, 0)
        N = B * K
        if N == 0:
            return xs
        if p > 0:
            if p >= H or p >= W:
                raise ConfigError(f"aug_pad {p} must be below the image size {H}×{W}")
            xs = F.pad(xs, (p, p, p, p), mode="reflect")
        g = self.generator
        oy = torch.randint(0, 2 * p + 1, (N,), generator=g).to(x.device)
        ox = torch.randint(0, 2 * p + 1, (N,), generator=g).to(x.device)
        cols = torch.arange(W, device=x.device).expand(N, W)
        if self.flip:
            flip = (torch.rand(N, generator=g) < 0.5).to(x.device)
            cols = torch.where(flip[:, None], W - 1 - cols, cols)
        rows = oy[:, None] + torch.arange(H, device=x.device)[None, :]
        cols = ox[:, None] + cols
        n = torch.arange(N, device=x.device)[:, None, None, None]
        c = torch.arange(C, device=x.device)[None, :, None, None]
        return xs[n, c, rows[:, None, :, None], cols[:, None, None, :]]

    def state_dict(self) -> dict:
        """The generator's state (checkpoints)."""
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        self.generator.set_state(state["generator"])
