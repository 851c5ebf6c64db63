"""What every CLI command shares: errors as one red line and an exit code, not a traceback."""

from __future__ import annotations

import functools

import typer
from rich.console import Console

from silofl.core.errors import SiloflError

err_console = Console(stderr=True, soft_wrap=True)  # one line per error, whatever the terminal width


def friendly_errors(fn):
    """Wrap a CLI command: a SiloflError becomes one red line and exit code 2, Ctrl-C exit code 130."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except SiloflError as e:
            err_console.print(f"[bold red]error:[/] {e}")
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            err_console.print("[yellow]interrupted[/]")
            raise typer.Exit(130) from None

    return wrapper
