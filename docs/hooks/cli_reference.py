"""MkDocs hook: the command-line and configuration references, generated at build time from the code.

``reference/cli.md`` holds the marker ``<!-- cli-reference -->``; this hook replaces it with one section
per command (usage, help, arguments and options with their types and defaults), walking the click command
that typer builds from ``silofl.cli.main.app``. The repository's ``src/`` comes first on ``sys.path``, so
the page describes the tree being built, not whatever silofl happens to be installed."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

MARKER = "<!-- cli-reference -->"
PAGE = "reference/cli.md"
CONFIG_MARKER = "<!-- config-reference -->"
CONFIG_PAGE = "reference/config.md"


def on_config(config: Any) -> Any:
    src = str(Path(config.config_file_path).resolve().parent / "src")
    if src not in sys.path:
        sys.path.insert(0, src)
    return config


def _plain(text: str | None) -> str:
    """Help text without rich markup (``[bold]…[/]``), one paragraph per blank-line-separated block."""
    text = re.sub(r"\[/?[a-z ]*\]", "", text or "")
    return text.replace("\b\n", "").strip()


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _default(param: Any) -> str:
    import click

    if isinstance(getattr(param, "show_default", None), str):  # a generated flag: the configuration's default
        return f"`{param.show_default.strip('()')}`"
    if getattr(param, "is_flag", False) and not getattr(param, "secondary_opts", None):
        return ""
    d = param.default
    if d is None or callable(d) or d == () or isinstance(d, click.core.ParameterSource):
        return ""
    if isinstance(d, (list, tuple)):
        d = ",".join(map(str, d))
    return f"`{d}`"


def _type(param: Any) -> str:
    import click

    t = param.type
    mv = getattr(param, "metavar", None)  # a generated flag: its choices ([a|b]) or its form (A,B,…)
    if mv and mv.startswith("[") and mv.endswith("]"):
        return " \\| ".join(f"`{c}`" for c in mv[1:-1].split("|"))
    if mv:
        return " \\| ".join(f"`{part}`" for part in mv.split("|"))
    if isinstance(t, click.Choice):
        return " \\| ".join(f"`{c}`" for c in t.choices)
    if getattr(param, "is_flag", False):
        return "flag"
    return t.name.lower()


def _command(cmd: Any, path: list[str], out: list[str]) -> None:
    import click

    if getattr(cmd, "hidden", False):
        return
    name = " ".join(path)
    out.append(f"{'#' * min(len(path) + 1, 4)} `{name}`\n")
    ctx = click.Context(cmd, info_name=name)
    out.append(f"```text\n{' '.join([name, *cmd.collect_usage_pieces(ctx)])}\n```\n")
    if cmd.help:
        out.append(_plain(cmd.help) + "\n")
    args = [p for p in cmd.params if isinstance(p, click.Argument)]
    opts = [p for p in cmd.params if isinstance(p, click.Option) and not p.hidden]
    if args:
        out.append("| argument | type | required |\n|---|---|---|")
        out.extend(
            f"| `{p.human_readable_name}` | {_type(p)} | {'yes' if p.required else 'no'} |" for p in args
        )
        out.append("")
    if opts:
        out.append("| option | type | default | help |\n|---|---|---|---|")
        for p in opts:
            names = ", ".join(f"`{o}`" for o in (*p.opts, *p.secondary_opts))
            out.append(f"| {names} | {_type(p)} | {_default(p)} | {_cell(_plain(p.help))} |")
        out.append("")
    if isinstance(cmd, click.Group):
        for sub_name in cmd.list_commands(ctx):
            _command(cmd.get_command(ctx, sub_name), [*path, sub_name], out)


def cli_markdown() -> str:
    """The reference of every command, as markdown."""
    import typer

    from silofl.cli.main import app

    out: list[str] = []
    _command(typer.main.get_command(app), ["silofl"], out)
    return "\n".join(out) + "\n"


def _comments(cls: type) -> tuple[dict[str, str], dict[str, str]]:
    """From a dataclass's source: each field's trailing ``# comment``, and the comment block just above a
    field (a group's heading, for the first field below it)."""
    import inspect

    trailing: dict[str, str] = {}
    above: dict[str, str] = {}
    block: list[str] = []
    for line in inspect.getsource(cls).splitlines()[1:]:
        text = line.strip()
        if text.startswith("#"):
            block.append(text.lstrip("#").strip())
            continue
        m = re.match(r"(\w+)\s*:[^=]*(?:=.*)?$", text)
        if m and not text.startswith(("def ", "@", "return")):
            code, _, comment = text.partition("  # ")
            if comment:
                trailing[m.group(1)] = comment.strip()
            if block:
                above[m.group(1)] = " ".join(block)
        block = []
    return trailing, above


def _fields_markdown(cls: type, own_only: bool = False) -> list[str]:
    """A dataclass's fields as tables (name, type, default, what it is), split at its comment groups."""
    import dataclasses

    def default(f: Any) -> str:
        if f.default is not dataclasses.MISSING:
            return f"`{f.default!r}`"
        return "(built)" if f.default_factory is not dataclasses.MISSING else "required"

    notes: dict[str, tuple[dict[str, str], dict[str, str]]] = {}
    out: list[str] = []
    header = ["| field | type | default | what it is |", "|---|---|---|---|"]
    table: list[str] = []
    for f in dataclasses.fields(cls):
        owner = next(c for c in reversed(cls.__mro__) if f.name in getattr(c, "__annotations__", {}))
        if own_only and owner is not cls:
            continue
        trailing, above = notes.setdefault(owner.__qualname__, _comments(owner))
        if f.name in above:
            if table:
                out += [*header, *table, ""]
                table = []
            out += [_plain(above[f.name]).replace("<", "&lt;") + "\n"]
        help_ = f.metadata.get("help") if f.metadata else None
        typ = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        table.append(
            f"| `{f.name}` | `{_cell(str(typ))}` | {_cell(default(f))} | "
            f"{_cell(help_ or trailing.get(f.name, ''))} |"
        )
    if table:
        out += [*header, *table, ""]
    return out


def config_markdown() -> str:
    """RunConfig's fields, then every registered method and the fields of its options dataclass."""
    from silofl.fl.registry import methods
    from silofl.runner.config import RunConfig

    out = ["### `RunConfig`: the settings every method shares\n", *_fields_markdown(RunConfig)]
    infos = methods()
    out += [
        "### Each method's options\n",
        "| method | options | judged by | exchange | what it is |",
        "|---|---|---|---|---|",
    ]
    out += [
        f"| `{n}` | [`{i.options.__name__}`](#{i.options.__name__.lower()}) | `{i.headline}` | "
        f"{i.exchange} | {_cell(i.description)} |"
        for n, i in infos.items()
    ]
    out.append("")
    seen: set[type] = set()
    for info in infos.values():
        for cls in reversed(info.options.__mro__):
            if cls in seen or not hasattr(cls, "__dataclass_fields__") or not cls.__dataclass_fields__:
                continue
            seen.add(cls)
            bases = [b.__name__ for b in cls.__bases__ if hasattr(b, "__dataclass_fields__")]
            out.append(f"#### `{cls.__name__}`\n")
            doc = (cls.__doc__ or "").strip()
            if doc and not doc.startswith(cls.__name__ + "("):
                out.append(_plain(doc) + (f" (besides those of {', '.join(bases)})" if bases else "") + "\n")
            out += _fields_markdown(cls, own_only=True) or ["(no options of its own)\n"]
    return "\n".join(out) + "\n"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    generated = {PAGE: (MARKER, cli_markdown), CONFIG_PAGE: (CONFIG_MARKER, config_markdown)}
    if page.file.src_uri not in generated:
        return markdown
    marker, make = generated[page.file.src_uri]
    if marker not in markdown:
        raise ValueError(f"{page.file.src_uri} lost its marker {marker}")
    return markdown.replace(marker, make())
