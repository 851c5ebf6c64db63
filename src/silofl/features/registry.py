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

from collections.abc import Callable

from silofl.core.errors import ConfigError
from silofl.core.registry import Registry

ENTRY_POINT_GROUP = "silofl.features"
BUILTIN = ("none", "scatter", "backbone")

FEATURES: Registry[type] = Registry(
    "features",
    ENTRY_POINT_GROUP,
    builtins=("silofl.features.none", "silofl.features.scatter", "silofl.features.backbone"),
    order=lambda: BUILTIN,
)


def register(name: str) -> Callable[[type], type]:
    """Class decorator that registers a feature stage under ``name`` (in :data:`FEATURES`; its metadata:
    ``takes_argument``, whether it is named ``name:ARG``)."""

    def deco(cls: type) -> type:
        old = FEATURES.registered(name)
        if old is not None and old.obj is not cls:
            raise ValueError(f"a feature stage named {name!r} is already registered ({old.obj.__module__})")
        cls.name = name  # type: ignore[attr-defined]
        FEATURES.register(name, cls, takes_argument=bool(getattr(cls, "takes_argument", False)))
        return cls

    return deco


def stages() -> dict[str, type]:
    """Every registered feature stage by name, built-ins first."""
    return {n: e.obj for n, e in FEATURES.entries().items()}


def choices() -> tuple[str, ...]:
    """The stages as the CLI names them: ``name``, or ``name:DIR`` for a stage that takes an argument."""
    return tuple(f"{n}:DIR" if getattr(c, "takes_argument", False) else n for n, c in stages().items())


def parse(value: str) -> tuple[str, str | None]:
    """``name`` or ``name:ARG`` (``backbone:DIR``) → (name, ARG); ConfigError naming the choices if
    unknown."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"features must be a name, got {value!r}")
    name, sep, arg = value.strip().partition(":")
    known = stages()
    if name not in known:
        raise ConfigError(f"unknown features {value!r}; choose one of: {', '.join(choices())}")
    cls = known[name]
    if getattr(cls, "takes_argument", False) and not (sep and arg):
        raise ConfigError(f"features {name!r} needs an argument: {name}:DIR")
    if not getattr(cls, "takes_argument", False) and sep:
        raise ConfigError(f"features {name!r} takes no argument, got {value!r}")
    return name, (arg if sep else None)
