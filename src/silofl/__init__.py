"""silofl: cross-silo learning with measured privacy.

The Python API (`silofl.api`) is importable from here — `silofl.run("proxyfl-scatter", out=...)`,
`silofl.tune`, `silofl.audit`, `silofl.compare`, `silofl.deploy_local`, `silofl.predict`, `silofl.export` and
their result types: the plain functions and types of `silofl.api`, loaded on first use. The run layer is the
subpackage `silofl.runner`, the audits `silofl.auditing`.
"""

from __future__ import annotations

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
    "deploy_local",
    "predict",
    "export",
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
    "deploy_local",
    "predict",
    "export",
    "RunConfig",
    "RunResult",
    "TuneResult",
    "AuditResult",
    "CompareResult",
]

if TYPE_CHECKING:  # pragma: no cover - for type checkers; at run time, module __getattr__ below
    from silofl.api import (
        AuditResult,
        CompareResult,
        RunConfig,
        RunResult,
        TuneResult,
        audit,
        compare,
        deploy_local,
        export,
        predict,
        run,
        tune,
    )


def __getattr__(name: str) -> Any:
    if name in _API:
        from silofl import api

        value = getattr(api, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'silofl' has no attribute {name!r}")
