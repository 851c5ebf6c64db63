"""Features computed once, batched, and kept on disk, addressed by content.

Every example's features are stored under the SHA-256 of its input bytes, in a folder named by the stage's
exact spec and the input shape (``<root>/<key>/``). A stage is a function of one example alone, so a row's
features depend on nothing else: any tensor holding rows seen before — another run's split of the same data
set, the same test set, a site's data after a restart — reads them back instead of recomputing them. A study
of many runs on Fashion-MNIST computes each of its 70k images' features once.

Layout: chunks ``<id>.npy`` (float32, one row per example) with ``<id>.keys`` (16 bytes of SHA-256 per row),
each written to a temporary name and renamed, the keys last, so a chunk is visible only when complete and
concurrent writers (the processes of a torch.distributed run) never see each other's partial files.

Where: a deployed site keeps its features in its own folder (they are derived from its private rows); the
simulator's public data sets use ``$SILOFL_CACHE/features`` (default ``~/.cache/silofl/features``) unless the
run's ``features_cache`` names another folder (``off``: no disk cache).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from pathlib import Path

import numpy as np
import torch

from silofl.features.base import FeatureStage

KEY_BYTES = 16
BATCH = 256
OFF = ("off", "none")


def default_root() -> Path:
    """``$SILOFL_CACHE/features``, else ``~/.cache/silofl/features``."""
    base = os.environ.get("SILOFL_CACHE")
    return Path(base) / "features" if base else Path.home() / ".cache" / "silofl" / "features"


def cache_root(setting: str | None) -> Path | None:
    """The cache folder a run's ``features_cache`` setting names (None: the default; ``off``: no disk
    cache)."""
    if setting is None:
        return default_root()
    if setting.strip().lower() in OFF:
        return None
    return Path(setting).expanduser()


def row_keys(x: torch.Tensor) -> list[bytes]:
    """Each row's content key: SHA-256 (first 16 bytes) of its float32 bytes."""
    a = np.ascontiguousarray(x.detach().cpu().float().numpy().reshape(len(x), -1))
    return [hashlib.sha256(a[i]).digest()[:KEY_BYTES] for i in range(len(a))]


