"""A table's schema, shared by the collaboration, and a site's file checked against it.

The schema (YAML or JSON) is the one thing about the data that every site agrees on and may publish:
the feature names and types, the target and its classes, each categorical feature's levels, numeric
bounds declared as public knowledge, and what to do with a missing value::

    target: {name: species, levels: [Adelie, Chinstrap, Gentoo]}   # a regression target: {name: y, bounds:
    [0, 350]}
    features:
      bill_length_mm: {type: numeric, bounds: [25, 65]}
      sex: {type: categorical, levels: [female, male]}
    missing: impute        # error (default) | drop | impute; per feature too
    scaling: bounds        # bounds | site (default: bounds when every numeric feature declares them)
    ignore: [island, year] # columns a file may carry that are not features

A site's file (CSV with a header row, or Parquet) is checked column by column; the first problem is a
:class:`~silofl.core.errors.DataError` naming the file, the column and the row (rows are counted from 1
below the header): a missing or extra column, a value of the wrong type, a category not among the
declared levels, a number outside its declared bounds, a missing value where the policy is ``error``,
an empty file. What passes becomes a *raw matrix*, one column per feature in schema order: numeric
values as they are (NaN where missing), categorical values as the index of their level (NaN where
missing). :mod:`silofl.data.preprocessing` turns that into model inputs.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from silofl.core.errors import DataError

FORMAT = "silofl.schema/1"
KINDS = ("numeric", "categorical")
MISSING = ("error", "drop", "impute")
SCALINGS = ("bounds", "site")
NA_VALUES = ("", "NA", "N/A", "NaN", "nan", "null", "NULL", "None", "?")
TABLE_SUFFIXES = (".csv", ".tsv", ".txt", ".parquet", ".pq")


@dataclass(frozen=True)
class Feature:
    """One column of the schema."""

    name: str
    kind: str  # numeric | categorical
    levels: tuple[str, ...] = ()
    bounds: tuple[float, float] | None = None  # public knowledge: every value must lie within
    missing: str = "error"  # error | drop | impute
    fill: float | None = None  # a public value for a missing numeric entry (else the site's own mean)

    def to_dict(self) -> dict[str, Any]:
        """The feature as written in a schema file."""
        d: dict[str, Any] = {"type": self.kind}
        if self.kind == "categorical":
            d["levels"] = list(self.levels)
        if self.bounds is not None:
            d["bounds"] = list(self.bounds)
        d["missing"] = self.missing
        if self.fill is not None:
            d["fill"] = self.fill
        return d


@dataclass(frozen=True)
class Schema:
    """See the module doc."""

    features: tuple[Feature, ...]
    target: str
    classes: tuple[str, ...]  # the target's levels (classification); empty for a regression target
    scaling: str = "bounds"
    ignore: tuple[str, ...] = ()
    na_values: tuple[str, ...] = NA_VALUES
    missing: str = "error"  # the default policy (features may override it)
    source: str = field(default="", compare=False)
    target_bounds: tuple[float, float] | None = None  # a regression target's declared public range
    # a survival target {type: survival, time: COL, event: COL}: (time column, event column); ``target`` is
    # then the time column (silofl.training.survival: a Cox head, C-index)
    survival: tuple[str, str] | None = None
    # a survival target's public time bins (its inner edges, ``bins: [30, 90, 180]``): what a run's
    # DP-trainable piecewise-exponential model is fitted on (silofl.training.survival.encode_target); ()
    # when not declared
    survival_bins: tuple[float, ...] = ()

    @property
    def task(self) -> str:
        """``classification`` (the target has levels), ``regression`` (it has bounds) or ``survival`` (a time
        and an event column)."""
        if self.survival is not None:
            return "survival"
        return "regression" if self.target_bounds is not None else "classification"

    # ------------------------------------------------------------------ the schema file
    @classmethod
    def load(cls, path: str | Path) -> Schema:
        """Read a schema from YAML or JSON; a one-line DataError says what is wrong with it."""
        p = Path(path)
        if not p.is_file():
            raise DataError(f"schema file {p} not found")
        try:
            text = p.read_text()
            if p.suffix.lower() == ".json":
                data = json.loads(text)
            else:
                import yaml

                data = yaml.safe_load(text)
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise DataError(f"schema {p}: cannot read it ({str(e).splitlines()[0]})") from None
        except Exception as e:  # yaml.YAMLError
            raise DataError(f"schema {p} is not valid YAML: {str(e).splitlines()[0]}") from None
        return cls.from_dict(data, source=str(p))

    @classmethod
    def from_dict(cls, data: Any, source: str = "schema") -> Schema:
        """A schema from plain data (the file's content)."""
        where = f"schema {source}"
        if not isinstance(data, dict):
            raise DataError(f"{where} must be a mapping with 'target' and 'features'")
        unknown = sorted(
            set(data) - {"format", "target", "features", "missing", "scaling", "ignore", "na_values"}
        )
        if unknown:
            raise DataError(
                f"{where}: unknown key(s) {', '.join(unknown)} (keys: target, features, missing, scaling, "
                "ignore, na_values)"
            )
        fmt = data.get("format", FORMAT)
        if fmt != FORMAT:
            raise DataError(f"{where}: format {fmt!r} is not {FORMAT!r}")
        missing = data.get("missing", "error")
        if missing not in MISSING:
            raise DataError(f"{where}: missing must be one of {', '.join(MISSING)}, got {missing!r}")
        target = data.get("target")
        survival = _survival_target(target, where)
        bins = _survival_bins(target, where) if survival is not None and isinstance(target, dict) else ()
        if survival is not None:  # the time column stands for the target where one column is asked for
            target = {"name": survival[0], "bounds": [0.0, 1.0]}
        if isinstance(target, str) or not isinstance(target, dict) or "name" not in target:
            raise DataError(
                f"{where}: target must be a mapping {{name: COLUMN, levels: [CLASS, ...]}} (or, for "
                "regression, {name: COLUMN, bounds: [LOW, HIGH]})"
            )
        target_bounds, classes = _target_kind(target, where)
        raw = data.get("features")
        if isinstance(raw, dict):
            items = [{"name": k, **(v if isinstance(v, dict) else {"type": v})} for k, v in raw.items()]
        elif isinstance(raw, list) and all(isinstance(v, dict) for v in raw):
            items = list(raw)
        else:
            raise DataError(f"{where}: features must be a mapping NAME: {{type: numeric|categorical, ...}}")
        if not items:
            raise DataError(f"{where} declares no features")
        features = [_feature(it, missing, where) for it in items]
        names = [f.name for f in features]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise DataError(f"{where}: feature {dup[0]!r} is declared twice")
        if str(target["name"]) in names:
            raise DataError(f"{where}: the target {target['name']!r} is also declared as a feature")
        if survival is not None and survival[1] in names:
            raise DataError(f"{where}: the event column {survival[1]!r} is also declared as a feature")
        numeric = [f for f in features if f.kind == "numeric"]
        scaling = data.get("scaling", "bounds" if all(f.bounds is not None for f in numeric) else "site")
        if scaling not in SCALINGS:
            raise DataError(f"{where}: scaling must be one of {', '.join(SCALINGS)}, got {scaling!r}")
        if scaling == "bounds":
            lacking = [f.name for f in numeric if f.bounds is None]
            if lacking:
                raise DataError(
                    f"{where}: scaling 'bounds' needs bounds for every numeric feature; {lacking[0]!r} has "
                    "none (declare them, or use scaling: site)"
                )
        ignore = data.get("ignore", [])
        if not isinstance(ignore, list):
            raise DataError(f"{where}: ignore must be a list of column names")
        na = data.get("na_values", list(NA_VALUES))
        if not isinstance(na, list):
            raise DataError(f"{where}: na_values must be a list of strings")
        return cls(
            tuple(features),
            str(target["name"]),
            tuple(classes),
            scaling,
            tuple(str(c) for c in ignore),
            tuple(str(v) for v in na),
            missing,
            source,
            None if survival is not None else target_bounds,
            survival,
            bins,
        )

    def to_dict(self) -> dict[str, Any]:
        """The schema as plain data (what the file holds, defaults filled)."""
        target: dict[str, Any] = (
            {"name": self.target, "bounds": list(self.target_bounds)}
            if self.target_bounds is not None
            else {"name": self.target, "levels": list(self.classes)}
        )
        if self.survival is not None:
            target = {"type": "survival", "time": self.survival[0], "event": self.survival[1]}
            if self.survival_bins:
                target["bins"] = list(self.survival_bins)
        return {
            "format": FORMAT,
            "target": target,
            "features": {f.name: f.to_dict() for f in self.features},
            "missing": self.missing,
            "scaling": self.scaling,
            "ignore": list(self.ignore),
            "na_values": list(self.na_values),
        }

    @property
    def names(self) -> list[str]:
        """The feature names, in order."""
        return [f.name for f in self.features]

    # ------------------------------------------------------------------ a site's file
    def check(
        self, df, source: str, need_target: bool = True, extra: tuple[str, ...] = (), kept: list | None = None
    ) -> tuple[np.ndarray, np.ndarray | None, int]:
        """(raw matrix, class index (or regression value) per row or None, rows dropped) of a table read by
        :func:`read_table`, checked against the schema. ``need_target``: the target column must be there
        (training); without, it is used when present (new data to predict on). ``extra``: further columns the
        file may hold (e.g. record ids); ``kept`` receives the indices of the rows kept."""
        n = len(df)
        if n == 0:
            raise DataError(f"{source}: the file has a header but no data rows")
        cols = [str(c) for c in df.columns]
        event = [self.survival[1]] if self.survival is not None else []
        need = self.names + ([self.target, *event] if need_target else [])
        problems = self._column_problems(cols, need, extra)
        present = [f for f in self.features if f.name in cols]
        raw = np.full((n, len(self.features)), np.nan)
        drop = np.zeros(n, dtype=bool)
        for j, f in enumerate(self.features):
            if f not in present:
                continue
            try:
                raw[:, j], na = self._feature_values(df[f.name], f, source)
            except DataError as e:  # every column's problem is named at once, not the first only
                problems.append(str(e).removeprefix(f"{source}: "))
                continue
            if f.missing == "drop":
                drop |= na
        if len(problems) == 1:
            raise DataError(f"{source}: {problems[0]}")
        if problems:
            raise DataError(f"{source}: {len(problems)} mismatches with the schema: " + "; ".join(problems))
        y = None
        if self.survival is not None and all(c in cols for c in self.survival):
            times, na = self._survival(df, source)
            if na.any() and need_target:
                if self.missing != "drop":
                    i = int(np.flatnonzero(na)[0])
                    raise DataError(
                        f"{source}: the time or event of row {i + 1} is empty ({int(na.sum())} rows); a "
                        "training row needs both (missing: drop skips such rows)"
                    )
                drop |= na
            if need_target or not na.any():
                y = times
        elif self.survival is None and self.target in cols:
            col = df[self.target]
            na = self._missing(col)
            if na.any() and need_target:
                if self.missing != "drop":
                    i = int(np.flatnonzero(na)[0])
                    raise DataError(
                        f"{source}: the target {self.target!r} is empty in row {i + 1} ({int(na.sum())} "
                        "rows); a training row needs its class (missing: drop skips such rows)"
                    )
                drop |= na
            if self.target_bounds is not None:
                idx = self._numeric(
                    col, na, Feature(self.target, "numeric", bounds=self.target_bounds), source
                )
            else:
                idx = self._categorical(col, na, self.target, self.classes, source)
            if need_target or not na.any():
                y = idx
        keep = ~drop
        if not keep.any():
            raise DataError(
                f"{source}: every one of its {n} rows has a missing value the schema says to drop"
            )
        raw = raw[keep]
        if kept is not None:
            kept.extend(np.flatnonzero(keep).tolist())
        if y is not None:
            y = y[keep] if self.target_bounds is not None or self.survival else y[keep].astype(np.int64)
        return raw, y, int(drop.sum())

    def _column_problems(self, cols: list[str], need: list[str], extra: tuple[str, ...]) -> list[str]:
        """Every column the schema needs that the file lacks, and every column of the file the schema does
        not know, one message each."""
        event = [self.survival[1]] if self.survival is not None else []
        known = set(self.names) | {self.target} | set(event) | set(self.ignore) | set(extra)
        out = [f"column {c!r} of the schema is missing" for c in need if c not in cols]
        unexpected = [c for c in cols if c not in known]
        if unexpected:
            shown = ", ".join(repr(c) for c in unexpected)
            one = len(unexpected) == 1
            it, s, be = ("it", "", "is") if one else ("them", "s", "are")
            out.append(
                f"column{s} {shown} {be} not in the schema: declare {it} as a feature{s}, or list {it} under "
                f"'ignore' to skip {it}"
            )
        return out

    def _feature_values(self, col, f: Feature, source: str) -> tuple[np.ndarray, np.ndarray]:
        """(one feature's raw values, which rows miss it): a DataError for a value the schema refuses or a
        missing value its policy does not allow."""
        na = self._missing(col)
        if f.kind == "numeric":
            values = self._numeric(col, na, f, source)
        else:
            values = self._categorical(col, na, f.name, f.levels, source)
        if na.any() and f.missing == "error":
            i = int(np.flatnonzero(na)[0])
            raise DataError(
                f"{source}: column {f.name!r} is empty in row {i + 1} ({int(na.sum())} rows); the "
                "schema's missing policy for it is 'error' (use 'drop' or 'impute')"
            )
        return values, na

    def _survival(self, df, source: str) -> tuple[np.ndarray, np.ndarray]:
        """((n, 2) float64 [time, event] per row, NaN where missing; which rows miss either): a time is a
        finite number ≥ 0, an event is 1 (the event happened at that time) or 0 (censored then)."""
        assert self.survival is not None
        t_col, e_col = self.survival
        t_na, e_na = self._missing(df[t_col]), self._missing(df[e_col])
        times = self._numeric(df[t_col], t_na, Feature(t_col, "numeric", bounds=(0.0, math.inf)), source)
        events = np.full(len(df), np.nan)
        for i, v in enumerate(df[e_col].to_numpy(dtype=object)):
            if e_na[i]:
                continue
            word = _level(v).lower()
            if word not in ("0", "1", "true", "false"):
                raise DataError(
                    f"{source}: the event column {e_col!r} holds {v!r} in row {i + 1}; an event is 1 (it "
                    "happened) or 0 (censored)"
                )
            events[i] = 1.0 if word in ("1", "true") else 0.0
        return np.stack([times, events], axis=1), t_na | e_na

    def _missing(self, col) -> np.ndarray:
        import pandas as pd

        if pd.api.types.is_numeric_dtype(col.dtype) and not pd.api.types.is_bool_dtype(col.dtype):
            return col.isna().to_numpy()
        tokens = set(self.na_values)
        return np.array(
            [
                v is None or (isinstance(v, float) and math.isnan(v)) or str(v).strip() in tokens
                for v in col.to_numpy(dtype=object)
            ],
            dtype=bool,
        )

    @staticmethod
    def _numeric(col, na: np.ndarray, f: Feature, source: str) -> np.ndarray:
        import pandas as pd

        values = col.to_numpy(dtype=object)
        out = np.full(len(values), np.nan)
        for i in np.flatnonzero(~na):
            v = values[i]
            if isinstance(v, bool) or pd.api.types.is_bool(v):
                x = math.nan
            else:
                try:
                    x = float(str(v).strip()) if isinstance(v, str) else float(v)
                except (TypeError, ValueError):
                    x = math.nan
            if not math.isfinite(x):
                raise DataError(
                    f"{source}: column {f.name!r} is numeric in the schema but row {i + 1} holds {v!r}"
                )
            out[i] = x
        if f.bounds is not None:
            lo, hi = f.bounds
            bad = ~na & ((out < lo) | (out > hi))
            if bad.any():
                first = int(np.flatnonzero(bad)[0])
                raise DataError(
                    f"{source}: column {f.name!r} has {out[first]:g} in row {first + 1}, outside its "
                    f"declared bounds "
                    f"[{lo:g}, {hi:g}] ({int(bad.sum())} rows out of bounds)"
                )
        return out

    @staticmethod
    def _categorical(col, na: np.ndarray, name: str, levels: tuple[str, ...], source: str) -> np.ndarray:
        index = {lv: i for i, lv in enumerate(levels)}
        values = col.to_numpy(dtype=object)
        out = np.full(len(values), np.nan)
        for i in np.flatnonzero(~na):
            v = _level(values[i])
            if v not in index:
                shown = ", ".join(levels[:8]) + (", …" if len(levels) > 8 else "")
                raise DataError(
                    f"{source}: column {name!r} has value {v!r} in row {i + 1}, not one of its levels "
                    f"({shown}); add it to the schema if it is valid"
                )
            out[i] = index[v]
        return out


def _survival_target(target: Any, where: str) -> tuple[str, str] | None:
    """(time column, event column) of a survival target ``{type: survival, time: COL, event: COL}``; None for
    another target."""
    if not isinstance(target, dict) or target.get("type") != "survival":
        return None
    unknown = sorted(set(target) - {"type", "time", "event", "bins"})
    t, e = target.get("time"), target.get("event")
    if unknown or not isinstance(t, str) or not isinstance(e, str) or not t or not e or t == e:
        raise DataError(
            f"{where}: a survival target is {{type: survival, time: COLUMN, event: COLUMN}} (two different "
            "columns)"
        )
    return t, e


def _survival_bins(target: dict, where: str) -> tuple[float, ...]:
    """A survival target's public time bins (``bins: [EDGE, ...]``, inner edges, positive and increasing);
    () when not declared."""
    if "bins" not in target:
        return ()
    from silofl.training.survival import check_edges

    raw = target["bins"]
    if not isinstance(raw, list) or any(isinstance(v, bool) for v in raw):
        raise DataError(f"{where}: a survival target's bins are a list of times [EDGE, ...], got {raw!r}")
    try:
        return check_edges(raw)
    except ValueError as e:
        raise DataError(f"{where}: {e}") from None


def _target_kind(target: dict, where: str) -> tuple[tuple[float, float] | None, list[str]]:
    """(bounds, classes) of the target: bounds [LOW, HIGH] for a regression target, else its levels."""
    target_bounds: tuple[float, float] | None = None
    classes: list[str] = []
    if "bounds" in target and "levels" not in target:
        b = target["bounds"]
        if (
            not isinstance(b, list)
            or len(b) != 2
            or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in b
            )
            or b[0] >= b[1]
        ):
            raise DataError(
                f"{where}: the regression target {target['name']!r} needs bounds [LOW, HIGH] with LOW < HIGH"
            )
        target_bounds = (float(b[0]), float(b[1]))
    else:
        levels = target.get("levels")
        if not isinstance(levels, list) or len(levels) < 2:
            raise DataError(
                f"{where}: the target {target['name']!r} needs at least two levels (its classes), or "
                "bounds for a regression target"
            )
        classes = [_level(c) for c in levels]
        if len(set(classes)) != len(classes):
            raise DataError(f"{where}: the target's levels repeat a value")
    return target_bounds, classes


