"""Recipes: what to run, as named, versioned YAML files.

A recipe names a method, its data, features, models, optimiser and budget — what to run, not where (no run
folder, no engine). silofl ships its recipes as package data (``src/silofl/recipes/NAME.yaml``:
``proxyfl-scatter``, the README's main job; ``proxyfl-paper``, the ProxyFL papers' settings;
``proxyfl-table``, per-site tables); a user's recipe is a file of the same form given by its path:

```yaml
recipe: NAME          # the name it is known by
version: 1            # bumped when what it runs changes
summary: one paragraph: what it runs
source: where its settings come from (a study, a paper)
run:                  # the run options, as in a config file (a method's own under its name)
  method: proxyfl
  ...
```

``silofl run RECIPE [--set k=v …] [--out DIR]`` (and ``silofl.run("RECIPE", out=…)``) runs it: given
options override the recipe's (flags > ``--set`` > ``--config`` > the recipe > the defaults). A recipe is
validated like any config when it is read (`RunConfig.from_dict`: a key given twice, an unknown option,
an option the method does not have, a value of the wrong type are one-line ConfigErrors).
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from silofl.core.errors import ConfigError
from silofl.runner.config import RunConfig, load_yaml_mapping, merge_options

KEYS = ("recipe", "version", "summary", "source", "run")
SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class Recipe:
    """A named, versioned run recipe: its run options (a mapping for `RunConfig.from_dict`)."""

    name: str
    version: int
    summary: str
    source: str
    options: dict[str, Any]
    path: str  # where it was read (a package file or the user's)

    def config(self, overrides: Mapping[str, Any] | None = None) -> RunConfig:
        """The recipe's config with ``overrides`` (flat options, or a method's own under its name) over it."""
        return RunConfig.from_dict(merge_options(self.options, dict(overrides or {})))

    def to_yaml(self) -> str:
        """The recipe as its file holds it."""
        data = {"recipe": self.name, "version": self.version, "summary": self.summary, "source": self.source}
        return yaml.safe_dump({**data, "run": self.options}, sort_keys=False, allow_unicode=True, width=110)


def _package_folder() -> Any:
    return importlib.resources.files("silofl") / "recipes"


def recipe_names() -> tuple[str, ...]:
    """The recipes silofl ships, by name."""
    return tuple(
        sorted(p.name[: -len(".yaml")] for p in _package_folder().iterdir() if p.name.endswith(".yaml"))
    )


def is_recipe_path(ref: str | Path) -> bool:
    """Whether ``ref`` names a recipe file (a path ending in .yaml/.yml) rather than a shipped recipe."""
    return str(ref).endswith(SUFFIXES) or "/" in str(ref)


def load_recipe(ref: str | Path) -> Recipe:
    """The shipped recipe named ``ref``, or the recipe file at the path ``ref``; a one-line ConfigError
    otherwise."""
    if is_recipe_path(ref):
        return parse_recipe(load_yaml_mapping(ref), str(ref))
    name = str(ref)
    if name not in recipe_names():
        raise ConfigError(
            f"unknown recipe {name!r}; silofl's recipes: {', '.join(recipe_names())} (or a recipe file's "
            "path, NAME.yaml)"
        )
    with importlib.resources.as_file(_package_folder() / f"{name}.yaml") as path:
        return parse_recipe(load_yaml_mapping(path), f"silofl/recipes/{name}.yaml")


def parse_recipe(data: Mapping[str, Any], where: str) -> Recipe:
    """A recipe from its file's mapping, validated: its own keys, and its run options as a config."""
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise ConfigError(
            f"recipe {where}: unknown key(s) {', '.join(map(str, unknown))}; a recipe has {KEYS}"
        )
    missing = [k for k in ("recipe", "version", "run") if k not in data]
    if missing:
        raise ConfigError(f"recipe {where} lacks {', '.join(missing)} (a recipe has {', '.join(KEYS)})")
    name, version, run = data["recipe"], data["version"], data["run"]
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"recipe {where}: 'recipe' must be its name, got {name!r}")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ConfigError(f"recipe {where}: 'version' must be a positive integer, got {version!r}")
    if not isinstance(run, dict):
        raise ConfigError(f"recipe {where}: 'run' must be a mapping of run options, got {type(run).__name__}")
    try:
        RunConfig.from_dict(run)  # validated like any config
    except ConfigError as e:
        raise ConfigError(f"recipe {where}: {e}") from None
    text = {k: str(data.get(k) or "").strip() for k in ("summary", "source")}
    return Recipe(name, version, text["summary"], text["source"], dict(run), where)


def recipe_of(cfg: RunConfig, name: str, summary: str, source: str, version: int = 1) -> Recipe:
    """``cfg`` as a recipe: what it runs (every option but where: the run folder, device and threads)."""
    data = cfg.to_dict()
    for where in ("out", "device", "threads"):
        data.pop(where, None)
    return Recipe(name, version, summary, source, data, "")
