"""Command-line options generated from the configuration dataclasses.

:class:`ConfigCommand` (through the :func:`config_command` decorator) gives a command one flag per field of
:class:`~silofl.runner.config.RunConfig` and per field of every registered method's options dataclass
(:mod:`silofl.fl.options`, each method's ``options=`` class), so a plug-in method's options become flags
without editing silofl:

* the flag name comes from the field name (``noise_multiplier`` → ``--noise-multiplier``; a ``bool`` gives
  ``--name/--no-name``), its type from the annotation (``int``, ``float``, ``str``, ``bool``, comma-separated
  ``list[float]`` / ``list[int]`` / ``list[str]``, ``tuple[str, str]`` → two values);
* the help text and help panel (data / privacy / method / engine / output) from the field's
  ``metadata={"help": …, "panel": …}`` (:func:`silofl.fl.options.option` writes it for every built-in option;
  an option several methods define with different texts shows them all; a plug-in's field without metadata
  gets a generic line), the choices from the registries (one function per kind of choice: :data:`CHOICES`),
  and the default the configuration would use;
* a method option several methods share (``lr``, ``dml_alpha``) is one flag.

Every generated flag defaults to "not given": :func:`config_flags` returns only the flags the user gave, so
the
precedence stays flags > ``--set`` > ``--config FILE.yaml`` > the defaults, and an option the chosen method
does
not have is the configuration's one-line error. The flags are generated when the command is used (not when
silofl
is imported), so a method registered later — from a test module or an entry point — has its flags too.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click
import typer
from typer.core import TyperCommand, TyperOption

from silofl.core.errors import ConfigError

FLAGS_KEY = "silofl.config_flags"
PANELS = {"data": "Data", "privacy": "Privacy", "method": "Method", "engine": "Engine", "output": "Output"}
NOT_FLAGS = ("options", "data_at_sites", "sites_task")  # set by silofl itself (`silofl deploy start`)


# ---------------------------------------------------------------------------------------------- choices
# One function per kind of choice, each reading the one list silofl keeps of it (point them at the
# registries).
def method_names() -> tuple[str, ...]:
    """The registered methods (silofl.fl.registry), built-ins first."""
    from silofl.fl.registry import METHODS

    return METHODS.names()


def dataset_names() -> tuple[str, ...]:
    """The registered data sets (silofl.data.datasets)."""
    from silofl.data.datasets import dataset_names as names

    return tuple(names())


def model_names() -> tuple[str, ...]:
    """The registered model architectures (silofl.models)."""
    from silofl.models import model_names as names

    return tuple(names())


def accountant_names() -> tuple[str, ...]:
    """The registered accountants (silofl.privacy.analysis)."""
    from silofl.privacy.analysis import ACCOUNTANTS

    return ACCOUNTANTS.names()


def feature_names() -> tuple[str, ...]:
    """The registered feature stages (silofl.features.registry), ``backbone:DIR`` with its argument."""
    from silofl.features.registry import choices

    return tuple(choices())


def metric_names() -> tuple[str, ...]:
    """The headline metrics (silofl.training.metrics)."""
    from silofl.training.metrics import METRICS

    return tuple(METRICS)


def engine_names() -> tuple[str, ...]:
    """The engines a run can be given by name (silofl.comm.engines)."""
    from silofl.comm.engines import selectable_engines

    return selectable_engines()


def _const(*names: str) -> Callable[[], tuple[str, ...]]:
    return lambda: names


def _from(module: str, name: str) -> Callable[[], tuple[str, ...]]:
    def get() -> tuple[str, ...]:
        import importlib

        return tuple(getattr(importlib.import_module(module), name))

    return get


CHOICES: dict[str, Callable[[], tuple[str, ...]]] = {
    "method": method_names,
    "dataset": dataset_names,
    "private_model": model_names,
    "proxy_model": model_names,
    "accountant": accountant_names,
    "features": feature_names,
    "metric": metric_names,
    "privacy": _from("silofl.privacy.guarantee", "PRIVACY_MODES"),
    "partition": _from("silofl.runner.config", "PARTITIONS"),
    "device": _from("silofl.runner.config", "DEVICES"),
    "eval_split": _from("silofl.runner.config", "EVAL_SPLITS"),
    "combine": _from("silofl.site.combine", "COMBINE_MODES"),
    "graph": _from("silofl.fl.options", "GRAPHS"),
    "dp_backend": _from("silofl.fl.options", "DP_BACKENDS"),
    "optimizer_state": _from("silofl.fl.options", "OPTIMIZER_STATE"),
    "aggregation": _from("silofl.fl.options", "AGGREGATIONS"),
    "optimizer": _from("silofl.fl.options", "DP_OPTIMIZERS"),
    "privacy_unit": _from("silofl.fl.options", "PRIVACY_UNITS"),
    "intermediaries": _const("none", "V", "adaptive"),
}


class RegistryChoice(click.Choice):
    """A generated flag's choices from its registry, as a `click.Choice` (help, shell completion). A value
    outside them is handed on unchanged: the config refuses it in one line, by the same rule for the command
    line, recipes and Python (a plug-in registered later, ``backbone:DIR`` with its argument, pass)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """The choice ``value`` names, or ``value`` itself for the config to judge."""
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            return value