def _level(v: Any) -> str:
    """A categorical value as the schema writes it (integral floats without '.0', strings stripped)."""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, np.floating) and float(v).is_integer():
        return str(int(v))
    return str(v).strip()


def _feature(item: dict, default_missing: str, where: str) -> Feature:
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise DataError(f"{where}: a feature has no name")
    unknown = sorted(set(item) - {"name", "type", "levels", "bounds", "missing", "fill"})
    if unknown:
        raise DataError(f"{where}: feature {name!r} has unknown key(s) {', '.join(unknown)}")
    kind = item.get("type")
    if kind not in KINDS:
        raise DataError(f"{where}: feature {name!r} has type {kind!r}; use numeric or categorical")
    missing = item.get("missing", default_missing)
    if missing not in MISSING:
        raise DataError(
            f"{where}: feature {name!r}: missing must be one of {', '.join(MISSING)}, got {missing!r}"
        )
    levels: tuple[str, ...] = ()
    bounds = fill = None
    if kind == "categorical":
        lv = item.get("levels")
        if not isinstance(lv, list) or not lv:
            raise DataError(f"{where}: categorical feature {name!r} needs its levels (a list of values)")
        levels = tuple(_level(v) for v in lv)
        if len(set(levels)) != len(levels):
            raise DataError(f"{where}: feature {name!r} repeats a level")
        if "bounds" in item or "fill" in item:
            raise DataError(f"{where}: categorical feature {name!r} takes levels, not bounds or fill")
    else:
        if "levels" in item:
            raise DataError(f"{where}: numeric feature {name!r} takes bounds, not levels")
        if "bounds" in item:
            b = item["bounds"]
            try:
                lo, hi = float(b[0]), float(b[1])
                if len(b) != 2:
                    raise ValueError
            except (TypeError, ValueError, IndexError, KeyError):
                raise DataError(f"{where}: feature {name!r}: bounds must be [low, high], got {b!r}") from None
            if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                raise DataError(
                    f"{where}: feature {name!r}: bounds need finite low < high, got [{lo:g}, {hi:g}]"
                )
            bounds = (lo, hi)
        if "fill" in item:
            try:
                fill = float(item["fill"])
            except (TypeError, ValueError):
                raise DataError(
                    f"{where}: feature {name!r}: fill must be a number, got {item['fill']!r}"
                ) from None
            if bounds is not None and not bounds[0] <= fill <= bounds[1]:
                raise DataError(f"{where}: feature {name!r}: fill {fill:g} lies outside its bounds")
    return Feature(name, kind, levels, bounds, missing, fill)


