"""The data a run trains on: load the data set, choose the settings left to ``auto`` from its size, partition
it among the clients (or by site), check the privacy settings against the clients' sizes, and plan the run
(:mod:`silofl.runner.plan`: σ, each site's q and steps) — :func:`prepare_run`."""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time

import numpy as np
import torch

from silofl.data import Dataset, SplitData, load_dataset, partition
from silofl.data.formats import site_split
from silofl.data.sites import VALIDATION_SALT
from silofl.runner.config import RunConfig, check_against_data
from silofl.runner.plan import RunPlan, auto_sizes, config_with_plan, plan, sizes_of_sites


def prepare_run(
    cfg: RunConfig, device: torch.device, data: Dataset | None = None, features: bool = True
) -> tuple[RunPlan, SplitData]:
    """(the run's plan — what was derived from ``cfg``, resolved, and the data —, the split after the config's
    feature stage: every site's training data and test sets as features — unless ``features`` is False: the
    raw inputs, for sites that compute their own). ``data``: the data set, if already loaded for this
    config."""
    if cfg.data_at_sites:
        from silofl.core.errors import ConfigError

        raise ConfigError(
            "data_at_sites: the sites hold this run's data (`silofl deploy start`); a run that reads its "
            "data here takes a data set or --site-data"
        )
    chosen, split = _prepare_inputs(cfg, device, data)
    if features:
        split = with_features(chosen, split)
        check_heads(chosen, split)
    return plan(
        cfg,
        split,
        chosen.split_seed,
        chosen.samples_per_client,
        chosen.batch_size,
        unit_sizes(chosen, split),
    ), split


def check_heads(cfg: RunConfig, split: SplitData) -> None:
    """A ConfigError when a model of the run does not answer the data's targets: a segmentation data set
    (masks, one class per pixel) needs per-pixel outputs, a classifier's data one score vector per example.
    Each architecture is built once for the inputs and run on one zero example (it used to fail in the first
    round with a RuntimeError from the loss)."""
    from silofl.core.errors import ConfigError
    from silofl.models import build_model

    y = split.parts[0][1]
    masks = y.dim() == 3
    for role in ("proxy_model", "private_model"):
        name = getattr(cfg.options, role, None)
        if not name:
            continue
        net = build_model(name, tuple(split.input_shape), int(split.dataset.num_classes)).eval()
        with torch.no_grad():
            out = net(torch.zeros((1, *split.input_shape), dtype=split.parts[0][0].dtype))
        if masks and out.dim() != 4:
            raise ConfigError(
                f"--{role.replace('_', '-')} {name}: dataset {cfg.dataset} has masks (one class per pixel); "
                f"{name} gives one score per image: use a segmentation model (unet)"
            )
        if not masks and out.dim() != 2:
            raise ConfigError(
                f"--{role.replace('_', '-')} {name}: gives {out.dim() - 2}-D outputs per example, but "
                f"dataset {cfg.dataset} has one target per example: use a classifier"
            )


def prepare_split(cfg: RunConfig, device: torch.device, features: bool = True) -> SplitData:
    """The split of ``cfg`` (its seed given: the rows a run drew), after its feature stage, without planning
    the run (no σ calibration): what an evaluation after the run scores on."""
    chosen, split = _prepare_inputs(cfg, device)
    return with_features(chosen, split) if features else split


def unit_sizes(cfg: RunConfig, split: SplitData) -> list[int]:
    """Each site's count of privacy units, as its sampling rate and steps are planned from: training examples
    (:func:`silofl.runner.plan.sizes_of_sites`), or with ``--id-column`` persons (a site pooling several
    clients' rows counts each client's persons apart: a person is a unit of one site's table)."""
    if split.persons is None:
        return sizes_of_sites(cfg, split.parts)
    counts = [int(p.max()) + 1 if len(p) else 0 for p in split.persons]
    rows = sizes_of_sites(cfg, split.parts)
    if len(rows) == len(counts):
        return counts
    if len(rows) == 1:  # one site pooling every client's rows (Joint)
        return [sum(counts)]
    from silofl.core.errors import ConfigError

    raise ConfigError(f"--id-column: {cfg.method} builds {len(rows)} sites from {len(counts)} tables")


def prepare_data(
    cfg: RunConfig, device: torch.device, data: Dataset | None = None, features: bool = True
) -> tuple[RunConfig, SplitData]:
    """:func:`prepare_run` with the plan's values written into a flat config (:func:`config_with_plan`, for a
    consumer outside the methods that reads one config): (the
    config
    as it runs, the split)."""
    p, split = prepare_run(cfg, device, data, features)
    return config_with_plan(p), split


