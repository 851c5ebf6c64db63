"""Shared types at the bottom of the package: errors and per-party randomness."""

from silofl.core.errors import (
    BudgetExhausted,
    ConfigError,
    DataError,
    ModelRejected,
    PeerModelRejected,
    SiloflError,
)
from silofl.core.randomness import client_seeds, party_seeds

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