def stage_key(stage: FeatureStage, input_shape: tuple[int, ...]) -> str:
    """The folder name for a stage on inputs of one shape: SHA-256 of its spec."""
    text = json.dumps(
        {"stage": stage.spec(), "input_shape": list(input_shape), "dtype": "float32", "format": 1},
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class FeatureCache:
    """The on-disk features of one stage on one input shape (see the module doc)."""

    def __init__(self, root: Path, stage: FeatureStage, input_shape: tuple[int, ...]):
        self.stage, self.input_shape = stage, tuple(input_shape)
        self.dir = Path(root) / stage_key(stage, self.input_shape)
        self._index: dict[bytes, tuple[str, int]] = {}
        self._seen: set[str] = set()

    def _refresh(self) -> None:
        if not self.dir.is_dir():
            return
        for f in sorted(self.dir.glob("*.keys")):
            if f.stem in self._seen:
                continue
            raw = f.read_bytes()
            if len(raw) % KEY_BYTES or not (self.dir / f"{f.stem}.npy").is_file():
                continue  # not one of ours or incomplete: ignored, recomputed
            self._seen.add(f.stem)
            for i in range(len(raw) // KEY_BYTES):
                self._index.setdefault(raw[i * KEY_BYTES : (i + 1) * KEY_BYTES], (f.stem, i))

    def lookup(self, keys: list[bytes]) -> list[tuple[str, int] | None]:
        """Where each key's features are stored (None: not yet)."""
        self._refresh()
        return [self._index.get(k) for k in keys]

    def read(self, places: list[tuple[str, int]], out_shape: tuple[int, ...]) -> torch.Tensor:
        """The stored features at ``places`` (chunk, row), in order."""
        out = np.empty((len(places), int(np.prod(out_shape))), dtype=np.float32)
        by_chunk: dict[str, list[tuple[int, int]]] = {}
        for i, (chunk, row) in enumerate(places):
            by_chunk.setdefault(chunk, []).append((i, row))
        for chunk, pairs in by_chunk.items():
            arr = np.load(self.dir / f"{chunk}.npy", mmap_mode="r")
            if arr.ndim != 2 or arr.shape[1] != out.shape[1]:
                raise OSError(f"feature cache chunk {self.dir / chunk}.npy has shape {arr.shape}")
            at = np.fromiter((p for p, _ in pairs), dtype=np.int64)
            rows = np.fromiter((r for _, r in pairs), dtype=np.int64)
            order = np.argsort(rows)
            out[at[order]] = arr[rows[order]]
        return torch.from_numpy(out).reshape(len(places), *out_shape)

    def write(self, keys: list[bytes], feats: torch.Tensor) -> None:
        """Store computed rows as one new chunk."""
        self.dir.mkdir(parents=True, exist_ok=True)
        meta = self.dir / "stage.json"
        if not meta.exists():
            _atomic(
                meta,
                (
                    json.dumps({"stage": self.stage.spec(), "input_shape": list(self.input_shape)}, indent=1)
                    + "\n"
                ).encode(),
            )
        cid = f"{time.strftime('%Y%m%d%H%M%S')}-{secrets.token_hex(6)}"
        arr = np.ascontiguousarray(feats.detach().cpu().float().numpy().reshape(len(feats), -1))
        tmp = self.dir / f".{cid}.npy.tmp"
        with open(tmp, "wb") as fh:
            np.save(fh, arr)
        os.replace(tmp, self.dir / f"{cid}.npy")
        _atomic(self.dir / f"{cid}.keys", b"".join(keys))


def _atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def compute(
    stage: FeatureStage, x: torch.Tensor, label: str = "features", batch: int = BATCH
) -> torch.Tensor:
    """``stage`` applied to ``x`` in batches (with a progress bar on long work unless SILOFL_NO_PROGRESS is
    set)."""
    if len(x) == 0:
        return stage.transform(x[:0]) if len(x.shape) > 1 else x
    outs = []
    show = len(x) > 4 * batch and not os.environ.get("SILOFL_NO_PROGRESS")
    if show:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            transient=True,
        ) as p:
            task = p.add_task(f"{stage.name} features: {label}", total=len(x))
            for i in range(0, len(x), batch):
                outs.append(stage.transform(x[i : i + batch]))
                p.update(task, advance=len(outs[-1]))
    else:
        outs = [stage.transform(x[i : i + batch]) for i in range(0, len(x), batch)]
    return torch.cat(outs)


def features(
    stage: FeatureStage, x: torch.Tensor, cache: FeatureCache | None = None, label: str = "features"
) -> torch.Tensor:
    """Features of ``x`` (on ``x``'s device): rows already in ``cache`` are read back, the others computed
    (batched) and stored."""
    if stage.identity:
        return x
    out_shape = stage.output_shape(tuple(x.shape[1:]))
    if cache is None:
        return compute(stage, x, label).to(x.device)
    keys = row_keys(x)
    try:
        places = cache.lookup(keys)
    except OSError:
        places = [None] * len(keys)
    missing = [i for i, p in enumerate(places) if p is None]
    out = torch.empty((len(x), *out_shape), dtype=torch.float32)
    if missing:
        # duplicates of a missing row are computed once
        first: dict[bytes, int] = {}
        uniq = [i for i in missing if first.setdefault(keys[i], i) == i]
        new = compute(stage, x[torch.as_tensor(uniq)], label)
        try:
            cache.write([keys[i] for i in uniq], new)
        except OSError:
            pass  # a read-only or full disk: the features are still right, only not kept
        pos = {keys[i]: n for n, i in enumerate(uniq)}
        out[torch.as_tensor(missing)] = new[torch.as_tensor([pos[keys[i]] for i in missing])]
    have = [i for i, p in enumerate(places) if p is not None]
    if have:
        try:
            out[torch.as_tensor(have)] = cache.read([places[i] for i in have], out_shape)  # type: ignore[misc]
        except (OSError, ValueError):  # a damaged chunk: recompute those rows
            out[torch.as_tensor(have)] = compute(stage, x[torch.as_tensor(have)], label)
    return out.to(x.device)
