"""Errors a user can act on. The CLI prints them as one clear line, never a traceback."""


class SiloflError(Exception):
    """Base class for every error silofl raises on purpose."""


class ConfigError(SiloflError, ValueError):
    """A configuration value is invalid or inconsistent with the data."""


class DataError(SiloflError):
    """A data set cannot be found or read."""


class BudgetExhausted(SiloflError):
    """A privacy budget does not allow the requested work."""


class PeerModelRejected(SiloflError):
    """A model received from another site failed validation."""


class ModelRejected(SiloflError):
    """A published model failed validation (on publish or on fetch); the broker is left unchanged."""


class NonFiniteValue(SiloflError):
    """A parameter, gradient or noise value at a site is NaN or infinite: that site's run stops (a NaN model
    is never reported as a result)."""
