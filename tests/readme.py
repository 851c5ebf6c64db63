"""The README's commands, read from README.md itself (fenced ``bash`` blocks of a section), so that a test runs what
the README shows and a changed or added command cannot go untested (issue 25, item 7).

A command is one logical line: ``\\``-continued lines joined, ``# comments`` dropped (shell rules, quotes kept), and
``.venv/bin/silofl`` read as ``silofl`` (the same console script). :func:`argv` gives its arguments after ``silofl``
with the only rewrites the tests make: host names under ``example.org`` become ``localhost`` and the ports the README
names become free ones (the tests run on one machine, with no name service)."""

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
    "Deploying between institutions": "tests/deploy/test_readme_site_commands.py; test_deploy_local.py (another form)",
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


def commands(title: str, text: str | None = None) -> list[str]:
    """Every command of the section's ``bash`` blocks, in order, as one normalised line each."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", section(title, text), flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            tokens = shlex.split(line, comments=True)
            if not tokens:
                continue
            if tokens[0] == ".venv/bin/silofl":
                tokens[0] = "silofl"
            out.append(shlex.join(tokens))
    return out


def argv(command: str, ports: dict[int, int] | None = None) -> list[str]:
    """A command's arguments after ``silofl``, with example.org hosts → localhost and README ports → ``ports``."""
    tokens = shlex.split(command)
    assert tokens[0] == "silofl", command
    out = []
    for t in tokens[1:]:
        t = re.sub(r"\b[\w.-]+\.example\.org\b", "localhost", t)
        for old, new in (ports or {}).items():
            t = re.sub(rf"(?<=:){old}\b|^{old}$", str(new), t)
        out.append(t)
    return out
