"""Shared types at the bottom of the package: errors and per-party randomness."""

from silofl.core.errors import (
    BudgetExhausted,
    ConfigError,
    DataError,
    ModelRejected,
    PeerModelRejected,
    SiloflError,
)

# client_seeds and party_seeds (silofl.core.randomness) load on first use: that module needs torch, and a
# command that trains nothing (`silofl pubsub list`, `silofl site init`) should not pay for importing it


def __getattr__(name: str):
    if name in ("client_seeds", "party_seeds"):
        from silofl.core import randomness

        return getattr(randomness, name)
    raise AttributeError(f"module 'silofl.core' has no attribute {name!r}")


__all__ = [
    "SiloflError",
    "ConfigError",
    "DataError",
    "BudgetExhausted",
    "PeerModelRejected",
    "ModelRejected",
    "client_seeds",
    "party_seeds",
]
