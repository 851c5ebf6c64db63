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

from dataclasses import dataclass

import numpy as np

from silofl.core.errors import DataError
from silofl.data.schema import Schema


@dataclass
class PubSubTable:
    x: np.ndarray
    y: np.ndarray
    features: list[str]
    lo: np.ndarray
    hi: np.ndarray
    defaults: np.ndarray
    classes: list[str]

    def metadata(self) -> dict[str, tuple]:
        """The broker's public per-feature metadata: (kind, default, low, high)."""
        return {f: ("continuous", float(d), float(a), float(b))
                for f, d, a, b in zip(self.features, self.defaults, self.lo, self.hi, strict=True)}


def encode(schema: Schema, raw: np.ndarray, y: np.ndarray) -> PubSubTable:
    """PubSub-ML's columns of a checked raw matrix (see the module doc)."""
    cols, names, lo, hi, defaults = [], [], [], [], []
    for j, f in enumerate(schema.features):
        v = raw[:, j]
        if f.kind == "numeric":
            if f.bounds is None:
                raise DataError(f"schema {schema.source}: PubSub-ML needs public bounds for every numeric feature; "
                                f"{f.name!r} has none")
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
    return PubSubTable(np.concatenate(cols, axis=1), np.asarray(y, dtype=np.int64), names, np.array(lo), np.array(hi),
                       np.array(defaults), list(schema.classes))


def read(path: str, schema_path: str) -> PubSubTable:
    """A site's file checked against the schema and encoded for PubSub-ML."""
    from silofl.data.schema import read_table

    schema = Schema.load(schema_path)
    raw, y, _ = schema.check(read_table(path), path)
    assert y is not None
    return encode(schema, raw, y)