# ---------------------------------------------------------------------------------------------- the flags
@dataclass(frozen=True)
class Flag:
    """One generated flag: the field it sets, how it is read from the command line, where its help goes."""

    name: str
    kind: str  # int | float | str | bool | list[float] | list[int] | list[str] | pair | clip
    help: str
    panel: str
    default: Any = None
    methods: tuple[str, ...] = ()  # method options: the methods that have it ("" for RunConfig fields)

    @property
    def flag(self) -> str:
        """The option's name on the command line (``noise_multiplier`` → ``--noise-multiplier``)."""
        return "--" + self.name.replace("_", "-")

    def option(self) -> TyperOption:
        """The click option (default "not given"; the configuration's default is shown)."""
        kw: dict[str, Any] = {}
        if self.name == "report_nonprivate":
            decls = ["--report-nonprivate/--keep-nonprivate", self.name]
            kw["is_flag"] = True
        elif self.kind == "bool":
            decls = [f"{self.flag}/--no-{self.flag[2:]}", self.name]
            kw["is_flag"] = True
        else:
            decls = [self.flag, self.name]
            kw["type"] = {"int": click.INT, "float": click.FLOAT}.get(self.kind, click.STRING)
            if self.kind == "pair":
                kw["nargs"] = 2
                kw["metavar"] = "KIND DIR" if self.name == "track" else "A B"
            elif self.kind.startswith("list["):
                kw["metavar"] = "A,B,…"
            elif self.kind == "clip":
                kw["metavar"] = "C|adaptive[:C0]"
            choices = CHOICES.get(self.name)
            if choices is not None and self.kind == "str":
                kw["type"] = RegistryChoice(choices())
            elif choices is not None:
                kw["metavar"] = "[" + "|".join(choices()) + "]"
        shown = (
            self.default if self.default is not None and not isinstance(self.default, (list, tuple)) else None
        )
        help_text = self.help
        if self.methods:
            help_text += f" [methods: {', '.join(self.methods)}]"
        return TyperOption(
            param_decls=decls,
            default=None,
            required=False,
            help=help_text,
            show_default=_show(shown) if shown is not None else False,
            rich_help_panel=PANELS.get(self.panel, self.panel),
            **kw,
        )

    def parse(self, value: Any) -> dict[str, Any]:
        """The configuration options a given value sets."""
        if self.kind == "clip":
            return parse_clip(value)
        if self.kind.startswith("list["):
            return {self.name: parse_list(value, self.flag, self.kind[5:-1])}
        if self.kind == "pair":
            return {self.name: tuple(value)}
        return {self.name: value}