# ---------------------------------------------------------------------------------------------- reading
def is_table(path: str | Path) -> bool:
    """Whether ``path`` names a table file (CSV/TSV or Parquet, optionally gzipped CSV)."""
    name = Path(path).name.lower()
    return name.endswith(TABLE_SUFFIXES) or name.endswith(".csv.gz")


def read_table(path: str | Path):
    """A CSV (header row; comma, or tab for .tsv) or Parquet file as a pandas DataFrame. CSV cells stay text
    (the schema decides types); a DataError names the file when it cannot be read."""
    import pandas as pd

    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: file not found")
    name = p.name.lower()
    if name.endswith((".parquet", ".pq")):
        try:
            df = pd.read_parquet(p)
        except Exception as e:  # pyarrow raises its own error types for a damaged file
            raise DataError(f"{p}: not a readable Parquet file ({str(e).splitlines()[0]})") from None
    elif is_table(p):
        sep = "\t" if name.endswith(".tsv") else ","
        try:
            with _open_text(p) as f:
                header = next(csv.reader(f, delimiter=sep), None)
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(f"{p}: cannot read it as text ({e})") from None
        if not header or not any(h.strip() for h in header):
            raise DataError(f"{p}: the file is empty (no header row)")
        names = [h.strip() for h in header]
        dup = sorted({h for h in names if names.count(h) > 1})
        if dup:
            raise DataError(f"{p}: column {dup[0]!r} appears twice in the header")
        try:
            df = pd.read_csv(
                p, sep=sep, dtype=str, keep_default_na=False, na_filter=False, encoding="utf-8-sig"
            )
        except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as e:
            raise DataError(f"{p}: not a readable CSV file ({str(e).splitlines()[0]})") from None
        df.columns = names
    else:
        raise DataError(f"{p}: unknown table format; use .csv, .tsv or .parquet")
    df.columns = [str(c).strip() for c in df.columns]
    return df


