"""A whole run's checkpoints: one folder per saved round, ``root/round<r>/``.

Each site writes its own state there (``node<k>.*``, :mod:`silofl.core.checkpoint`, on the site's
machine); the coordinator then writes its own (``coordinator.*``: its roles, who is still active) and
the run's record (``run.json``: the round loop's :class:`RunState`, the config as it runs and its plan), and
points
``root/latest`` at the round. A round folder without ``run.json`` is incomplete and never resumed from; all
but the
newest ``keep`` rounds are removed.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from silofl.core.checkpoint import FORMAT, load_node, save_node
from silofl.core.errors import ConfigError

RUN_FILE = "run.json"
COORDINATOR = "coordinator"


@dataclass
class RunState:
    """The round loop's state: the last round run, each client's latest metrics record, who left, rejoined or
    had messages refused, the time spent training and evaluating, and (at a checkpoint) the engine's byte
    counts. The parties' own state — models, optimizers, accountants, RNGs — is theirs (each site's
    ``node<k>.*``, the coordinator's ``coordinator.*`` with the torch RNG); this is what ``run.json`` adds."""

    round: int = 0
    last: dict[int, dict] = field(default_factory=dict)
    left: list[dict] = field(default_factory=list)
    rejoined: list[dict] = field(default_factory=list)
    rejected: list[dict] = field(default_factory=list)
    train_s: float = 0.0
    eval_s: float = 0.0
    bytes_sent: dict[int, int] = field(default_factory=dict)
    bytes_received: dict[int, int] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)  # this process's start (not saved)

    def to_record(self, cfg: Any, plan: Any, sites: int) -> dict[str, Any]:
        """``run.json``'s content (the round is written by :func:`save_run`): the config with its plan's
        values written in (what a resume is checked against; :func:`silofl.runner.plan.config_with_plan`), the
        plan, and the loop's state."""
        return {
            "config": cfg.to_dict(),
            "plan": plan.to_dict() if plan is not None else None,
            "sites": sites,
            "left": self.left,
            "rejoined": self.rejoined,
            "rejected": self.rejected,
            "train_s": self.train_s,
            "eval_s": self.eval_s,
            "last": {str(k): v for k, v in self.last.items()},
            "bytes_sent": {str(k): v for k, v in self.bytes_sent.items()},
            "bytes_received": {str(k): v for k, v in self.bytes_received.items()},
        }

    @classmethod
    def from_record(cls, record: dict[str, Any], started: float | None = None) -> RunState:
        """The state a ``run.json`` holds (one written before ``rejoined`` was saved has none)."""
        try:
            return cls(
                round=int(record["round"]),
                last={int(k): v for k, v in record["last"].items()},
                left=list(record["left"]),
                rejoined=list(record.get("rejoined") or []),
                rejected=list(record["rejected"]),
                train_s=float(record["train_s"]),
                eval_s=float(record["eval_s"]),
                bytes_sent={int(k): v for k, v in record["bytes_sent"].items()},
                bytes_received={int(k): v for k, v in record["bytes_received"].items()},
                started=started if started is not None else time.perf_counter(),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ConfigError(
                f"checkpoint record of round {record.get('round')!r} is malformed: {e!r}"
            ) from None


def round_dir(root: str | Path, rnd: int) -> Path:
    """The folder of round ``rnd``'s checkpoint."""
    return Path(root) / f"round{rnd}"


def save_run(root: str | Path, rnd: int, coordinator_state: dict, run_state: dict, keep: int = 1) -> Path:
    """Complete round ``rnd``'s checkpoint (the sites have written theirs): the coordinator's state,
    ``run.json``, ``latest``; then remove all but the newest ``keep`` rounds."""
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
        raise ConfigError(
            f"checkpoint {d} was written by another version of silofl ({run_state.get('format')})"
        )
    state, meta = load_node(d, COORDINATOR)
    if meta.get("round") != rnd:
        raise ConfigError(
            f"checkpoint {d}: the coordinator's state is from round {meta.get('round')}, not {rnd}"
        )
    return state, run_state
