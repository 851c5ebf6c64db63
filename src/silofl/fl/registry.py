"""The one list of methods: each registers itself with :func:`register`.

A method is one module and one registration::

    @register("mymethod", options=MyOptions, headline="global_acc", exchange="server",
              description="…", metrics=("global_acc",))
    class MyMethod(Method): ...

Built-in methods live in :mod:`silofl.fl.methods`. Another package adds a method without editing
silofl by exposing a module in the ``silofl.methods`` entry-point group (``[project.entry-points."silofl.methods"]
mymethod = "mypkg.mymethod"`` in its ``pyproject.toml``); importing that module registers it. The
configuration, the CLI, ``silofl compare``, the engines and the reports all read this registry.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points

from silofl.core.errors import ConfigError
from silofl.privacy.guarantee import MethodTraits

log = logging.getLogger("silofl")

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


_REGISTRY: dict[str, MethodInfo] = {}
_loaded = False


def register(name: str, *, options: type, headline: str, exchange: str, description: str,
             metrics: tuple[str, ...], mutual_learning: bool = False, level: str = "example", pooled: bool = False,
             nonprivate: bool = False) -> Callable[[type], type]:
    """Class decorator that registers a method under ``name``."""
    if exchange not in EXCHANGES:
        raise ValueError(f"exchange must be one of {EXCHANGES}, got {exchange!r}")
    if headline not in metrics or not set(metrics) <= set(ACC_FIELDS):
        raise ValueError(f"metrics {metrics} must be among {ACC_FIELDS} and include the headline {headline!r}")

    def deco(cls: type) -> type:
        if name in _REGISTRY and _REGISTRY[name].cls is not cls:
            raise ValueError(f"a method named {name!r} is already registered ({_REGISTRY[name].cls.__module__})")
        traits = MethodTraits(mutual_learning=mutual_learning, level=level, pooled=pooled, nonprivate=nonprivate)
        _REGISTRY[name] = MethodInfo(name, cls, options, headline, exchange, traits, description, tuple(metrics))
        return cls

    return deco


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    from silofl.fl.methods import ORDER  # the built-in methods register on import

    builtin = {name: _REGISTRY[name] for name in ORDER if name in _REGISTRY}
    rest = {name: info for name, info in _REGISTRY.items() if name not in builtin}
    _REGISTRY.clear()
    _REGISTRY.update({**builtin, **rest})
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except Exception as e:  # noqa: BLE001 - a broken plug-in must not break silofl
            log.warning("method plug-in %s (%s) failed to load: %s", ep.name, ep.value, e)


def methods() -> dict[str, MethodInfo]:
    """Every registered method by name, built-ins first."""
    _load()
    return dict(_REGISTRY)


def method_info(name: str) -> MethodInfo:
    """The registered method ``name``; ConfigError naming the choices if there is none."""
    known = methods()
    if name not in known:
        raise ConfigError(f"unknown method {name!r}; choose one of: {', '.join(known)}")
    return known[name]
