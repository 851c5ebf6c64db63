"""A site's schema-checked table as PubSub-ML reads it: named numeric columns with public bounds.

PubSub-ML's models take named numeric features, each with public bounds its DP mechanisms clip to, and a
public default a subscriber uses for a feature it lacks. From a table checked against the collaboration's
schema (:mod:`silofl.data.schema`): a numeric feature keeps its name, its declared bounds and, as default,
its declared ``fill`` (else the middle of its bounds); a categorical feature becomes one 0/1 column per
level, ``name=level``, bounds [0, 1], default 0. A missing number is filled with that public default and a
missing category is all zeros, so no statistic of the site's rows enters what it trains or publishes (the
site then joins the broker with the schema's public metadata instead of its data's min/max/mean).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import numpy as np

from silofl.core.errors import DataError
from silofl.data.schema import Schema


@dataclass
class PubSubTable:
    """A site's rows as PubSub-ML reads them, with the schema's public metadata and each row's record id."""

    x: np.ndarray
    y: np.ndarray
    features: list[str]
    lo: np.ndarray
    hi: np.ndarray
    defaults: np.ndarray
    classes: list[str] | None  # None for a regression target
    task: str = "classification"
    y_bounds: tuple[float, float] | None = None  # a regression target's declared public range
    ids: list[str] = field(default_factory=list)  # one record id per row (the ledger keys releases by them)

    def metadata(self) -> dict[str, tuple]:
        """The broker's public per-feature metadata: (kind, default, low, high)."""
        return {
            f: ("continuous", float(d), float(a), float(b))
            for f, d, a, b in zip(self.features, self.defaults, self.lo, self.hi, strict=True)
        }


def encode(schema: Schema, raw: np.ndarray, y: np.ndarray) -> PubSubTable:
    """PubSub-ML's columns of a checked raw matrix (see the module doc)."""
    cols, names, lo, hi, defaults = [], [], [], [], []
    for j, f in enumerate(schema.features):
        v = raw[:, j]
        if f.kind == "numeric":
            if f.bounds is None:
                raise DataError(
                    f"schema {schema.source}: PubSub-ML needs public bounds for every numeric feature; "
                    f"{f.name!r} has none"
                )
            d = f.fill if f.fill is not None else (f.bounds[0] + f.bounds[1]) / 2
            cols.append(np.where(np.isnan(v), d, v)[:, None])
            names.append(f.name)
            lo.append(f.bounds[0])
            hi.append(f.bounds[1])
            defaults.append(d)
        else:
            cols.append((v[:, None] == np.arange(len(f.levels))[None, :]).astype(np.float64))
            names += [f"{f.name}={lv}" for lv in f.levels]
            lo += [0.0] * len(f.levels)
            hi += [1.0] * len(f.levels)
            defaults += [0.0] * len(f.levels)
    regression = schema.task == "regression"
    return PubSubTable(
        np.concatenate(cols, axis=1),
        np.asarray(y, dtype=np.float64 if regression else np.int64),
        names,
        np.array(lo),
        np.array(hi),
        np.array(defaults),
        None if regression else list(schema.classes),
        schema.task,
        schema.target_bounds,
    )


def read(path: str, schema_path: str, id_column: str | None = None) -> PubSubTable:
    """A site's file checked against the schema and encoded for PubSub-ML, with each row's record id: the
    ``id_column``'s value, or else a digest of the row's content (the same record read again gets the same id,
    in any file or order; the k-th identical copy of a row gets ``#k``)."""
    from silofl.data.schema import read_table

    schema = Schema.load(schema_path)
    if schema.task == "survival":
        raise DataError(
            f"schema {schema_path}: PubSub-ML publishes classifiers and regressors; a survival target is "
            "for the non-DP Cox head (silofl.training.survival)"
        )
    df = read_table(path)
    if id_column is not None and id_column not in df.columns:
        raise DataError(f"{path}: no id column {id_column!r}")
    kept: list[int] = []
    raw, y, _ = schema.check(df, path, extra=(id_column,) if id_column else (), kept=kept)
    assert y is not None
    table = encode(schema, raw, y)
    if id_column is not None:
        ids = [str(v) for v in df[id_column].to_numpy()[kept]]
        if len(set(ids)) != len(ids):
            raise DataError(f"{path}: the id column {id_column!r} repeats a value")
    else:
        cols = [c for c in (*schema.names, schema.target) if c in df.columns]
        rows = df[cols].astype(str).to_numpy()[kept]
        seen: dict[str, int] = {}
        ids = []
        for r in rows:  # identical rows are distinct records: the k-th copy gets "#k"
            h = hashlib.sha256(json.dumps(r.tolist()).encode()).hexdigest()
            seen[h] = seen.get(h, -1) + 1
            ids.append(h if seen[h] == 0 else f"{h}#{seen[h]}")
    table.ids = ids
    return table