def _open_text(p: Path):
    import gzip

    # utf-8-sig: a UTF-8 byte-order mark (Excel's CSV export) is read as one, not as part of the first name
    if p.name.lower().endswith(".gz"):
        return gzip.open(p, "rt", newline="", encoding="utf-8-sig")
    return open(p, newline="", encoding="utf-8-sig")


MAX_PROPOSED_LEVELS = (
    20  # a text column with more distinct values is proposed under 'ignore' (an id, free text)
)


def propose(df, target: str | None = None, source: str = "table") -> dict[str, Any]:
    """A schema proposed from one table (:func:`read_table`'s frame) for its owner to review: every column
    whose filled values are all numbers is numeric, with bounds the file's own minimum and maximum rounded
    outwards (a statistic of these rows: replace them with public knowledge before the schema is shared);
    another column with at most :data:`MAX_PROPOSED_LEVELS` distinct values is categorical over them; any
    other is ignored. A column with empty values gets ``missing: impute``. ``target``: the column to predict
    (a DataError when absent)."""
    cols = [str(c) for c in df.columns]
    if target is not None and target not in cols:
        raise DataError(f"{source}: no column {target!r} to take as the target (columns: {', '.join(cols)})")
    probe = Schema.from_dict(
        {"target": {"name": "_", "levels": ["a", "b"]}, "features": {"_x": {"type": "numeric"}}}
    )
    features: dict[str, dict[str, Any]] = {}
    ignore: list[str] = []
    out: dict[str, Any] = {}
    for c in cols:
        na = probe._missing(df[c])
        values = [str(v).strip() for v in df[c].to_numpy(dtype=object)[~na]]
        numbers = _as_numbers(values)
        levels = sorted(set(values))
        if c == target:
            out["target"] = {"name": c, "levels": levels}
            continue
        if numbers is not None and len(numbers):
            lo, hi = math.floor(min(numbers)), math.ceil(max(numbers))
            features[c] = {"type": "numeric", "bounds": [lo, hi if hi > lo else lo + 1]}
        elif 0 < len(levels) <= MAX_PROPOSED_LEVELS:
            features[c] = {"type": "categorical", "levels": levels}
        else:
            ignore.append(c)
            continue
        if na.any():
            features[c]["missing"] = "impute"
    if not features:
        raise DataError(f"{source}: no column could be proposed as a feature")
    out["features"] = features
    if ignore:
        out["ignore"] = ignore
    out["scaling"] = "bounds"
    return out


def _as_numbers(values: list[str]) -> list[float] | None:
    """The values as finite numbers, or None when one is not."""
    out = []
    for v in values:
        try:
            x = float(v)
        except ValueError:
            return None
        if not math.isfinite(x):
            return None
        out.append(x)
    return out
