"""MkDocs hook: the command-line reference, generated at build time from the CLI's own command tree.

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
    out.append(
        f"```text\n{' '.join([name, *cmd.collect_usage_pieces(ctx)])}\n```\n"
    )
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


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"{PAGE} lost its marker {MARKER}")
    return markdown.replace(MARKER, cli_markdown())
