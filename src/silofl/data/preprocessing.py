"""Preprocessing a site fits on its own rows (or takes from the schema), applied the same way everywhere.

A table's raw matrix (:meth:`silofl.data.schema.Schema.check`: numbers as they are, categories as level
indices, NaN where missing) becomes model inputs in :class:`TableInput`, a torch module: a missing number
is filled (a declared public ``fill``, else the site's own mean), each number is centred and scaled
(``scaling: bounds``: the declared public bounds map to [-1, 1]; ``scaling: site``: the site's own mean
and standard deviation), and each categorical feature becomes a one-hot block over its declared levels
(a missing category is all zeros). Images are resized (PIL bilinear) to the run's size, read as grey or
RGB, scaled to [0, 1], then standardised per channel with the site's own mean and standard deviation in
:class:`ImageInput`.

The same module turns training rows, new rows at ``silofl predict`` and the inputs of an exported ONNX
graph into model inputs, so preprocessing cannot drift between them. Its parameters are written as
``preprocessing.json`` next to each site's models; ``site_statistics`` lists the values computed from the
site's own rows (they are not differentially private: a model card says so), and is empty when everything
came from the schema.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from silofl.core.errors import DataError
from silofl.data.schema import Schema

FORMAT = "silofl.preprocessing/1"


class TableInput(nn.Module):
    """Raw matrix (N × features, NaN = missing, categories as level indices) → model inputs (see module
    doc)."""

    center: torch.Tensor
    scale: torch.Tensor
    fill: torch.Tensor
    levels: torch.Tensor

    def __init__(
        self,
        kinds: list[str],
        center: list[float],
        scale: list[float],
        fill: list[float],
        n_levels: list[int],
    ):
        super().__init__()
        self.kinds, self.n_levels = list(kinds), list(n_levels)
        self.register_buffer("center", torch.tensor(center, dtype=torch.float32))
        self.register_buffer("scale", torch.tensor(scale, dtype=torch.float32))
        self.register_buffer("fill", torch.tensor(fill, dtype=torch.float32))
        self.register_buffer("levels", torch.arange(max([1, *n_levels]), dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pieces = []
        for j, kind in enumerate(self.kinds):
            v = x[:, j : j + 1]
            if kind == "numeric":
                v = torch.where(torch.isnan(v), self.fill[j], v)
                pieces.append((v - self.center[j]) / self.scale[j])
            else:  # NaN equals no level: a missing category is all zeros
                pieces.append((v == self.levels[: self.n_levels[j]]).to(x.dtype))
        return torch.cat(pieces, dim=1)


class ImageInput(nn.Module):
    """Images in [0, 1] (N × C × H × W) → standardised with the site's per-channel mean and std."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, mean: list[float], std: list[float]):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


