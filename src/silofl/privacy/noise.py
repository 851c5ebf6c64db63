"""Gaussian noise for DP mechanisms.

``NoiseSource()`` (no seed, the default) draws from :class:`~silofl.core.randomness.SecureRandom`, a
cryptographically secure generator private to the party; ``NoiseSource(seed)`` draws from a seeded
``torch.Generator`` for reproducible research runs (the guarantee then holds only while the seed is
secret).
"""

from __future__ import annotations

import torch

from silofl.core.randomness import SecureRandom


class NoiseSource:
    """N(0, std²) noise for one party's mechanism (see the module doc)."""

    def __init__(self, seed: int | None = None, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.secure = seed is None
        self.generator: torch.Generator | None = None
        self._secure: SecureRandom | None = None
        if self.secure:
            self._secure = SecureRandom()
        else:
            self.generator = torch.Generator(device=self.device)
            self.generator.manual_seed(int(seed))  # type: ignore[arg-type]

    def normal(self, shape: tuple[int, ...], std: float, dtype=torch.float32) -> torch.Tensor:
        """N(0, std²) noise of the given shape and dtype on the source's device."""
        if std == 0:
            return torch.zeros(shape, dtype=dtype, device=self.device)
        if self._secure is not None:
            n = 1
            for s in shape:
                n *= s
            return (self._secure.normal(n) * std).reshape(shape).to(device=self.device, dtype=dtype)
        return torch.normal(0.0, std, size=shape, generator=self.generator, device=self.device, dtype=dtype)

    def state_dict(self) -> dict:
        """The seeded generator's state (a secure source has none to save)."""
        if self.generator is None:
            return {"secure": True}
        return {"secure": False, "generator": self.generator.get_state().clone()}

    def load_state_dict(self, state: dict) -> None:
        """Restore a seeded generator's state (a secure source starts afresh)."""
        if bool(state.get("secure")) != self.secure:
            raise ValueError("noise state and noise source disagree on 'secure'")
        if self.generator is not None:
            self.generator.set_state(state["generator"])
