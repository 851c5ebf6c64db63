"""``silofl schema propose``: a schema proposed from one CSV or Parquet file, for its owner to review."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from silofl.cli.common import friendly_errors

schema_app = typer.Typer(no_args_is_help=True, help="The collaboration's schema (docs/howto/own-data.md).")
console = Console(soft_wrap=True)

NOTE = (
    "# proposed by `silofl schema propose` from {src}: review every line before you share it.\n"
    "# The numeric bounds are this file's own minimum and maximum (rounded outwards): a statistic of your\n"
    "# rows. Replace them with public knowledge (ranges any site could state) before the schema leaves you.\n"
)


@schema_app.command("propose")
@friendly_errors
def schema_propose(
    table: Path = typer.Argument(..., help="A CSV, TSV or Parquet file of one site."),
    target: str | None = typer.Option(
        None, "--target", help="The column to predict (its values: the classes)."
    ),
    out: Path | None = typer.Option(
        None, "--out", help="Write the schema here (YAML) instead of printing it."
    ),
):
    """Propose a schema from TABLE: types, levels, empty-value policy and (to be replaced) bounds."""
    import yaml

    from silofl.core.errors import ConfigError
    from silofl.data.schema import Schema, propose, read_table

    df = read_table(table)
    proposal = propose(df, target, str(table))
    if target is not None:
        Schema.from_dict(proposal, str(table)).check(df, str(table))  # the proposal reads its own file
    text = NOTE.format(src=table.name) + yaml.safe_dump(proposal, sort_keys=False, default_flow_style=None)
    if out is None:
        console.print(text, markup=False, highlight=False, end="")
        return
    if out.exists():
        raise ConfigError(f"{out} exists; choose another --out (a schema is never overwritten)")
    out.write_text(text)
    console.print(f"wrote {out}")
