"""What every CLI command shares: errors as one red line and an exit code, not a traceback."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math

import typer
from rich.console import Console
from rich.markup import escape

from silofl.core.errors import ConfigError, SiloflError

err_console = Console(stderr=True, soft_wrap=True)  # one line per error, whatever the terminal width
_held: contextvars.ContextVar[contextlib.ExitStack | None] = contextvars.ContextVar(
    "silofl_cli_held", default=None
)


def one_line(text: str) -> str:
    """``text`` on one line (a YAML parser's or the OS's multi-line message included)."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def _oserror_line(e: OSError) -> str:
    where = " → ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
    what = e.strerror or str(e) or type(e).__name__
    return f"{what}: {where}" if where else what


def friendly_errors(fn):
    """Wrap a CLI command: a SiloflError, or an OSError from the file system (a path under a file, a folder
    that cannot be written, a full disk), becomes one red line and exit code 2; Ctrl-C exit code 130. An
    ``out`` option given as an empty string is refused before the command runs (it would mean the current
    folder). What the command :func:`hold` s (e.g. the lock on its run folder) is released when it returns or
    fails."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from silofl.api import flag_names

        stack = contextlib.ExitStack()
        token = _held.set(stack)
        try:
            with stack, flag_names():  # the API's errors name this command's flags
                check_options(kwargs)
                return fn(*args, **kwargs)
        except SiloflError as e:
            err_console.print(f"[bold red]error:[/] {escape(one_line(str(e)))}", highlight=False)
            raise typer.Exit(2) from None
        except OSError as e:
            err_console.print(f"[bold red]error:[/] {escape(one_line(_oserror_line(e)))}", highlight=False)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            err_console.print("[yellow]interrupted[/]")
            raise typer.Exit(130) from None
        finally:
            _held.reset(token)

    return wrapper


def hold(cm):
    """Enter the context manager ``cm`` until the running CLI command (wrapped by :func:`friendly_errors`)
    ends."""
    stack = _held.get()
    if stack is None:
        raise RuntimeError("hold() outside a command wrapped by friendly_errors")
    return stack.enter_context(cm)


def check_seconds(flag: str, value: float | None) -> None:
    """Refuse a duration that is not a finite positive number of seconds (one line)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{flag} must be a finite positive number of seconds, got {value}")


FLOAT_LIMIT = 3.4e38  # the largest float32 (as silofl.runner.config.FLOAT_LIMIT)


def check_options(kwargs: dict) -> None:
    """Checks every command's options get (one-line ConfigErrors): no number is NaN or finite beyond the
    float32 range (1e308 is nobody's ε, σ or learning rate; ∞ stays for options that mean "no limit"), and
    ``--out`` is not an empty string (it would mean the current folder)."""
    for name, v in kwargs.items():
        flag = "--" + name.rstrip("_").replace("_", "-")
        if isinstance(v, float) and math.isnan(v):
            raise ConfigError(f"{flag} must be a number, got nan")
        if isinstance(v, float) and math.isfinite(v) and abs(v) > FLOAT_LIMIT:
            raise ConfigError(f"{flag} must be a number of magnitude at most {FLOAT_LIMIT:g}, got {v!r}")
    v = kwargs.get("out")
    if isinstance(v, str) and not v.strip():
        raise ConfigError("--out is empty: name the folder or file to write")
