"""The one list of methods: each registers itself with :func:`register`.

A method is one module and one registration::

    @register("mymethod", options=MyOptions, headline="global_acc", exchange="server",
              description="…", metrics=("global_acc",))
    class MyMethod(Method): ...

Built-in methods live in :mod:`silofl.fl.methods`. Another package adds a method without editing
silofl by exposing a module in the ``silofl.methods`` entry-point group
(``[project.entry-points."silofl.methods"]
mymethod = "mypkg.mymethod"`` in its ``pyproject.toml``); importing that module registers it. The
configuration, the CLI, ``silofl compare``, the engines and the reports all read this registry
(:data:`METHODS`, a :class:`silofl.core.registry.Registry`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from silofl.core.registry import Registry
from silofl.privacy.guarantee import MethodTraits

ENTRY_POINT_GROUP = "silofl.methods"
EXCHANGES = ("gossip", "server", "cycle", "none")
ACC_FIELDS = ("private_acc", "proxy_acc", "global_acc", "combined_acc")  # combined: silofl.site.combine


@dataclass(frozen=True)
class MethodInfo:
    """A registered method: how to build it, how it is judged, what its privacy traits are."""

    name: str
    cls: type
    options: type
    headline: str  # the accuracy field the method is judged by
    exchange: str  # gossip | server | cycle | none
    traits: MethodTraits
    description: str
    metrics: tuple[str, ...]  # the accuracy fields its sites report

    @property
    def mutual_learning(self) -> bool:
        """Whether its sites train a private model by mutual learning with the shared one."""
        return self.traits.mutual_learning

    @property
    def client_level(self) -> bool:
        """Whether it protects whole clients (server noise) rather than examples."""
        return self.traits.level == "client"


def _builtin_order() -> tuple[str, ...]:
    from silofl.fl.methods import ORDER

    return ORDER


METHODS: Registry[MethodInfo] = Registry(
    "method", ENTRY_POINT_GROUP, builtins=("silofl.fl.methods",), order=_builtin_order
)


def register(
    name: str,
    *,
    options: type,
    headline: str,
    exchange: str,
    description: str,
    metrics: tuple[str, ...],
    mutual_learning: bool = False,
    level: str = "example",
    pooled: bool = False,
    nonprivate: bool = False,
) -> Callable[[type], type]:
    """Class decorator that registers a method under ``name`` (in :data:`METHODS`)."""
    if exchange not in EXCHANGES:
        raise ValueError(f"exchange must be one of {EXCHANGES}, got {exchange!r}")
    if headline not in metrics or not set(metrics) <= set(ACC_FIELDS):
        raise ValueError(
            f"metrics {metrics} must be among {ACC_FIELDS} and include the headline {headline!r}"
        )

    def deco(cls: type) -> type:
        old = METHODS.registered(name)
        if old is not None:
            if old.obj.cls is not cls:
                raise ValueError(f"a method named {name!r} is already registered ({old.obj.cls.__module__})")
            return cls
        traits = MethodTraits(
            mutual_learning=mutual_learning, level=level, pooled=pooled, nonprivate=nonprivate
        )
        info = MethodInfo(name, cls, options, headline, exchange, traits, description, tuple(metrics))
        METHODS.register(name, info, exchange=exchange, headline=headline, level=level)
        return cls

    return deco


def methods() -> dict[str, MethodInfo]:
    """Every registered method by name, built-ins first (in :data:`silofl.fl.methods.ORDER`)."""
    return {name: e.obj for name, e in METHODS.entries().items()}


def method_info(name: str) -> MethodInfo:
    """The registered method ``name``; ConfigError naming the choices if there is none."""
    return METHODS.get(name)
