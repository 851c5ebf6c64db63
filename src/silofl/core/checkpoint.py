"""A party's state on disk as safetensors + JSON (no pickle).

A state is any nesting of dicts (str or int keys), lists, tensors and JSON scalars — model and
optimizer state dicts, generator states, accountant histories. :func:`flatten` moves every tensor
into a flat ``{name: tensor}`` map and leaves a JSON skeleton that says where each one goes;
:func:`unflatten` reverses it. :func:`save_node` / :func:`load_node` write and read one node's state
(``node{k}.safetensors`` + ``node{k}.json``); every process can write its own node, and a file
written half-way (a crash while saving) is never read: both files are written under temporary names
and renamed, the JSON last; they are 0600 in 0700 folders (a node's state holds un-noised figures).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from silofl.core.errors import ConfigError
from silofl.core.private import FILE_MODE, private_dir, write_private

FORMAT = "silofl.checkpoint/2"  # 2: sites and the coordinator save their own state


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
    folder = private_dir(Path(folder))  # un-noised figures live here (mean_grad_norm, clipped_fraction)
    tensors, skeleton = flatten(state)
    base = _base(folder, node)
    tmp_t, tmp_j = base.with_suffix(".safetensors.tmp"), base.with_suffix(".json.tmp")
    save_file(tensors, str(tmp_t))
    os.chmod(tmp_t, FILE_MODE)
    text = json.dumps({"format": FORMAT, "node": node, "meta": meta or {}, "state": skeleton})
    write_private(tmp_j, text.encode())
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
