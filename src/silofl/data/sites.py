"""Per-site sources: each site brings its own file (a table) or folder (images); nothing is pooled.

``--site-data a.csv,b.parquet,…`` (``dataset: table`` with ``--schema``) or ``--site-data dirA,dirB,…``
(``dataset: folder``): site k is client k, named after its file or folder. Each site

* is checked on its own (tables: against the collaboration's schema, :mod:`silofl.data.schema`);
* holds out a seeded ``test_fraction`` of its own rows as its **internal** test set (an image folder with
  ``train/`` and ``test/`` keeps that split);
* fits its preprocessing on its own training rows only, or takes it from the schema's public declarations
  (:mod:`silofl.data.preprocessing`) — no statistic is computed across sites;
* sees the shared **external** test set (``--test-data FILE|DIR``) through its own preprocessing.

Without ``--test-data`` the external figure is computed on the union of the sites' held-out rows. That is
a simulation convenience (in a deployment each site scores only its own rows): ``test_set`` says so, and
no site ever trains on another's rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from silofl.core.errors import DataError
from silofl.data.preprocessing import ImagePreprocessing, TablePreprocessing
from silofl.data.schema import Schema, is_table, read_table


@dataclass
class SiteSources:
    """Every site's data, ready for a run (tensors on the CPU)."""

    names: list[str]
    parts: list[tuple[torch.Tensor, torch.Tensor]]
    internal: list[tuple[torch.Tensor, torch.Tensor]]
    external: list[tuple[torch.Tensor, torch.Tensor]]
    preprocessing: list[TablePreprocessing | ImagePreprocessing]
    classes: list[str]
    input_shape: tuple[int, ...]
    test_set: str
    sources: list[str]
    dropped: list[int]
    # --id-column (person-level DP, silofl.privacy.person): each site's training rows' person, 0 … P−1
    persons: list[np.ndarray] | None = None
    # without --id-column: a column that looks like a person id and repeats (UnitWarning.to_dict), or None
    unit_warning: dict | None = None
    # what the targets are (silofl.training.tasks) and, where it is not the number of classes, the number of
    # model outputs (a survival target: 1 + its time bins, silofl.training.survival.encode_target)
    task: str = "classification"
    outputs: int | None = None
    # --id-column: each site's internal (held-out) rows' person, 0 … Q−1 (whole persons are held out)
    internal_persons: list[np.ndarray] | None = None


def site_names(paths: list[str]) -> list[str]:
    """A name per site: its file or folder name without the suffix (made unique with its position)."""
    stems: list[str] = []
    for p in paths:
        name = Path(p.rstrip("/")).name
        for suffix in (".gz", ".csv", ".tsv", ".txt", ".parquet", ".pq"):
            name = name.removesuffix(suffix)
        stems.append(name or f"site{len(stems)}")
    return [s if stems.count(s) == 1 else f"{s}#{i}" for i, s in enumerate(stems)]