def _show(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else f"{v:g}" if isinstance(v, float) else str(v)


def _kind(annotation: Any) -> str | None:
    """The command-line kind of a dataclass field's annotation (a string under ``from __future__ import
    annotations``), or None for a type the command line cannot give (use --set)."""
    t = annotation if isinstance(annotation, str) else _type_name(annotation)
    parts = [p.strip() for p in t.split("|") if p.strip() not in ("None", "NoneType")]
    if len(parts) != 1:
        return None
    t = parts[0].replace("typing.", "").replace(" ", "")
    if t in ("int", "float", "str", "bool", "list[float]", "list[int]", "list[str]"):
        return t
    if t in ("tuple[str,str]", "Tuple[str,str]"):
        return "pair"
    return None


def _type_name(t: Any) -> str:
    if isinstance(t, type):
        return t.__name__
    if isinstance(t, types.UnionType) or typing.get_origin(t) is typing.Union:
        return " | ".join(_type_name(a) for a in typing.get_args(t))
    return str(t).replace("typing.", "")


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None


def generated_flags() -> dict[str, Flag]:
    """Every generated flag by field name: RunConfig's fields, then every registered method's options (the
    first definition's type and help; the methods that have it)."""
    from silofl.fl.registry import methods
    from silofl.runner.config import RunConfig

    out: dict[str, Flag] = {}
    for f in dataclasses.fields(RunConfig):
        if f.name in NOT_FLAGS:
            continue
        kind = "clip" if f.name == "clip" else _kind(f.type)
        if kind is None:
            continue
        out[f.name] = Flag(
            f.name, kind, f.metadata.get("help", ""), f.metadata.get("panel", "method"), _default(f)
        )
    owners: dict[str, list[str]] = {}
    first: dict[str, dataclasses.Field] = {}
    defaults: dict[str, set] = {}
    helps: dict[str, list[str]] = {}
    registered = methods()
    for name, info in registered.items():
        for f in dataclasses.fields(info.options):
            if f.name in out:
                continue
            owners.setdefault(f.name, []).append(name)
            first.setdefault(f.name, f)
            defaults.setdefault(f.name, set()).add(repr(_default(f)))
            said = helps.setdefault(f.name, [])
            if f.metadata.get("help") and f.metadata["help"] not in said:
                said.append(f.metadata["help"])
    for name, f in first.items():
        kind = _kind(f.type)
        if kind is None:
            continue
        help_text = " ".join(helps[name]) or option_fallback_help(name)
        few = tuple(owners[name]) if len(owners[name]) <= max(3, len(registered) // 3) else ()
        default = _default(f) if len(defaults[name]) == 1 else None
        out[name] = Flag(name, kind, help_text, f.metadata.get("panel", "method"), default, few)
    return out


def option_fallback_help(name: str) -> str:
    """The help of a method option whose field says none (a plug-in's without ``metadata={"help": …}``; every
    built-in option has its own: :func:`silofl.fl.options.option`)."""
    return f"The {name.replace('_', ' ')} option."


def missing_help() -> list[str]:
    """``method.option`` for every option of a built-in method (a class of a ``silofl.`` module) whose field
    has no ``metadata["help"]`` — empty when every built-in option says what it does."""
    from silofl.fl.registry import methods

    out = []
    for name, info in methods().items():
        for f in dataclasses.fields(info.options):
            owner = next(
                (c for c in info.options.__mro__ if f.name in getattr(c, "__annotations__", {})), info.options
            )
            if owner.__module__.startswith("silofl.") and not f.metadata.get("help"):
                out.append(f"{name}.{f.name}")
    return out


def parse_clip(text: str) -> dict[str, Any]:
    """``--clip 0.5`` | ``--clip adaptive`` | ``--clip adaptive:0.1`` → run options (the clip as a number; the
    adaptive form turns on client-level adaptive clipping, starting from C0 or the default clip)."""
    kind, _, start = str(text).strip().partition(":")
    try:
        if kind == "adaptive":
            return {"adaptive_clip": True, **({"clip": float(start)} if start else {})}
        if start:
            raise ValueError
        return {"clip": float(kind)}
    except ValueError:
        raise ConfigError(f"--clip takes a number, 'adaptive' or 'adaptive:C0', got {text!r}") from None


def parse_list(text: Any, flag: str, item: str = "float") -> list[Any]:
    """A comma-separated list (``--target-epsilons 20,50,80``) of ``item`` s."""
    parts = [x.strip() for x in str(text).split(",") if x.strip()]
    if item == "str":
        return parts
    try:
        return [int(x) if item == "int" else float(x) for x in parts]
    except ValueError:
        raise ConfigError(
            f"{flag} takes comma-separated {'integers' if item == 'int' else 'numbers'}, got {text!r}"
        ) from None


# ---------------------------------------------------------------------------------------------- the command
# class
class ConfigCommand(TyperCommand):
    """A typer command with the generated flags after its own options (those it declares itself, and the names
    in ``exclude``, are not generated). The given flags reach the command through :func:`config_flags`."""

    exclude: tuple[str, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._generated: dict[str, Flag] | None = None

    def generated(self) -> dict[str, Flag]:
        """The flags generated for this command (once, on first use: methods registered by then are
        covered)."""
        if self._generated is None:
            own = {p.name for p in self.params} | {
                o.lstrip("-").replace("-", "_") for p in self.params for o in getattr(p, "opts", [])
            }
            self._generated = {
                k: f for k, f in generated_flags().items() if k not in own and k not in self.exclude
            }
            self.params.extend(f.option() for f in self._generated.values())
        return self._generated

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        """Click's parameters, the generated flags included."""
        self.generated()
        return super().get_params(ctx)

    def invoke(self, ctx: click.Context) -> Any:
        flags = self.generated()
        given = {k: ctx.params.pop(k) for k in list(ctx.params) if k in flags}
        ctx.meta[FLAGS_KEY] = (flags, {k: v for k, v in given.items() if v is not None})
        return super().invoke(ctx)


def config_command(
    app: typer.Typer, name: str | None = None, *, exclude: tuple[str, ...] = (), **kwargs: Any
) -> Callable[[Callable], Callable]:
    """``@config_command(app)`` in place of ``@app.command()``: the command gets every generated flag (minus
    its own and ``exclude``) and one-line errors (:func:`silofl.cli.common.friendly_errors`)."""
    from silofl.cli.common import friendly_errors

    cls = type("ConfigCommand", (ConfigCommand,), {"exclude": tuple(exclude)})

    def deco(fn: Callable) -> Callable:
        return app.command(name, cls=cls, **kwargs)(friendly_errors(fn))

    return deco


def config_flags() -> dict[str, Any]:
    """The generated flags the user gave to the running command, as configuration options (``--clip
    adaptive:0.5`` → ``adaptive_clip`` and ``clip``; comma lists as lists); one-line ConfigErrors for values
    that cannot work."""
    from silofl.cli.common import check_options

    flags, given = click.get_current_context().meta.get(FLAGS_KEY, ({}, {}))
    check_options(given)
    out: dict[str, Any] = {}
    for k, v in given.items():
        out.update(flags[k].parse(v))
    return out


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` (a YAML value; repeatable) → options."""
    import yaml

    out = {}
    for item in items:
        key, eq, val = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"--set takes KEY=VALUE, got {item!r}")
        try:
            out[key.strip().replace("-", "_")] = yaml.safe_load(val)
        except yaml.YAMLError:
            raise ConfigError(f"--set {key}: {val!r} is not a valid value") from None
    return out


def over_config(base: dict, overrides: dict) -> dict:
    """``overrides`` (flags, --set) over a --config file's mapping
    (:func:`silofl.runner.config.merge_options`: the file's section of the run's method is lifted to flat
    options first, so a flag overrides a method option the file nests under the method's name, as a tuned
    best.yaml does)."""
    from silofl.runner.config import merge_options

    return merge_options(base, overrides)


def run_options(config: Any, sets: list[str], recipe: str | None = None, **fixed: Any) -> dict[str, Any]:
    """The run options of a command: the generated flags (and ``fixed``) over ``--set`` over the ``--config``
    file over the recipe (:mod:`silofl.runner.recipe`, by name or path) — a mapping for
    :meth:`RunConfig.from_dict`."""
    from silofl.runner.config import load_yaml_mapping

    base = load_yaml_mapping(config) if config else {}
    if recipe is not None:
        from silofl.runner.recipe import load_recipe

        base = over_config(load_recipe(recipe).options, base)
    return over_config(base, {**parse_sets(sets), **config_flags(), **fixed})
