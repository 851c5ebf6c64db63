"""A whole run's checkpoints: one folder per saved round, ``root/round<r>/``.

Each site writes its own state there (``node<k>.*``, :mod:`silofl.core.checkpoint`, on the site's
machine); the coordinator then writes its own (``coordinator.*``: its roles, who is still active) and
the run's record (``run.json``), and points ``root/latest`` at the round. A round folder without
``run.json`` is incomplete and never resumed from; all but the newest ``keep`` rounds are removed.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from silofl.core.checkpoint import FORMAT, load_node, save_node
from silofl.core.errors import ConfigError

RUN_FILE = "run.json"
COORDINATOR = "coordinator"


def round_dir(root: str | Path, rnd: int) -> Path:
    """The folder of round ``rnd``'s checkpoint."""
    return Path(root) / f"round{rnd}"


def save_run(root: str | Path, rnd: int, coordinator_state: dict, run_state: dict, keep: int = 1) -> Path:
    """Complete round ``rnd``'s checkpoint (the sites have written theirs): the coordinator's state, ``run.json``,
    ``latest``; then remove all but the newest ``keep`` rounds."""
    root = Path(root)
    d = round_dir(root, rnd)
    save_node(d, COORDINATOR, coordinator_state, meta={"round": rnd})
    (d / RUN_FILE).write_text(json.dumps({"format": FORMAT, "round": rnd, **run_state}))
    tmp = root / "latest.tmp"
    tmp.write_text(d.name)
    os.replace(tmp, root / "latest")
    for old in saved_rounds(root, complete=False)[:-keep]:
        shutil.rmtree(round_dir(root, old), ignore_errors=True)
    return d


def saved_rounds(root: str | Path, complete: bool = True) -> list[int]:
    """Rounds with a checkpoint under ``root`` (complete ones: ``run.json`` written), ascending."""
    root = Path(root)
    found = []
    for d in root.glob("round*"):
        if d.is_dir() and d.name[5:].isdigit() and (not complete or (d / RUN_FILE).is_file()):
            found.append(int(d.name[5:]))
    return sorted(found)


def load_run(root: str | Path, rnd: int) -> tuple[dict, dict]:
    """(the coordinator's state, the run's record) of round ``rnd``'s checkpoint under ``root``."""
    d = round_dir(root, rnd)
    try:
        run_state = json.loads((d / RUN_FILE).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"checkpoint {d} is unreadable: {e}") from None
    if run_state.get("format") != FORMAT:
        raise ConfigError(f"checkpoint {d} was written by another version of silofl ({run_state.get('format')})")
    state, meta = load_node(d, COORDINATOR)
    if meta.get("round") != rnd:
        raise ConfigError(f"checkpoint {d}: the coordinator's state is from round {meta.get('round')}, not {rnd}")
    return state, run_state
