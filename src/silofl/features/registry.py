"""The one list of feature stages: each registers itself with :func:`register`.

A feature stage is one module and one registration::

    @register("mystage")
    class MyStage(FeatureStage): ...

Built-in stages live in :mod:`silofl.features` (``none``, ``scatter``, ``backbone``). Another package adds one
without editing silofl by exposing a module in the ``silofl.features`` entry-point group
(``[project.entry-points."silofl.features"] mystage = "mypkg.mystage"``); importing that module registers it.
The configuration, the CLI's errors and the run folder's record all read this registry.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from importlib.metadata import entry_points

from silofl.core.errors import ConfigError

log = logging.getLogger("silofl")

ENTRY_POINT_GROUP = "silofl.features"
BUILTIN = ("none", "scatter", "backbone")

_REGISTRY: dict[str, type] = {}
_loaded = False


def register(name: str) -> Callable[[type], type]:
    """Class decorator that registers a feature stage under ``name``."""

    def deco(cls: type) -> type:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"a feature stage named {name!r} is already registered ({_REGISTRY[name].__module__})")
        cls.name = name  # type: ignore[attr-defined]
        _REGISTRY[name] = cls
        return cls

    return deco


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    from silofl.features import backbone, none, scatter  # noqa: F401 - the built-in stages register on import

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except Exception as e:  # noqa: BLE001 - a broken plug-in must not break silofl
            log.warning("feature plug-in %s (%s) failed to load: %s", ep.name, ep.value, e)


def stages() -> dict[str, type]:
    """Every registered feature stage by name, built-ins first."""
    _load()
    return {**{n: _REGISTRY[n] for n in BUILTIN if n in _REGISTRY},
            **{n: c for n, c in _REGISTRY.items() if n not in BUILTIN}}


def parse(value: str) -> tuple[str, str | None]:
    """``name`` or ``name:ARG`` (``backbone:DIR``) → (name, ARG); ConfigError naming the choices if unknown."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"features must be a name, got {value!r}")
    name, sep, arg = value.strip().partition(":")
    known = stages()
    if name not in known:
        choices = ", ".join(f"{n}:DIR" if getattr(c, "takes_argument", False) else n for n, c in known.items())
        raise ConfigError(f"unknown features {value!r}; choose one of: {choices}")
    cls = known[name]
    if getattr(cls, "takes_argument", False) and not (sep and arg):
        raise ConfigError(f"features {name!r} needs an argument: {name}:DIR")
    if not getattr(cls, "takes_argument", False) and sep:
        raise ConfigError(f"features {name!r} takes no argument, got {value!r}")
    return name, (arg if sep else None)
