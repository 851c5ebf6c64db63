"""silofl: cross-silo learning with measured privacy.

The Python API (:mod:`silofl.api`) is importable from here — ``silofl.run(silofl.RunConfig(...))``,
``silofl.tune``, ``silofl.audit``, ``silofl.compare`` and their result types — loaded on first use.

``silofl.run`` and ``silofl.audit`` are also the subpackages of those names (``silofl.run.loop``,
``silofl.audit.one_run``): calling either runs the API function of its name (:func:`silofl.api.run`,
:func:`silofl.api.audit`), so both ``silofl.run(cfg)`` and ``import silofl.run.loop`` work.
"""

from __future__ import annotations

import types as _types
from typing import TYPE_CHECKING, Any

from silofl.core.errors import (
    BudgetExhausted,
    ConfigError,
    DataError,
    ModelRejected,
    PeerModelRejected,
    SiloflError,
)

__version__ = "0.1.0"

_API = (
    "run",
    "tune",
    "audit",
    "compare",
    "RunConfig",
    "RunResult",
    "TuneResult",
    "AuditResult",
    "CompareResult",
)

__all__ = [
    "SiloflError",
    "ConfigError",
    "DataError",
    "BudgetExhausted",
    "PeerModelRejected",
    "ModelRejected",
    "__version__",
    "run",
    "tune",
    "audit",
    "compare",
    "RunConfig",
    "RunResult",
    "TuneResult",
    "AuditResult",
    "CompareResult",
]

if TYPE_CHECKING:  # pragma: no cover - for type checkers; at run time, module __getattr__ below
    from silofl.api import AuditResult, CompareResult, RunConfig, RunResult, TuneResult, compare, tune


class _CallableModule(_types.ModuleType):
    """A subpackage that is also the API function of its name: ``silofl.run(cfg)`` calls
    :func:`silofl.api.run`,
    ``silofl.run.loop`` is still the module."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from silofl import api

        return getattr(api, self.__name__.rpartition(".")[2])(*args, **kwargs)


def _callable_subpackages() -> None:
    import importlib

    for name in ("run", "audit"):  # both subpackages' __init__ modules are light (no torch, no data)
        importlib.import_module(f"silofl.{name}").__class__ = _CallableModule


_callable_subpackages()


def __getattr__(name: str) -> Any:
    if name in _API:
        from silofl import api

        value = getattr(api, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'silofl' has no attribute {name!r}")
