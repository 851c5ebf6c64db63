"""The README's commands, read from README.md itself (fenced ``bash`` blocks of a section), so that a test
runs what the README shows and a changed or added command cannot go untested (issue 25, item 7).

A command is one logical line: ``\\``-continued lines joined, ``# comments`` dropped (shell rules, quotes
kept), and ``.venv/bin/silofl`` read as ``silofl`` (the same console script). A line that only sets a shell
variable (``COORD=coord.example.org``) is not a command: :func:`variables` gives those, and a test sets its
own value (the tests run on one machine, with no name service) — the way a reader sets it for their machines.
:func:`argv` gives a command's arguments after ``silofl``, with ``$NAME`` expanded from the test's values and
nothing else changed.

A section lives in README.md or in a page of the docs site (issue 27: the README keeps the way in, the docs
the rest): ``where`` is a ``(file, title)`` pair, the file relative to the repository root — or a bare
title, read from README.md. Moving a section to another page means changing its pair here and in the test
that runs it; the commands stay exactly as written."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

Where = str | tuple[str, str]  # a README title, or (file relative to the repository root, title)

# the sections (file, title) whose every command runs in the suite, and the tests that run them
PUBSUB = ("docs/howto/broker.md", "PubSub-ML: publish DP models, subscribe by features, customize")
TABLES = ("docs/howto/own-data.md", "A site's own data: tables and per-site folders")
PREDICT = ("docs/howto/own-data.md", "Using the model: `silofl predict` and `silofl export`")
DEPLOY = ("docs/howto/deploy.md", "Deploying between institutions")
METRIC = ("docs/howto/run.md", "Metrics: `--metric`")
INVERSION = ("docs/howto/audit.md", "Gradient inversion: `--attack inversion`")
FIRST_RUN = ("README.md", "A 30-second run")
PYTHON = ("README.md", "From Python")
SECURE = ("docs/concepts/secure_aggregation.md", "Running it")
SECTIONS = {
    PUBSUB: "tests/cli/test_readme_commands.py (pubsub)",
    TABLES: "tests/cli/test_readme_commands.py (tables, predict)",
    PREDICT: "tests/cli/test_readme_commands.py (tables, predict)",
    DEPLOY: "tests/deploy/test_readme_site_commands.py",
    METRIC: "tests/runner/test_metrics_run.py",
    INVERSION: "tests/auditing/test_inversion.py",
    FIRST_RUN: "tests/docs/test_readme.py",
    PYTHON: "tests/docs/test_readme.py (python)",
    SECURE: "tests/secure/test_cli.py",
}


def _split(where: Where) -> tuple[Path, str]:
    if isinstance(where, str):
        return README, where
    file, title = where
    return ROOT / file, title


def section(where: Where, text: str | None = None) -> str:
    """The text of the section headed ``title`` (any level) of README.md or of ``where``'s file, up to the
    next heading of the same or a higher level (``text``: read that instead of the file)."""
    path, title = _split(where)
    lines = (path.read_text() if text is None else text).splitlines()
    in_code = False
    start = level = None
    for i, line in enumerate(lines):
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        m = re.match(r"(#+) (.*)", line)
        if not m:
            continue
        if start is None and m.group(2).strip() == title:
            start, level = i, len(m.group(1))
        elif start is not None and len(m.group(1)) <= level:
            return "\n".join(lines[start:i])
    if start is None:
        raise KeyError(f"{path.relative_to(ROOT)} has no section {title!r}")
    return "\n".join(lines[start:])


ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", flags=re.S)


def blocks(where: Where, lang: str = "bash", text: str | None = None) -> list[str]:
    """The section's fenced blocks in ``lang``, as written."""
    return re.findall(rf"```{lang}\n(.*?)```", section(where, text), flags=re.S)


def _lines(where: Where, text: str | None) -> list[list[str]]:
    """The tokens of every non-empty line of the section's ``bash`` blocks (continued lines joined,
    comments dropped)."""
    out = []
    for block in blocks(where, "bash", text):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            tokens = shlex.split(line, comments=True)
            if tokens:
                out.append(tokens)
    return out


def variables(where: Where, text: str | None = None) -> dict[str, str]:
    """The shell variables the section's ``bash`` blocks set (``NAME=value`` lines), with the README's
    values."""
    return {
        m.group(1): m.group(2)
        for t in _lines(where, text)
        if len(t) == 1 and (m := ASSIGNMENT.fullmatch(t[0]))
    }


def commands(where: Where, text: str | None = None) -> list[str]:
    """Every command of the section's ``bash`` blocks, in order, as one normalised line each (variable
    settings are not commands: :func:`variables`)."""
    out = []
    for tokens in _lines(where, text):
        if len(tokens) == 1 and ASSIGNMENT.fullmatch(tokens[0]):
            continue
        if tokens[0] == ".venv/bin/silofl":
            tokens[0] = "silofl"
        out.append(shlex.join(tokens))
    return out


def argv(command: str, env: dict[str, str] | None = None) -> list[str]:
    """A command's arguments after ``silofl``, ``$NAME`` / ``${NAME}`` expanded from ``env`` (a name it
    lacks is an error)."""
    tokens = shlex.split(command)
    assert tokens[0] == "silofl", command
    out = []
    for t in tokens[1:]:
        t = re.sub(r"\$(?:\{(\w+)\}|(\w+))", lambda m: (env or {})[m.group(1) or m.group(2)], t)
        out.append(t)
    return out
