"""Checkpoints of a node's state as safetensors + JSON (no pickle).

A state is any nesting of dicts (str or int keys), lists, tensors and JSON scalars — model and
optimizer state dicts, generator states, accountant histories. :func:`flatten` moves every tensor
into a flat ``{name: tensor}`` map and leaves a JSON skeleton that says where each one goes;
:func:`unflatten` reverses it. :func:`save_node` / :func:`load_node` write and read one node's state
(``node{k}.safetensors`` + ``node{k}.json``); every process can write its own node, and a file
written half-way (a crash while saving) is never read: both files are written under temporary names
and renamed, the JSON last.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from silofl.errors import ConfigError

FORMAT = "silofl.checkpoint/1"


def flatten(obj: Any, tensors: dict[str, torch.Tensor] | None = None, prefix: str = "t") -> tuple[dict, Any]:
    """(tensors, skeleton) of a nested state."""
    tensors = {} if tensors is None else tensors
    if isinstance(obj, torch.Tensor):
        name = f"{prefix}.{len(tensors)}"
        tensors[name] = obj.detach().cpu().contiguous()
        return tensors, {"__tensor__": name}
    if isinstance(obj, dict):
        items = []
        for k, v in obj.items():
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise TypeError(f"checkpoint keys must be str or int, got {k!r}")
            items.append([k, flatten(v, tensors, prefix)[1]])
        return tensors, {"__dict__": items}
    if isinstance(obj, (list, tuple)):
        return tensors, {"__list__": [flatten(v, tensors, prefix)[1] for v in obj]}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return tensors, obj
    raise TypeError(f"cannot checkpoint a {type(obj).__name__}")


def unflatten(tensors: dict[str, torch.Tensor], skeleton: Any) -> Any:
    """The nested state back, tensors on the CPU (``load_state_dict`` of models and optimizers moves
    them to their parameters' device; other owners move what they need)."""
    if isinstance(skeleton, dict):
        if "__tensor__" in skeleton:
            return tensors[skeleton["__tensor__"]]
        if "__dict__" in skeleton:
            return {k: unflatten(tensors, v) for k, v in skeleton["__dict__"]}
        if "__list__" in skeleton:
            return [unflatten(tensors, v) for v in skeleton["__list__"]]
    return skeleton


def _base(folder: str | Path, node: int | str) -> Path:
    return Path(folder) / (f"node{node}" if isinstance(node, int) else str(node))


def save_node(folder: str | Path, node: int | str, state: dict, meta: dict | None = None) -> Path:
    """Write one node's state (``node`` an id, or a name such as ``protocol``)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors, skeleton = flatten(state)
    base = _base(folder, node)
    tmp_t, tmp_j = base.with_suffix(".safetensors.tmp"), base.with_suffix(".json.tmp")
    save_file(tensors, str(tmp_t))
    tmp_j.write_text(json.dumps({"format": FORMAT, "node": node, "meta": meta or {}, "state": skeleton}))
    os.replace(tmp_t, base.with_suffix(".safetensors"))
    os.replace(tmp_j, base.with_suffix(".json"))
    return base.with_suffix(".json")


def load_node(folder: str | Path, node: int | str) -> tuple[dict, dict]:
    """(state, meta) of one node; a clear error if the checkpoint is missing or unreadable."""
    base = _base(folder, node)
    try:
        head = json.loads(base.with_suffix(".json").read_text())
        tensors = load_file(str(base.with_suffix(".safetensors")))
    except FileNotFoundError:
        raise ConfigError(f"no checkpoint of node {node} in {folder}") from None
    except Exception as e:  # noqa: BLE001 - a corrupt file is a clear error, not a traceback
        raise ConfigError(f"checkpoint of node {node} in {folder} is unreadable: {e}") from None
    if head.get("format") != FORMAT or head.get("node") != node:
        raise ConfigError(f"{base.with_suffix('.json')} is not a silofl checkpoint of node {node}")
    return unflatten(tensors, head["state"]), head.get("meta", {})


# ---------------------------------------------------------------------------------------------- runs
RUN_FILE = "run.json"


def save_run(root: str | Path, rnd: int, states: dict, run_state: dict, keep: int = 1) -> Path:
    """A whole run's checkpoint of round ``rnd``: ``root/round{rnd}/`` with one file pair per node and
    ``run.json``; ``root/latest`` names it once it is complete, and all but the newest ``keep`` rounds
    are removed."""
    root = Path(root)
    d = root / f"round{rnd}"
    for node, state in states.items():
        save_node(d, node, state, meta={"round": rnd})
    (d / RUN_FILE).write_text(json.dumps({"format": FORMAT, "round": rnd, "nodes": list(states), **run_state}))
    tmp = root / "latest.tmp"
    tmp.write_text(d.name)
    os.replace(tmp, root / "latest")
    for old in saved_rounds(root, complete=False)[:-keep]:
        old_dir = root / f"round{old}"
        for f in old_dir.iterdir():
            f.unlink()
        old_dir.rmdir()
    return d


def saved_rounds(root: str | Path, complete: bool = True) -> list[int]:
    """Rounds with a checkpoint under ``root`` (complete ones: ``run.json`` written), ascending."""
    root = Path(root)
    found = []
    for d in root.glob("round*"):
        if d.is_dir() and d.name[5:].isdigit() and (not complete or (d / RUN_FILE).is_file()):
            found.append(int(d.name[5:]))
    return sorted(found)


def load_run(root: str | Path, rnd: int | None = None) -> tuple[int, dict, dict]:
    """(round, {node: state}, run state) of the latest complete checkpoint under ``root``, or of round ``rnd``."""
    root = Path(root)
    latest = root / "latest"
    if rnd is None and not latest.is_file():
        raise ConfigError(f"no checkpoint to resume from in {root} (run with --checkpoint-every N first)")
    d = root / (latest.read_text().strip() if rnd is None else f"round{rnd}")
    try:
        run_state = json.loads((d / RUN_FILE).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"checkpoint {d} is unreadable: {e}") from None
    rnd = int(run_state["round"])
    states = {}
    for node in run_state["nodes"]:
        state, meta = load_node(d, node)
        if meta.get("round") != rnd:
            raise ConfigError(f"checkpoint {d}: node {node} is from round {meta.get('round')}, not {rnd}")
        states[node] = state
    return rnd, states, run_state
