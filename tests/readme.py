"""The README's commands, read from README.md itself (fenced ``bash`` blocks of a section), so that a test runs what
the README shows and a changed or added command cannot go untested (issue 25, item 7).

A command is one logical line: ``\\``-continued lines joined, ``# comments`` dropped (shell rules, quotes kept), and
``.venv/bin/silofl`` read as ``silofl`` (the same console script). A line that only sets a shell variable
(``COORD=coord.example.org``) is not a command: :func:`variables` gives those, and a test sets its own value (the
tests run on one machine, with no name service) — the way a reader sets it for their machines. :func:`argv` gives a
command's arguments after ``silofl``, with ``$NAME`` expanded from the test's values and nothing else changed."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"

# the sections whose every command runs in the suite, and the tests that run them
SECTIONS = {
    "PubSub-ML: publish DP models, subscribe by features, customize": "tests/cli/test_readme_commands.py (pubsub)",
    "A site's own data: tables and per-site folders": "tests/cli/test_readme_commands.py (tables, predict)",
    "Using the model: `silofl predict` and `silofl export`": "tests/cli/test_readme_commands.py (tables, predict)",
    "Deploying between institutions": "tests/deploy/test_readme_site_commands.py",
}


def section(title: str, text: str | None = None) -> str:
    """The text of the README section headed ``title`` (any level), up to the next heading of the same or a higher
    level."""
    lines = (README.read_text() if text is None else text).splitlines()
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
        raise KeyError(f"README.md has no section {title!r}")
    return "\n".join(lines[start:])


ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", flags=re.S)


def _lines(title: str, text: str | None) -> list[list[str]]:
    """The tokens of every non-empty line of the section's ``bash`` blocks (continued lines joined, comments dropped)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", section(title, text), flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            tokens = shlex.split(line, comments=True)
            if tokens:
                out.append(tokens)
    return out


def variables(title: str, text: str | None = None) -> dict[str, str]:
    """The shell variables the section's ``bash`` blocks set (``NAME=value`` lines), with the README's values."""
    return {m.group(1): m.group(2) for t in _lines(title, text) if len(t) == 1 and (m := ASSIGNMENT.fullmatch(t[0]))}


def commands(title: str, text: str | None = None) -> list[str]:
    """Every command of the section's ``bash`` blocks, in order, as one normalised line each (variable settings
    are not commands: :func:`variables`)."""
    out = []
    for tokens in _lines(title, text):
        if len(tokens) == 1 and ASSIGNMENT.fullmatch(tokens[0]):
            continue
        if tokens[0] == ".venv/bin/silofl":
            tokens[0] = "silofl"
        out.append(shlex.join(tokens))
    return out


def argv(command: str, env: dict[str, str] | None = None) -> list[str]:
    """A command's arguments after ``silofl``, ``$NAME`` / ``${NAME}`` expanded from ``env`` (a name it lacks is an
    error)."""
    tokens = shlex.split(command)
    assert tokens[0] == "silofl", command
    out = []
    for t in tokens[1:]:
        t = re.sub(r"\$(?:\{(\w+)\}|(\w+))", lambda m: (env or {})[m.group(1) or m.group(2)], t)
        out.append(t)
    return out
