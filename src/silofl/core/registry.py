"""One registry type for every extension point chosen by name: methods, datasets, models, features,
accountants and engines.

A registry maps a name to an object (a class, a loader function, a spec) plus free-form metadata. Built-ins
register themselves when their module is imported (``builtins``: the module(s) that hold them); another
package
adds one without editing silofl by exposing a module in the registry's entry-point group, e.g.::

    [project.entry-points."silofl.datasets"]
    mydata = "mypkg.mydata"

Importing that module registers it (``@DATASETS.register("mydata")``). A plug-in that fails to import is
logged and skipped: it must not break silofl. Lookups of unknown names raise a one-line :class:`ConfigError`
that names the choices, so CLI errors and help texts come from the registries, never from a hand-kept list.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

from silofl.core.errors import ConfigError

log = logging.getLogger("silofl")
T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    """A registered object, its name and metadata (``meta``: whatever the registry's users read)."""

    name: str
    obj: T
    meta: dict[str, Any] = field(default_factory=dict)


class Registry(Generic[T]):
    """Objects of one kind by name; built-ins first (in ``builtins``' registration order), then plug-ins."""

    def __init__(
        self,
        kind: str,
        group: str,
        builtins: tuple[str, ...] = (),
        order: Callable[[], Iterable[str]] | None = None,
    ) -> None:
        self.kind = kind  # "dataset", "model", …: the word error messages use
        self.group = group  # the entry-point group, e.g. "silofl.datasets"
        self._builtins = builtins  # modules whose import registers the built-ins
        self._order = order  # names listed first, in this order, once the built-ins are imported
        self._entries: dict[str, Entry[T]] = {}
        self._loading = False
        self._loaded = False

    # ------------------------------------------------------------------ registering
    def register(self, name: str, obj: T | None = None, **meta: Any) -> Any:
        """Register ``obj`` under ``name`` (or, without ``obj``, a decorator that does). Registering the same
        object twice is harmless (also the same class or function of a module imported again); another object
        under a taken name is an error."""
        if not isinstance(name, str) or not name or name != name.strip() or ":" in name:
            raise ValueError(f"a {self.kind} name must be a non-empty word without ':', got {name!r}")

        def add(o: T) -> T:
            old = self._entries.get(name)
            if old is not None and old.obj is not o and _where(old.obj) != _where(o):
                raise ValueError(
                    f"a {self.kind} named {name!r} is already registered "
                    f"({getattr(old.obj, '__module__', '?')})"
                )
            self._entries[name] = Entry(name, o, dict(meta))
            return o

        return add(obj) if obj is not None else add

    def unregister(self, name: str) -> None:
        """Drop ``name`` (tests that register a throw-away plug-in clean up with it)."""
        self._entries.pop(name, None)

    def registered(self, name: str) -> Entry[T] | None:
        """The entry registered as ``name`` so far, or None — without importing the built-ins or plug-ins
        (what a registering function may ask)."""
        return self._entries.get(name)

    def rescan(self) -> None:
        """Read the entry-point group again at the next lookup (a plug-in installed since the first read, as
        tests install one)."""
        self._loaded = False

    # ------------------------------------------------------------------ reading
    def _load(self) -> None:
        if self._loaded or self._loading:
            return
        self._loading = True
        try:
            for mod in self._builtins:
                importlib.import_module(mod)
            if self._order is not None:
                first = [n for n in self._order() if n in self._entries]
                self._entries = {**{n: self._entries[n] for n in first}, **self._entries}
            for ep in entry_points(group=self.group):
                try:
                    ep.load()
                except Exception as e:  # noqa: BLE001 - a broken plug-in must not break silofl
                    log.warning("%s plug-in %s (%s) failed to load: %s", self.kind, ep.name, ep.value, e)
            self._loaded = True
        finally:
            self._loading = False

    def entries(self) -> dict[str, Entry[T]]:
        """Every registered entry by name, built-ins first."""
        self._load()
        return dict(self._entries)

    def names(self) -> tuple[str, ...]:
        """Every registered name, built-ins first (what CLI choices and error messages list)."""
        return tuple(self.entries())

    def get(self, name: str) -> T:
        """The object registered as ``name``; a one-line ConfigError naming the choices if there is none."""
        return self.entry(name).obj

    def entry(self, name: str) -> Entry[T]:
        """The entry registered as ``name``; a one-line ConfigError naming the choices if there is none."""
        known = self.entries()
        if name not in known:
            raise ConfigError(f"unknown {self.kind} {name!r}; choose one of: {', '.join(known)}")
        return known[name]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.entries()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.entries())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, group={self.group!r}, names={list(self._entries)})"


def _where(obj: Any) -> tuple[Any, Any]:
    """(module, qualified name) of a class or function — the same one when its module was imported again;
    unique (its identity) for anything else."""
    q = getattr(obj, "__qualname__", None) if isinstance(obj, type) or callable(obj) else None
    if q is None or "<lambda>" in q:
        return (id(obj), None)
    return (getattr(obj, "__module__", None), q)


def load_ref(ref: str) -> Any:
    """The object a ``"package.module:attribute"`` reference names (imported now): how registries name what
    they must not import before it is used (an engine's runner needs flwr, a layer above the registry's)."""
    mod, sep, attr = ref.partition(":")
    if not (mod and sep and attr):
        raise ValueError(f"a reference is 'package.module:attribute', got {ref!r}")
    obj: Any = importlib.import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def check_choice(registry: Registry[Any], name: str, what: str | None = None) -> str:
    """``name`` if ``registry`` has it, else a one-line ConfigError (``what``: the option's name in the
    message)."""
    if name not in registry:
        raise ConfigError(
            f"unknown {what or registry.kind} {name!r}; choose one of: {', '.join(registry.names())}"
        )
    return name
