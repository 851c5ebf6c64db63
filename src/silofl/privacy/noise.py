"""Noise sources for DP mechanisms.

``NoiseSource(seed)`` draws from a seeded ``torch.Generator`` (reproducible runs);
``NoiseSource(secure=True)`` draws Gaussians from the operating system's cryptographic random
source (``os.urandom``) via the Box–Muller transform in float64, for deployments where the noise
must not be predictable from a seed.
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch


class NoiseSource:
    """Gaussian noise for a DP mechanism (see the module doc)."""
    def __init__(self, seed: int | None = None, secure: bool = False, device: torch.device | str = "cpu"):
        self.secure = secure
        self.device = torch.device(device)
        self.generator = None
        if not secure:
            self.generator = torch.Generator(device=self.device)
            self.generator.manual_seed(int(seed or 0))

    def normal(self, shape: tuple[int, ...], std: float, dtype=torch.float32) -> torch.Tensor:
        """N(0, std²) noise of the given shape and dtype on the source's device."""
        if std == 0:
            return torch.zeros(shape, dtype=dtype, device=self.device)
        if self.secure:
            return _secure_normal(shape, std).to(device=self.device, dtype=dtype)
        return torch.normal(0.0, std, size=shape, generator=self.generator, device=self.device, dtype=dtype)


    def state_dict(self) -> dict:
        """The seeded generator's state (a cryptographic source has none to save)."""
        if self.secure:
            return {"secure": True}
        assert self.generator is not None
        return {"secure": False, "generator": self.generator.get_state().clone()}

    def load_state_dict(self, state: dict) -> None:
        """Restore a seeded generator's state."""
        if bool(state.get("secure")) != self.secure:
            raise ValueError("noise state and noise source disagree on 'secure'")
        if not self.secure:
            assert self.generator is not None
            self.generator.set_state(state["generator"])


def _secure_normal(shape: tuple[int, ...], std: float) -> torch.Tensor:
    n = math.prod(shape)
    m = (n + 1) // 2
    u = np.frombuffer(os.urandom(16 * m), dtype=np.uint64).reshape(2, m)
    # 53-bit uniforms in (0, 1]
    u1 = ((u[0] >> np.uint64(11)).astype(np.float64) + 1.0) / 2.0**53
    u2 = (u[1] >> np.uint64(11)).astype(np.float64) / 2.0**53
    r = np.sqrt(-2.0 * np.log(u1))
    z = np.concatenate([r * np.cos(2 * np.pi * u2), r * np.sin(2 * np.pi * u2)])[:n]
    return torch.from_numpy(z * std).reshape(shape)
