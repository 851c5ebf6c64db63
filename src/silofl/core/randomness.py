"""Where a party's randomness comes from.

By default every party draws everything behind a privacy guarantee — DP noise, Poisson sampling of
examples and of clients — from :class:`SecureRandom`, a cryptographically secure generator (AES-256 in
counter mode, keyed from the operating system's ``os.urandom``), different at every party and never
written anywhere; the rest (model initialisation, shuffles of local SGD) comes from generators seeded
from ``secrets``, also never written.

A run seed (``--seed``) is an explicit opt-in for reproducible *research* runs: every party then gets
its own seeds from ``SeedSequence([run seed, party id])``, so two parties never share a stream and one
party's draws do not depend on how many others exist. Whoever knows that seed can reproduce the noise
and the sampling, so the guarantee then holds only while the seed stays secret; such runs are labelled.
"""

from __future__ import annotations

import math
import os
import secrets

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

SOURCE = "AES-256-CTR keyed from os.urandom (cryptographically secure; never seeded, never saved)"


def client_seeds(run_seed: int, client: int, n: int = 4) -> list[int]:
    """Independent per-party seeds derived from the run seed (model init, sampling, noise, …)."""
    return [int(s) for s in np.random.SeedSequence([int(run_seed), int(client)]).generate_state(n)]


def party_seeds(run_seed: int | None, party: int, n: int = 4) -> list[int]:
    """``client_seeds`` of a seeded research run; fresh secret seeds (``secrets``) otherwise."""
    if run_seed is None:
        return [secrets.randbits(63) for _ in range(n)]
    return client_seeds(run_seed, party, n)


class SecureRandom:
    """A cryptographically secure generator: AES-256 in counter mode with a key and nonce from ``os.urandom``.
    It cannot be seeded and has no state worth saving: a party resuming from a checkpoint gets a fresh key."""

    secure = True

    def __init__(self) -> None:
        self._stream = Cipher(algorithms.AES(os.urandom(32)), modes.CTR(os.urandom(16))).encryptor()

    def bytes(self, n: int) -> bytes:
        """``n`` pseudo-random bytes."""
        return self._stream.update(bytes(n))

    def _words(self, n: int) -> torch.Tensor:
        """``n`` 53-bit integers (as int64)."""
        raw = (
            torch.frombuffer(bytearray(self.bytes(8 * n)), dtype=torch.int64)
            if n
            else torch.zeros(0, dtype=torch.int64)
        )
        return (raw >> 11) & ((1 << 53) - 1)

    def uniform(self, n: int) -> torch.Tensor:
        """``n`` float64 uniforms in [0, 1) with 53 random bits each."""
        return self._words(n).to(torch.float64) * 2.0**-53

    def normal(self, n: int) -> torch.Tensor:
        """``n`` float64 standard normals (Box–Muller on 53-bit uniforms; u₁ in (0, 1] so the log is
        finite)."""
        m = (n + 1) // 2
        w = self._words(2 * m).view(2, m)
        u1 = (w[0].to(torch.float64) + 1.0) * 2.0**-53
        u2 = w[1].to(torch.float64) * 2.0**-53
        r = torch.sqrt(-2.0 * torch.log(u1))
        t = 2.0 * math.pi * u2
        return torch.cat([r * torch.cos(t), r * torch.sin(t)])[:n]

    def state_dict(self) -> dict:
        """Nothing of a secure generator is ever saved."""
        return {"secure": True}