def with_features(cfg: RunConfig, split: SplitData) -> SplitData:
    """The split with the config's feature stage (:mod:`silofl.features`) applied to each site's training data
    and to every test set a site scores (external, internal, validation); unchanged with ``features: none``.
    Features are a fixed function of each example (no budget), computed once per tensor and kept on disk by
    content."""
    from silofl.features import apply, cache_root, record, stage_from_config

    stage = stage_from_config(cfg)
    if stage.identity:
        return split
    stage.check_run(cfg)
    raw = split.dataset.input_shape
    rec = record(stage, raw, cfg)  # checks the stage fits the inputs (ConfigError) before any work
    root = cache_root(cfg.features_cache)
    done: dict[int, torch.Tensor] = {}
    t0 = time.perf_counter()

    def f(pair, label):
        if pair is None:
            return None
        x, y = pair
        if id(x) not in done:
            done[id(x)] = apply(stage, x, root, label)
        return done[id(x)], y

    parts = [f(p, f"client {k}") for k, p in enumerate(split.parts)]
    test = f(split.test, "test set")
    internal = (
        [f(p, f"client {k} held-out") for k, p in enumerate(split.internal)]
        if split.internal
        else split.internal
    )
    external = (
        [f(p, f"client {k} test set") for k, p in enumerate(split.external)]
        if split.external
        else split.external
    )
    rec["seconds"] = round(time.perf_counter() - t0, 3)  # computing or reading back every site's features
    return dataclasses.replace(
        split,
        parts=parts,
        test=test,
        internal=internal,
        external=external,
        feature_shape=tuple(rec["feature_shape"]),
        features=rec,
    )


def _prepare_inputs(
    cfg: RunConfig, device: torch.device, data: Dataset | None = None
) -> tuple[RunConfig, SplitData]:
    """(a working copy of ``cfg`` with the split seed, examples per client and batch size it was drawn with,
    the split)."""
    if cfg.data_seed is None:  # a fresh split (not a secret: recorded so the run can be repeated on it)
        cfg = dataclasses.replace(cfg, split_seed=secrets.randbits(32))
    if cfg.site_data:
        return _site_sources(cfg, device)
    if data is None:
        data = load_dataset(
            cfg.dataset,
            cfg.data_dir,
            image_size=cfg.image_size,
            max_bag_size=cfg.max_bag_size,
            seed=cfg.data_seed,
        )
    internal = sites = None
    test_set = "the data set's test split"
    if cfg.partition == "site":
        shards, internal_idx, external, sites = site_split(data, cfg.clients)
        cfg = _with_sizes(cfg, len(data.y_train), smallest=min(len(s) for s in shards))
        internal = [(data.x_test[i].to(device), data.y_test[i].to(device)) for i in internal_idx]
        ext_sites = sorted(set(data.test_groups[external]) - set(sites))
        test_set = (
            f"external: held-out bags of sites {', '.join(ext_sites)} (no client trains on them)"
            if ext_sites
            else "every held-out bag (no site is left out of training)"
        )
        x_test, y_test = data.x_test[external], data.y_test[external]
        if cfg.test_limit is not None:
            x_test, y_test = x_test[: cfg.test_limit], y_test[: cfg.test_limit]
    else:
        cfg = _with_sizes(cfg, len(data.y_train), cap=_p_major_cap(cfg, data.y_train.numpy()))
        rng = np.random.default_rng(cfg.data_seed)
        shards = partition(
            cfg.partition,
            data.y_train.numpy(),
            cfg.clients,
            cfg.samples_per_client,
            rng,
            p=cfg.p_major,
            alpha=cfg.dirichlet_alpha,
        )
        if cfg.eval_split == "validation":
            x_test, y_test, test_set = validation_split(cfg, data, shards)
        else:
            x_test, y_test = data.test_split(cfg.test_limit)
    check_against_data(cfg, [len(s) for s in shards])
    parts = [(data.x_train[s].to(device), data.y_train[s].to(device)) for s in shards]
    prep = [data.preprocessing] * len(parts) if data.preprocessing else None
    return cfg, SplitData(
        data,
        parts,
        (x_test.to(device), y_test.to(device)),
        internal,
        sites,
        test_set,
        preprocessing=prep,
        indices=[np.asarray(s) for s in shards],
    )


def unheld_rows(n: int, held: list) -> np.ndarray:
    """The indices among ``n`` training rows that none of ``held`` (index arrays: the clients' shards, a
    publisher's rows) contains, ascending: the rows that stand for public data of the same kind."""
    used = np.zeros(n, dtype=bool)
    for idx in held:
        used[np.asarray(idx, dtype=np.int64)] = True
    return np.flatnonzero(~used)


def validation_split(cfg: RunConfig, data: Dataset, shards: list) -> tuple[torch.Tensor, torch.Tensor, str]:
    """``validation_size`` training examples that no client holds (drawn with the split seed), limited by
    ``test_limit``: the data tuning selects on. They stand for public data of the same kind; the test split is
    not read."""
    free = unheld_rows(len(data.y_train), shards)
    if len(free) == 0:
        from silofl.core.errors import ConfigError

        raise ConfigError(
            "eval_split 'validation' needs training examples that no client holds; there are none"
        )
    rng = np.random.default_rng([int(cfg.data_seed or 0), VALIDATION_SALT])
    n = min(cfg.validation_size, len(free), cfg.test_limit or len(free))
    idx = torch.as_tensor(np.sort(rng.choice(free, size=n, replace=False)))
    return (
        data.x_train[idx],
        data.y_train[idx],
        f"validation: {n} {cfg.dataset} training examples held by no client, treated as public data "
        "(the test split is not used)",
    )


