"""Install a throw-away third-party package for a test: its modules on ``sys.path`` and a ``*.dist-info``
folder whose ``entry_points.txt`` names them, as ``pip install`` leaves a package that declares
``[project.entry-points."silofl.datasets"]`` and the like. ``importlib.metadata`` finds it like any other."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path


def install(
    root: Path, monkeypatch, dist: str, modules: dict[str, str], entry_points: dict[str, dict[str, str]]
) -> Path:
    """Write ``modules`` (name → source) and ``dist``'s dist-info with ``entry_points`` (group → {name:
    module}) under ``root``, put ``root`` first on ``sys.path`` (undone by ``monkeypatch``) and return it. The
    caller forgets the modules and its registrations afterwards (:func:`forget`)."""
    root.mkdir(parents=True, exist_ok=True)
    for name, source in modules.items():
        (root / f"{name}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{n} = {m}\n" for n, m in eps.items()) + "\n"
            for group, eps in entry_points.items()
        )
    )
    monkeypatch.syspath_prepend(str(root))
    return root


def forget(modules, registrations) -> None:
    """Drop the plug-in's modules and its entries (``(registry, name)`` pairs), and let the registries read
    their entry-point groups again."""
    for name in modules:
        sys.modules.pop(name, None)
    for registry, name in registrations:
        registry.unregister(name)
        registry.rescan()
