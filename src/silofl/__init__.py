"""silofl: cross-silo learning with measured privacy."""

from silofl.core.errors import (
    BudgetExhausted,
    ConfigError,
    DataError,
    ModelRejected,
    PeerModelRejected,
    SiloflError,
)

__version__ = "0.1.0"

__all__ = ["SiloflError", "ConfigError", "DataError", "BudgetExhausted", "PeerModelRejected", "ModelRejected", "__version__"]