def site_sizes(cfg: RunConfig, parts: list[tuple[torch.Tensor, torch.Tensor]]) -> list[int]:
    """The number of training examples of each site the method builds from the clients' partitions
    (:func:`silofl.runner.plan.sizes_of_sites`)."""
    return sizes_of_sites(cfg, parts)


def _with_sizes(
    cfg: RunConfig, n_train: int, smallest: int | None = None, cap: int | None = None
) -> RunConfig:
    """The working copy of ``cfg`` with the examples per client and batch size the split is drawn with
    (:func:`silofl.runner.plan.auto_sizes`)."""
    spc, batch = auto_sizes(cfg, n_train, smallest, cap)
    if (spc, batch) == (cfg.samples_per_client, cfg.batch_size):
        return cfg
    return dataclasses.replace(cfg, samples_per_client=spc, batch_size=batch)


def _site_sources(cfg: RunConfig, device: torch.device) -> tuple[RunConfig, SplitData]:
    """Per-site files or folders (:mod:`silofl.data.sites`): one client per site, nothing pooled."""
    from silofl.data.sites import load_site_images, load_site_tables

    assert cfg.site_data is not None
    if cfg.dataset == "table":
        assert cfg.schema is not None
        src = load_site_tables(
            cfg.schema,
            cfg.site_data,
            cfg.test_data,
            cfg.test_fraction,
            cfg.data_seed,
            cfg.id_column,
            getattr(cfg, "time_bins", None),
            cfg.validation_size if cfg.eval_split == "validation" else None,  # carved from training rows
        )
    elif cfg.dataset == "folder":
        src = load_site_images(cfg.site_data, cfg.image_size, cfg.test_data, cfg.test_fraction, cfg.data_seed)
    else:  # another registered per-site loader (segmentation, a plug-in's)
        from silofl.data.datasets import load_sites

        src = load_sites(
            cfg.dataset,
            cfg.site_data,
            schema=cfg.schema,
            image_size=cfg.image_size,
            test_data=cfg.test_data,
            test_fraction=cfg.test_fraction,
            seed=cfg.data_seed,
        )
    sizes = [len(y) for _, y in src.parts]
    # the privacy unit's count per site: persons with --id-column (the batch size counts persons), else rows
    units = [int(p.max()) + 1 for p in src.persons] if src.persons is not None else sizes
    cfg = _with_sizes(cfg, sum(units), smallest=min(units))
    check_against_data(cfg, units)
    if src.unit_warning is not None:
        logging.getLogger("silofl").warning("privacy unit: %s", src.unit_warning["message"])

    def dev(pair, limit=None):
        x, y = pair
        return x[:limit].to(device), y[:limit].to(device)

    external = [dev(e, cfg.test_limit) for e in src.external]
    x_all = torch.cat([x for x, _ in src.parts])
    y_all = torch.cat([y for _, y in src.parts])
    groups = np.concatenate([[name] * n for name, n in zip(src.names, sizes, strict=True)])
    data = Dataset(
        name=cfg.dataset,
        x_train=x_all,
        y_train=y_all,
        x_test=src.external[0][0],
        y_test=src.external[0][1],
        num_classes=src.outputs or len(src.classes),
        source=", ".join(src.sources),
        class_names=src.classes,
        groups=groups,
    )
    return cfg, SplitData(
        data,
        [dev(p) for p in src.parts],
        external[0],
        [dev(t) for t in src.internal],
        src.names,
        src.test_set,
        external=external,
        preprocessing=[p.to_dict() for p in src.preprocessing],
        indices=_site_rows(sizes),
        persons=[torch.from_numpy(p) for p in src.persons] if src.persons is not None else None,
        id_column=cfg.id_column,
        privacy_unit_warning=src.unit_warning,
        internal_persons=getattr(src, "internal_persons", None),
    )


def _p_major_cap(cfg: RunConfig, labels: np.ndarray) -> int | None:
    """About the most examples per client the ``p_major`` split can give every client: a fraction p of each
    comes from its major class (shared by several clients when there are more clients than classes), and the
    other clients' minority draws take their share of it too; 10% is left as a margin for the random draws."""
    if cfg.partition != "p_major":
        return None
    counts = np.bincount(labels)
    counts = counts[counts > 0]
    c, k, p = len(counts), cfg.clients, cfg.p_major
    per_example = p * -(-k // c) + k * (1 - p) / max(
        1, c - 1
    )  # of the smallest class, per example per client
    return max(1, int(0.9 * counts.min() / per_example))


def _site_rows(sizes: list[int]) -> list[np.ndarray]:
    """Each site's rows of the pooled ``x_train`` (the sites' parts concatenated in order)."""
    ends = np.cumsum(sizes)
    return [np.arange(end - n, end) for n, end in zip(sizes, ends, strict=True)]
