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

Defaults per kind of data (`with_family_defaults`): a run that names no recipe takes the settings it
does not give from the recipe of its data's family (`FAMILY_RECIPES`), chosen from the data
declaration — a table with a class target (``--dataset table`` and a schema): ``proxyfl-table`` — and
records it (``defaults``: config.yaml, the plan). A family without a recipe (survival and regression tables,
the image benchmarks: their bare defaults are the papers' settings) keeps the bare defaults.
``--defaults NAME`` takes another recipe's settings as defaults, ``--defaults none`` the bare ones. A
recipe's settings fill in by group (`GROUPS`): a run that gives any of a group's options (its
optimiser, its sampling, its privacy budget) keeps its own group whole, so a recipe's SGD learning rate never
meets a given Adam. With a method other than the recipe's, only the options that method has are taken.
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


# the family of a run's data → the recipe its defaults come from (None: silofl's bare defaults)
FAMILY_RECIPES: dict[str, str | None] = {
    "table": "proxyfl-table",  # a table with a class target
    "table-survival": None,
    "table-regression": None,
}
NO_RECIPE = "none"  # --defaults none: the bare defaults
GROUPS = (  # a recipe's options that only make sense together: given one, the run keeps its own group
    ("optimizer", "lr", "momentum", "nesterov", "weight_decay", "optimizer_state", "clip"),
    ("sample_rate", "batch_size", "local_steps", "samples_per_client"),
    ("target_epsilon", "target_epsilons", "noise_multiplier", "calibrate_noise", "delta", "privacy"),
)


def data_family(options: Mapping[str, Any]) -> str | None:
    """The family of the data a run's options declare: ``table`` (a class target), ``table-survival``,
    ``table-regression``; None for anything else or a schema that does not load (the run reports that)."""
    if options.get("dataset") != "table" or not options.get("schema"):
        return None
    from silofl.data.schema import Schema

    try:
        task = Schema.load(str(options["schema"])).task
    except Exception:  # noqa: BLE001 - the run itself reports a bad schema, with its one-line error
        return None
    return "table" if task == "classification" else f"table-{task}"


def family_recipe(options: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(the recipe whose settings fill in what ``options`` do not give — None: the bare defaults —, the
    data family it was chosen for, None when named by ``defaults``)."""
    given = options.get("defaults")
    if given == NO_RECIPE:
        return None, None
    if given:
        return str(given), None
    family = data_family(options)
    return (FAMILY_RECIPES.get(family) if family else None), family


def with_family_defaults(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` (a run that names no recipe) over the settings of its data family's recipe
    (`family_recipe`), group by group (`GROUPS`), with ``defaults`` recording the recipe (or
    ``none``); unchanged but for that record when there is none."""
    from silofl.fl.registry import method_info, methods

    name, family = family_recipe(options)
    if name is None:
        return {**options, "defaults": NO_RECIPE} if family or options.get("defaults") else dict(options)
    recipe = load_recipe(name)
    method = options.get("method", recipe.options.get("method", RunConfig.method))
    known = methods()
    flat = {k: v for k, v in recipe.options.items() if not (k in known and isinstance(v, dict))}
    for k, v in recipe.options.items():  # the recipe's method section, flat
        if k == recipe.options.get("method") and isinstance(v, dict):
            flat.update(v)
    own = set(RunConfig.common_fields()) | set(method_info(str(method)).options.field_names())
    given = set(options)
    for k, v in options.items():  # a method section's options count as given
        if k in known and isinstance(v, dict):
            given |= set(v)
    kept = {k: v for k, v in flat.items() if k in own and k not in given}
    for group in GROUPS:
        if given & set(group):
            kept = {k: v for k, v in kept.items() if k not in group}
    return {**kept, **options, "method": method, "defaults": name}


def defaults_line(cfg: RunConfig) -> str:
    """The plan's line on where the run's defaults came from."""
    name = cfg.defaults
    if name == NO_RECIPE:
        family = data_family({"dataset": cfg.dataset, "schema": cfg.schema})
        why = f" (no recipe for a {family.replace('-', ' ')} yet)" if family else ""
        return f"defaults: silofl's bare defaults{why}"
    family = data_family({"dataset": cfg.dataset, "schema": cfg.schema})
    chosen = FAMILY_RECIPES.get(family) == name if family else False
    how = f", chosen from the data (a {family.replace('-', ' ')})" if chosen and family else ""
    return f"defaults: recipe {name}{how}; what was given wins (--defaults none: the bare defaults)"