def holdout(
    n: int,
    fraction: float,
    seed: int,
    site: int,
    source: str,
    salt: int | None = None,
    cap: int | None = None,
    what: str = "internal test set",
) -> tuple[np.ndarray, np.ndarray]:
    """(training rows, internal test rows) of a site with ``n`` rows: a seeded random ``fraction`` held out,
    drawn from the site's own stream (seed, site index), so it does not depend on the other sites. ``salt``:
    another stream of the same seed and site (the validation rows, :data:`VALIDATION_SALT`); ``cap``: hold out
    at most that many; ``what``: the held-out rows' name in the refusal."""
    n_test = int(round(n * fraction))
    if cap is not None:
        n_test = min(n_test, cap)
    if n_test < 1 or n - n_test < 1:
        raise DataError(
            f"{source}: {n} rows are too few to hold out {fraction:g} of them as the site's {what} "
            "and train on the rest"
        )
    perm = np.random.default_rng([seed, site] if salt is None else [seed, site, salt]).permutation(n)
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def holdout_groups(
    persons: np.ndarray,
    fraction: float,
    seed: int,
    site: int,
    source: str,
    salt: int | None = None,
    cap: int | None = None,
    what: str = "internal test set",
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`holdout` by person (``persons``: each row's person 0 … P−1): a seeded ``fraction`` of the
    persons is held out with all of their rows, so no person has rows on both sides."""
    P = int(persons.max()) + 1 if len(persons) else 0
    n_test = int(round(P * fraction))
    if cap is not None:
        n_test = min(n_test, cap)
    if n_test < 1 or P - n_test < 1:
        raise DataError(
            f"{source}: {P} persons are too few to hold out {fraction:g} of them as the site's {what} "
            "and train on the rest"
        )
    test_persons = np.zeros(P, dtype=bool)
    rng = np.random.default_rng([seed, site] if salt is None else [seed, site, salt])
    test_persons[rng.permutation(P)[:n_test]] = True
    is_test = test_persons[persons]
    return np.flatnonzero(~is_test), np.flatnonzero(is_test)


def person_ids(df, schema: Schema, id_column: str, source: str) -> np.ndarray:
    """The ``id_column`` of a site's table as strings, one per row; a DataError when the column is absent,
    is a feature or the target, or has a missing value."""
    if id_column not in df.columns:
        raise DataError(
            f"{source}: no id column {id_column!r} (--id-column names a column of every site's file)"
        )
    if id_column in schema.names or id_column == schema.target:
        raise DataError(
            f"{source}: the id column {id_column!r} is a feature or the target of the schema; list it under "
            "'ignore' instead"
        )
    na = schema._missing(df[id_column])
    if na.any():
        i = int(np.flatnonzero(na)[0])
        raise DataError(
            f"{source}: the id column {id_column!r} is empty in row {i + 1} ({int(na.sum())} rows); every "
            "row needs its person"
        )
    return np.asarray([str(v).strip() for v in df[id_column].to_numpy(dtype=object)])


def shared_person(site_ids: list[np.ndarray], test_ids: np.ndarray, paths: list[str], test_path: str) -> None:
    """A DataError when a person of the test file also has rows in a site's file: the test would score the
    model on a person it trained on (``--id-column`` makes persons the unit of every split)."""
    for ids, path in zip(site_ids, paths, strict=True):
        both = sorted(set(ids.tolist()) & set(test_ids.tolist()))
        if both:
            more = f" (and {len(both) - 1} more)" if len(both) > 1 else ""
            raise DataError(
                f"{test_path}: person {both[0]!r}{more} of the id column also has rows in {path}; a person's "
                "rows belong to one split (remove them from the test file)"
            )


def repeated_id_warning(schema: Schema, tables: list, names: list[str]):
    """Without ``--id-column``: the column of the sites' tables that looks like a person id and repeats the
    most (:func:`silofl.privacy.person.id_like`: any non-feature column by its name or its cardinality, a
    feature by its name), as a :class:`~silofl.privacy.person.UnitWarning`; None when there is none."""
    from silofl.privacy.person import UnitWarning, id_like

    found: dict[str, tuple[int, list[str]]] = {}
    for df, name in zip(tables, names, strict=True):
        for col in df.columns:
            if col == schema.target:
                continue
            k = id_like(col, df[col].to_numpy(dtype=object), by_name_only=col in schema.names)
            if k:
                best, sites = found.get(col, (0, []))
                found[col] = (max(best, k), [*sites, name])
    if not found:
        return None
    col = max(found, key=lambda c: (found[c][0], c))
    return UnitWarning(col, found[col][0], found[col][1])


def load_site_tables(
    schema_path: str,
    paths: list[str],
    test_path: str | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
    id_column: str | None = None,
    time_bins: list[float] | None = None,
    validation: int | None = None,
) -> SiteSources:
    """Every site's table, checked against the schema at ``schema_path`` (see the module doc). ``validation``
    (``--eval-split validation``, what ``silofl tune`` selects on): at most that many of each site's training
    rows (a seeded ``test_fraction`` of them, :func:`validation_rows`) take the place of its test rows — the
    site trains on the rest, its internal figure and the union's are on them — and no test row nor
    ``test_path`` is read. ``id_column``
    (person-level DP): each row's person; the internal test set then holds out whole persons and each site's
    training rows come with their persons. Without it, a column that looks like a repeated person id is
    flagged (``unit_warning``). A survival target (``{type: survival, time, event}``) is encoded on its public
    time bins — ``time_bins`` (``--time-bins``), else the schema's ``bins`` — for the piecewise-exponential
    model (:func:`silofl.training.survival.encode_target`); never bins computed from a site's times."""
    schema = Schema.load(schema_path)
    edges: tuple[float, ...] = ()
    if schema.task == "survival":
        edges = survival_edges(schema, schema_path, time_bins)
    elif schema.task != "classification":
        raise DataError(
            f"schema {schema_path}: the federated methods train classifiers; a regression target is for "
            "PubSub-ML (silofl pubsub publish --schema)"
        )
    names = site_names(paths)
    raws, ys, dropped, splits, tables, persons = [], [], [], [], [], []
    site_ids: list[np.ndarray] = []
    for k, p in enumerate(paths):
        if not is_table(p):
            raise DataError(f"{p}: dataset 'table' reads .csv, .tsv or .parquet files, one per site")
        df = read_table(p)
        if id_column is None:
            raw, y, n_drop = schema.check(df, p)
            tables.append(df)
        else:
            ids = person_ids(df, schema, id_column, p)
            site_ids.append(ids)
            kept: list[int] = []
            raw, y, n_drop = schema.check(df, p, extra=(id_column,), kept=kept)
            _, index = np.unique(ids[kept], return_inverse=True)
            persons.append(index.reshape(-1))
        assert y is not None
        raws.append(raw)
        ys.append(y)
        dropped.append(n_drop)
        if id_column is None:
            splits.append(holdout(len(y), test_fraction, seed, k, p))
        else:
            splits.append(holdout_groups(persons[-1], test_fraction, seed, k, p))
    if validation is not None:  # the validation rows stand in for the test rows, which are never used
        splits = [
            validation_rows(tr, test_fraction, seed, k, paths[k], validation, persons[k] if persons else None)
            for k, (tr, _) in enumerate(splits)
        ]
        test_path = None
    warning = repeated_id_warning(schema, tables, names) if id_column is None else None
    train_persons = None
    if id_column is not None:  # each site's training rows' persons, renumbered 0 … P−1
        train_persons = [
            np.unique(idx[tr], return_inverse=True)[1].reshape(-1)
            for idx, (tr, _) in zip(persons, splits, strict=True)
        ]
    if edges:
        from silofl.training.survival import encode_target

        ys = [encode_target(y, edges) for y in ys]
    preps = [
        TablePreprocessing.fit(schema, raw[tr], site=names[k])
        for k, (raw, (tr, _)) in enumerate(zip(raws, splits, strict=True))
    ]
    if test_path:  # (None with validation rows)
        test_df = read_table(test_path)
        if id_column is not None and id_column in test_df.columns:
            shared_person(site_ids, person_ids(test_df, schema, id_column, test_path), paths, test_path)
        ext_raw, ext_y, _ = schema.check(test_df, test_path, extra=(id_column,) if id_column else ())
        assert ext_y is not None
        if edges:
            ext_y = encode_target(ext_y, edges)
        test_set = f"external: {test_path} (no site trains on it)"
    elif validation is not None:
        ext_raw = np.concatenate([raw[va] for raw, (_, va) in zip(raws, splits, strict=True)])
        ext_y = np.concatenate([y[va] for y, (_, va) in zip(ys, splits, strict=True)])
        test_set = (
            f"validation: {', '.join(str(len(va)) for _, va in splits)} rows carved from the sites' own "
            "training rows (seeded; no site trains on them; each site's own are its internal set, their "
            "union the headline's; the test rows are not read)"
        )
    else:
        ext_raw = np.concatenate([raw[te] for raw, (_, te) in zip(raws, splits, strict=True)])
        ext_y = np.concatenate([y[te] for y, (_, te) in zip(ys, splits, strict=True)])
        test_set = (
            "the union of the sites' held-out rows (a simulation figure: each site's own held-out rows are "
            "its "
            "internal test set; no site trains on another's rows)"
        )
    parts, internal, external = [], [], []
    for k, prep in enumerate(preps):
        tr, te = splits[k]
        parts.append((prep.transform(raws[k][tr]), torch.from_numpy(ys[k][tr])))
        internal.append((prep.transform(raws[k][te]), torch.from_numpy(ys[k][te])))
        external.append((prep.transform(ext_raw), torch.from_numpy(ext_y)))
    return SiteSources(
        names,
        parts,
        internal,
        external,
        list(preps),
        list(schema.classes),
        preps[0].input_shape,
        test_set,
        list(paths),
        dropped,
        train_persons,
        warning.to_dict() if warning is not None else None,
        schema.task,
        len(edges) + 2 if edges else None,
        [
            np.unique(idx[te], return_inverse=True)[1].reshape(-1)
            for idx, (_, te) in zip(persons, splits, strict=True)
        ]
        if id_column is not None
        else None,
    )


VALIDATION_SALT = 7919  # the validation rows' stream of a site's seed (silofl.runner.data.validation_split's)


def validation_rows(
    train: np.ndarray,
    fraction: float,
    seed: int,
    site: int,
    source: str,
    cap: int | None = None,
    persons: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(training rows, validation rows) carved from a site's training rows ``train`` (indices into its table):
    a seeded ``fraction`` of them, at most ``cap``, drawn from the site's own validation stream (seed, site,
    :data:`VALIDATION_SALT`), so it depends neither on the other sites nor on the test rows; with ``persons``
    (each table row's person) whole persons. A site with too few rows: a one-line DataError."""
    what = "validation split (carved from its training rows)"
    if persons is None:
        keep, val = holdout(len(train), fraction, seed, site, source, VALIDATION_SALT, cap, what)
    else:
        own = np.unique(persons[train], return_inverse=True)[1].reshape(-1)
        keep, val = holdout_groups(own, fraction, seed, site, source, VALIDATION_SALT, cap, what)
    return train[keep], train[val]


def survival_edges(schema: Schema, schema_path: str, time_bins: list[float] | None) -> tuple[float, ...]:
    """The public inner time-bin edges of a survival run: ``--time-bins``, else the schema's ``bins``; a
    one-line DataError when neither gives any (they are never computed from a site's times)."""
    from silofl.training.survival import check_edges

    given = time_bins if time_bins else schema.survival_bins
    if not given:
        raise DataError(
            f"schema {schema_path}: a survival target trains a piecewise-exponential model on public time "
            "bins; declare them in the target (bins: [EDGE, ...]) or pass --time-bins A,B,... (never "
            "quantiles of a site's times)"
        )
    try:
        return check_edges(given)
    except ValueError as e:
        raise DataError(f"--time-bins: {e}" if time_bins else f"schema {schema_path}: {e}") from None


def load_site_images(
    paths: list[str],
    image_size: int = 32,
    test_path: str | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> SiteSources:
    """Every site's image folder (``<class>/…`` or ``train/`` + ``test/``). The classes are the union of the
    sites' class folder names (the label set the collaboration agrees on); images are RGB if any site's are
    colour, else grey; each site standardises with its own training images' statistics."""
    from silofl.data.formats import _class_dirs, image_mode, image_tree, read_images

    for p in paths:
        if not Path(p).is_dir():
            raise DataError(
                f"site folder {p!r} not found; --site-data takes one image folder per site "
                "(ROOT/<class>/ images, or ROOT/train/<class>/ and ROOT/test/<class>/)"
            )
    names = site_names(paths)
    roots = [
        Path(p) / "train" if (Path(p) / "train").is_dir() and (Path(p) / "test").is_dir() else Path(p)
        for p in paths
    ]
    classes = sorted({d.name for r in roots for d in _class_dirs(r)})
    if len(classes) < 2:
        raise DataError(f"the site folders name fewer than two classes ({', '.join(classes) or 'none'})")
    trees = []
    for k, p in enumerate(paths):
        _, tr, te = image_tree(
            p, classes=classes, seed=seed * 1000 + k, test_fraction=test_fraction, what="site folder"
        )
        trees.append((tr, te))
    ext_items = None
    if test_path:
        if not Path(test_path).is_dir():
            raise DataError(f"test folder {test_path!r} not found (ROOT/<class>/ images)")
        _, a, b = image_tree(test_path, classes=classes, test_fraction=0.5, what="test folder")
        ext_items = sorted(a + b)
    all_files = [f for tr, te in trees for f, _ in tr + te] + [f for f, _ in ext_items or []]
    mode = image_mode(all_files)
    preps, parts, internal, tests = [], [], [], []
    for k, (tr, te) in enumerate(trees):
        x_tr = torch.from_numpy(read_images([f for f, _ in tr], image_size, mode))
        x_te = torch.from_numpy(read_images([f for f, _ in te], image_size, mode))
        prep = ImagePreprocessing.fit(x_tr, image_size, mode, classes, site=names[k])
        preps.append(prep)
        parts.append((prep.transform(x_tr), torch.tensor([c for _, c in tr])))
        internal.append((prep.transform(x_te), torch.tensor([c for _, c in te])))
        tests.append((x_te, torch.tensor([c for _, c in te])))
    if ext_items is not None:
        ext = (
            torch.from_numpy(read_images([f for f, _ in ext_items], image_size, mode)),
            torch.tensor([c for _, c in ext_items]),
        )
        test_set = f"external: {test_path} (no site trains on it)"
    else:
        ext = (torch.cat([t[0] for t in tests]), torch.cat([t[1] for t in tests]))
        test_set = (
            "the union of the sites' held-out images (a simulation figure: each site's own held-out images "
            "are "
            "its internal test set; no site trains on another's images)"
        )
    external = [(prep.transform(ext[0]), ext[1]) for prep in preps]
    return SiteSources(
        names,
        parts,
        internal,
        external,
        list(preps),
        classes,
        preps[0].input_shape,
        test_set,
        list(paths),
        [0] * len(paths),
    )
