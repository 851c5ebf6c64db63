"""The import graph of src/silofl, measured with grimp (import-linter's engine): the files that sit in an
import circle, the packages each circle spans, and the imports that run from a lower layer up to a higher one.

    .venv/bin/python scripts/import_graph.py          # the figures
    .venv/bin/python scripts/import_graph.py -v       # and every circle and upward import

Every import counts, a lazy one inside a function as much as one at the top of a file. The layers are read
from pyproject.toml's import-linter layers contract (the one from silofl.core up to silofl.cli).
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import grimp


def read_layers() -> list[set[str]]:
    """The subpackages of each layer, lowest first, from pyproject.toml's layers contract."""
    config = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["type"] == "layers" and "silofl.cli" in c["layers"])["layers"]
    return [
        {m.strip().removeprefix("silofl.") for m in line.replace("|", ":").split(":")}
        for line in layers[::-1]
    ]


LAYERS = read_layers()


def package(module: str) -> str:
    """The top-level subpackage of ``silofl.X.…`` (``X``), or ``silofl`` for the package's own __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "silofl"


def layer(module: str) -> int:
    """The index of the layer ``module`` belongs to; the package's own ``__init__`` re-exports the API, so it
    is the API's layer."""
    name = "api" if module == "silofl" else package(module)
    for i, members in enumerate(LAYERS):
        if name in members:
            return i
    raise ValueError(f"{module}: in no layer (add its package to LAYERS)")


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of the module graph with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def upward(graph: grimp.ImportGraph) -> list[tuple[str, str]]:
    """Every import from a module of a lower layer to one of a higher layer (importer, imported)."""
    arrows = []
    for importer in sorted(graph.modules):
        low = layer(importer)
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            if layer(imported) > low:
                arrows.append((importer, imported))
    return arrows


def main(argv: list[str]) -> int:
    """Print the figures (and with -v the circles and arrows)."""
    graph = grimp.build_graph("silofl", include_external_packages=False)
    found = circles(graph)
    arrows = upward(graph)
    files = sum(len(c) for c in found)
    spans = [len({package(m) for m in c}) for c in found]
    print(f"modules: {len(graph.modules)}  imports: {graph.count_imports()}")
    widest = max(spans, default=0)
    print(f"circles: {len(found)}  files in circles: {files}  packages the widest spans: {widest}")
    print(f"circles spanning more than one package: {sum(s > 1 for s in spans)}")
    print(f"imports from a lower layer up: {len(arrows)}")
    if "-v" in argv:
        for c in found:
            print(f"circle ({len({package(m) for m in c})} packages): {' '.join(c)}")
        for a, b in arrows:
            print(f"up: {a} -> {b}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
