"""The data a run trains on: load the data set, fill the settings left to ``auto`` from its size,
partition it among the clients (or by site), and check the privacy settings against the clients' sizes."""

from __future__ import annotations

import numpy as np
import torch

from silofl.data import Dataset, SplitData, load_dataset, partition
from silofl.data.formats import site_split
from silofl.run.config import RunConfig, check_against_data


def prepare_data(cfg: RunConfig, device: torch.device, data: Dataset | None = None) -> tuple[RunConfig, SplitData]:
    """(the config with its data-dependent settings filled, the split). ``data``: the data set, if already
    loaded for this config."""
    if data is None:
        data = load_dataset(cfg.dataset, cfg.data_dir, image_size=cfg.image_size, max_bag_size=cfg.max_bag_size,
                            seed=cfg.seed)
    internal = sites = None
    test_set = "the data set's test split"
    if cfg.partition == "site":
        shards, internal_idx, external, sites = site_split(data, cfg.clients)
        cfg = cfg.with_data(len(data.y_train), smallest=min(len(s) for s in shards))
        internal = [(data.x_test[i].to(device), data.y_test[i].to(device)) for i in internal_idx]
        ext_sites = sorted(set(data.test_groups[external]) - set(sites))
        test_set = (f"external: held-out bags of sites {', '.join(ext_sites)} (no client trains on them)"
                    if ext_sites else "every held-out bag (no site is left out of training)")
        x_test, y_test = data.x_test[external], data.y_test[external]
        if cfg.test_limit is not None:
            x_test, y_test = x_test[: cfg.test_limit], y_test[: cfg.test_limit]
    else:
        cfg = cfg.with_data(len(data.y_train), cap=_p_major_cap(cfg, data.y_train.numpy()))
        rng = np.random.default_rng(cfg.seed)
        shards = partition(cfg.partition, data.y_train.numpy(), cfg.clients, cfg.samples_per_client, rng,
                           p=cfg.p_major, alpha=cfg.dirichlet_alpha)
        x_test, y_test = data.test_split(cfg.test_limit)
    check_against_data(cfg, [len(s) for s in shards])
    parts = [(data.x_train[s].to(device), data.y_train[s].to(device)) for s in shards]
    return cfg, SplitData(data, parts, (x_test.to(device), y_test.to(device)), internal, sites, test_set,
                          indices=[np.asarray(s) for s in shards])


def _p_major_cap(cfg: RunConfig, labels: np.ndarray) -> int | None:
    """About the most examples per client the ``p_major`` split can give every client: a fraction p of each comes
    from its major class (shared by several clients when there are more clients than classes), and the other
    clients' minority draws take their share of it too; 10% is left as a margin for the random draws."""
    if cfg.partition != "p_major":
        return None
    counts = np.bincount(labels)
    counts = counts[counts > 0]
    c, k, p = len(counts), cfg.clients, cfg.p_major
    per_example = p * -(-k // c) + k * (1 - p) / max(1, c - 1)  # of the smallest class, per example per client
    return max(1, int(0.9 * counts.min() / per_example))
