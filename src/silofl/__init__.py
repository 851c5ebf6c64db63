"""silofl: cross-silo learning with measured privacy."""

from silofl.errors import BudgetExhausted, ConfigError, DataError, PeerModelRejected, SiloflError

__version__ = "0.1.0"

__all__ = ["SiloflError", "ConfigError", "DataError", "BudgetExhausted", "PeerModelRejected", "__version__"]