@dataclass
class TablePreprocessing:
    """A site's fitted table preprocessing (see the module doc)."""

    schema: Schema
    center: list[float]  # per feature (categorical: 0)
    scale: list[float]  # per feature (categorical: 1)
    fill: list[float]  # per feature (NaN: no fill, a missing value stays missing)
    site: str = ""
    rows: int = 0
    site_statistics: list[str] = field(default_factory=list)
    kind: str = "table"

    @classmethod
    def fit(cls, schema: Schema, raw: np.ndarray, site: str = "") -> TablePreprocessing:
        """Fit on ``raw``, the site's own training rows, and the schema's public declarations only."""
        center, scale, fill, stats = [], [], [], []
        for j, f in enumerate(schema.features):
            if f.kind == "categorical":
                center.append(0.0)
                scale.append(1.0)
                fill.append(math.nan)
                continue
            col = raw[:, j]
            seen = col[~np.isnan(col)]
            mean = float(seen.mean()) if len(seen) else None
            if schema.scaling == "bounds":
                assert f.bounds is not None  # the schema checks it
                c, s = (f.bounds[0] + f.bounds[1]) / 2, (f.bounds[1] - f.bounds[0]) / 2
            else:
                if mean is None:
                    raise DataError(
                        f"site {site}: column {f.name!r} has no value at all, so scaling 'site' has no "
                        "mean to centre it on (declare bounds and use scaling: bounds)"
                    )
                sd = float(seen.std())
                c, s = mean, (sd if sd > 1e-12 else 1.0)
                stats += [f"mean of {f.name}", f"std of {f.name}"]
            if f.missing != "impute":
                fv = math.nan
            elif f.fill is not None:
                fv = f.fill
            elif mean is not None:
                fv = mean
                if schema.scaling == "bounds":
                    stats.append(f"mean of {f.name} (fill)")
            else:
                fv = c  # no value at this site: the centre (public under scaling bounds)
            center.append(c)
            scale.append(s)
            fill.append(fv)
        return cls(schema, center, scale, fill, site, len(raw), stats)

    @property
    def classes(self) -> list[str]:
        """The schema's class names, in the order of the model's outputs."""
        return list(self.schema.classes)

    @property
    def columns(self) -> list[str]:
        """The model's input columns: numeric features by name, one-hot columns as ``name=level``."""
        out = []
        for f in self.schema.features:
            out += [f.name] if f.kind == "numeric" else [f"{f.name}={lv}" for lv in f.levels]
        return out

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one model input: one column per numeric feature and per categorical level."""
        return (len(self.columns),)

    def module(self) -> TableInput:
        """A torch module applying this preprocessing (exported with the model)."""
        return TableInput(
            [f.kind for f in self.schema.features],
            self.center,
            self.scale,
            self.fill,
            [len(f.levels) for f in self.schema.features],
        )

    @torch.no_grad()
    def transform(self, raw: np.ndarray) -> torch.Tensor:
        """Model inputs of a raw matrix."""
        return self.module()(torch.as_tensor(raw, dtype=torch.float32))

    def read(self, path: str | Path) -> tuple[torch.Tensor, np.ndarray | None, list[str]]:
        """(raw inputs, class indices if the file has the target, row ids) of a new file, checked against the
        schema. Rows are never dropped here: a missing value where the schema does not impute is an error."""
        from silofl.data.schema import read_table

        schema = self.schema
        strict = Schema(
            tuple(_no_drop(f) for f in schema.features),
            schema.target,
            schema.classes,
            schema.scaling,
            schema.ignore,
            schema.na_values,
            "error",
            schema.source,
            survival=schema.survival,  # a survival target: y is [time, event] where the file has both
            survival_bins=schema.survival_bins,
        )
        raw, y, _ = strict.check(read_table(path), str(path), need_target=False)
        return torch.as_tensor(raw, dtype=torch.float32), y, [str(i + 1) for i in range(len(raw))]

    def to_dict(self) -> dict[str, Any]:
        """The JSON form written to ``preprocessing.json``; ``site_statistics`` names what was fitted on
        site data."""
        return {
            "format": FORMAT,
            "kind": "table",
            "site": self.site,
            "rows": self.rows,
            "schema": self.schema.to_dict(),
            "columns": self.columns,
            "classes": self.classes,
            "center": self.center,
            "scale": self.scale,
            "fill": [None if math.isnan(v) else v for v in self.fill],
            "site_statistics": self.site_statistics,
            "input": "one float32 column per schema feature, in schema order: numbers as they are (NaN where "
            "missing), categories as the index of their level in the schema (NaN where missing)",
            "steps": "numeric: fill NaN (where missing: impute), then (x - center) / scale; categorical: "
            "one-hot "
            "over the levels (missing: all zeros); columns in schema order",
        }

    @classmethod
    def from_dict(cls, d: dict) -> TablePreprocessing:
        schema = Schema.from_dict(d["schema"], source="preprocessing.json")
        fill = [math.nan if v is None else float(v) for v in d["fill"]]
        return cls(
            schema,
            [float(v) for v in d["center"]],
            [float(v) for v in d["scale"]],
            fill,
            d.get("site", ""),
            int(d.get("rows", 0)),
            list(d.get("site_statistics", [])),
        )


@dataclass
class ImagePreprocessing:
    """A site's image preprocessing: resize, grey/RGB, [0, 1], then its own per-channel mean and std."""

    image_size: int
    mode: str  # "L" | "RGB"
    mean: list[float]
    std: list[float]
    classes: list[str]
    site: str = ""
    rows: int = 0
    site_statistics: list[str] = field(default_factory=list)
    kind: str = "image"

    @classmethod
    def fit(
        cls, x: torch.Tensor, image_size: int, mode: str, classes: list[str], site: str = ""
    ) -> ImagePreprocessing:
        """Fit the per-channel mean and std on ``x``, the site's own training images in [0, 1]."""
        mean = x.mean((0, 2, 3)).tolist()
        std = x.std((0, 2, 3)).clamp(min=1e-6).tolist() if len(x) > 1 else [1.0] * x.shape[1]
        return cls(
            image_size,
            mode,
            mean,
            std,
            list(classes),
            site,
            len(x),
            ["per-channel mean of the images", "per-channel std of the images"],
        )

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one model input: channels × size × size."""
        return (1 if self.mode == "L" else 3, self.image_size, self.image_size)

    def module(self) -> ImageInput:
        """A torch module applying this preprocessing (exported with the model)."""
        return ImageInput(self.mean, self.std)

    @torch.no_grad()
    def transform(self, x: torch.Tensor) -> torch.Tensor:
        """Model inputs of images in [0, 1]."""
        return self.module()(x)

    def read(self, path: str | Path) -> tuple[torch.Tensor, np.ndarray | None, list[str]]:
        """(images in [0, 1], class indices when they sit in class-named sub-folders, file names) of a
        folder."""
        from silofl.data.formats import IMAGE_SUFFIXES, read_images

        root = Path(path)
        if root.is_file() and root.suffix.lower() in IMAGE_SUFFIXES:
            files, base = [root], root.parent
        elif root.is_dir():
            files, base = sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES), root
        else:
            raise DataError(f"{root}: no such image or folder of images")
        if not files:
            raise DataError(f"{root}: no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
        x = torch.from_numpy(read_images(files, self.image_size, self.mode))
        names = [str(f.relative_to(base)) for f in files]
        index = {c: i for i, c in enumerate(self.classes)}
        parents = [f.parent.name for f in files]
        y = (
            np.array([index[p] for p in parents])
            if all(p in index for p in parents) and root.is_dir()
            else None
        )
        return x, y, names

    def to_dict(self) -> dict[str, Any]:
        """The JSON form written to ``preprocessing.json``; ``site_statistics`` names what was fitted on
        site data."""
        return {
            "format": FORMAT,
            "kind": "image",
            "site": self.site,
            "rows": self.rows,
            "image_size": self.image_size,
            "mode": self.mode,
            "mean": self.mean,
            "std": self.std,
            "classes": self.classes,
            "site_statistics": self.site_statistics,
            "input": f"float32 N×{self.input_shape[0]}×{self.image_size}×{self.image_size}: each image "
            f"resized to "
            f"{self.image_size}×{self.image_size} (bilinear), {'grey' if self.mode == 'L' else 'RGB'}, "
            "pixel values / 255",
            "steps": "(x - mean) / std per channel",
        }

    @classmethod
    def from_dict(cls, d: dict) -> ImagePreprocessing:
        return cls(
            int(d["image_size"]),
            str(d["mode"]),
            [float(v) for v in d["mean"]],
            [float(v) for v in d["std"]],
            [str(c) for c in d["classes"]],
            d.get("site", ""),
            int(d.get("rows", 0)),
            list(d.get("site_statistics", [])),
        )


Preprocessing = TablePreprocessing | ImagePreprocessing


def preprocessing_from_dict(d: dict) -> Preprocessing:
    """A preprocessing from its JSON (``preprocessing.json``)."""
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise DataError(
            f"not a silofl preprocessing file (format {d.get('format') if isinstance(d, dict) else None!r})"
        )
    try:
        if d.get("kind") == "table":
            return TablePreprocessing.from_dict(d)
        if d.get("kind") == "image":
            return ImagePreprocessing.from_dict(d)
    except (KeyError, TypeError, ValueError) as e:
        raise DataError(f"invalid preprocessing file: {e}") from None
    raise DataError(f"unknown preprocessing kind {d.get('kind')!r}")


def _no_drop(f):
    from dataclasses import replace

    return replace(f, missing="error") if f.missing == "drop" else f
