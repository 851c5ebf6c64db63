"""A registered method trained on in-memory per-site arrays, through the simulator engine.

Where a caller already holds each site's rows as arrays (PubSub-ML's federated baselines: every publisher's
table mapped to the union feature space), :func:`train_on_arrays` runs a registered method on them exactly
as ``silofl run`` runs it on a loaded data set — the config resolved and validated, a
:class:`~silofl.fl.plan.RunPlan` (batch size, σ calibrated from the budget, each party's q and steps), the
method's own sites and coordinator
(:func:`silofl.runner.loop.site_factory`), the in-process engine
(:class:`~silofl.comm.engine.InProcessEngine`,
real wire bytes, every message validated) — but without a data set to load, a test set to score every round
or a run folder: the caller evaluates the trained model itself. :func:`split_of_arrays` is the adapter: the
arrays as a :class:`~silofl.data.types.SplitData` with one client per site (partition ``site``).

A float target is a regression target (one model output, mean squared error in local training: the
client-level methods' :func:`silofl.training.local_sgd.local_updates`); an integer one has ``num_classes``
classes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from silofl.comm.engine import InProcessEngine
from silofl.core.errors import ConfigError
from silofl.data.types import Dataset, SplitData
from silofl.fl.coordinator import Coordinator
from silofl.fl.plan import RunPlan
from silofl.runner.config import RunConfig, check_against_data
from silofl.runner.loop import site_factory
from silofl.runner.plan import auto_sizes, plan, sizes_of_sites

TASKS = ("classification", "regression")


def split_of_arrays(
    sites: Sequence[tuple[np.ndarray, np.ndarray]],
    task: str = "classification",
    num_classes: int | None = None,
    names: Sequence[str] | None = None,
    device: torch.device | None = None,
) -> SplitData:
    """Each site's (x, y) rows as a split with one client per site, in order: x as float32 rows, y as class
    indices (``classification``, ``num_classes`` classes: default the largest label + 1) or float targets
    (``regression``: one model output). There is no shared test set (the split's ``test`` is empty)."""
    if task not in TASKS:
        raise ConfigError(f"unknown task {task!r}; choose one of: {', '.join(TASKS)}")
    if not sites:
        raise ConfigError("no site holds any rows")
    dev = device or torch.device("cpu")
    parts = []
    for k, (x, y) in enumerate(sites):
        xt = torch.as_tensor(np.asarray(x), dtype=torch.float32, device=dev)
        yt = torch.as_tensor(np.asarray(y), dtype=torch.long if task == "classification" else torch.float32)
        if xt.dim() < 2 or len(xt) != len(yt) or len(yt) == 0:
            raise ConfigError(f"site {k}: x must hold one row per target and at least one row")
        parts.append((xt, yt.to(dev)))
    shapes = {tuple(x.shape[1:]) for x, _ in parts}
    if len(shapes) != 1:
        raise ConfigError(f"the sites' rows differ in shape: {sorted(shapes)}")
    if task == "regression":
        classes = 1
    else:
        classes = num_classes if num_classes is not None else int(max(int(y.max()) for _, y in parts)) + 1
        if any(int(y.min()) < 0 or int(y.max()) >= classes for _, y in parts):
            raise ConfigError(f"class labels must lie in [0, {classes})")
    names = list(names) if names is not None else [f"site{k}" for k in range(len(parts))]
    sizes = [len(y) for _, y in parts]
    x_all = torch.cat([x for x, _ in parts])
    y_all = torch.cat([y for _, y in parts])
    data = Dataset(
        name="arrays",
        x_train=x_all,
        y_train=y_all,
        x_test=x_all[:0],
        y_test=y_all[:0],
        num_classes=classes,
        source="in-memory arrays",
        groups=np.concatenate([[n] * s for n, s in zip(names, sizes, strict=True)]),
    )
    ends = np.cumsum(sizes)
    return SplitData(
        data,
        parts,
        (x_all[:0], y_all[:0]),
        sites=names,
        test_set="none (the caller evaluates)",
        indices=[np.arange(e - s, e) for s, e in zip(sizes, ends, strict=True)],
    )


@dataclass
class ArraysRun:
    """A trained run on arrays: its plan, its coordinator (and the server role's accountants, if any), the
    engine holding its sites, the rounds that ran."""

    plan: RunPlan
    coordinator: Coordinator
    engine: InProcessEngine
    rounds: int

    def global_model(self) -> nn.Module:
        """The model the run released last: the server role's (a server method), else site 0's shared one."""
        server = getattr(self.coordinator, "server", None)
        model = getattr(server, "model", None)
        if isinstance(model, nn.Module):
            return model
        models = self.engine.sites[0].final_models()
        name = "global" if "global" in models else next(iter(models))
        return models[name][0]

    def privacy(self) -> dict[str, Any]:
        """The run's accountant report (the server's, for a client-level method: its inputs σ, q, steps and
        the ε it reached at the config's δ); empty without DP."""
        if not self.plan.config.is_private:
            return {}
        accounts = getattr(self.coordinator, "accounts", None)
        if accounts is not None:
            return dict(accounts.report())
        return dict(self.engine.sites[0].privacy_report().get("privacy", {}))


def train_on_arrays(
    cfg: RunConfig,
    sites: Sequence[tuple[np.ndarray, np.ndarray]],
    task: str = "classification",
    num_classes: int | None = None,
    device: torch.device | None = None,
) -> ArraysRun:
    """Run ``cfg``'s registered method (``clients``: one per site, set here) on the sites' arrays through the
    simulator engine (see the module doc). Raises ConfigError for bad input before any round."""
    dev = device or torch.device("cpu")
    split = split_of_arrays(sites, task, num_classes, device=dev)
    cfg = dataclasses.replace(cfg, clients=len(split.parts), partition="site").resolve()
    sizes = sizes_of_sites(cfg, split.parts)
    spc, batch = auto_sizes(cfg, sum(sizes), smallest=min(sizes))
    check_against_data(dataclasses.replace(cfg, batch_size=batch), sizes)
    the_plan = plan(cfg, split, None, spc, batch, sizes)
    method = cfg.info.cls(the_plan)
    make, n_sites = site_factory(method, split, None, release_nonprivate=True)
    engine = InProcessEngine({k: make(k) for k in range(n_sites)})
    coordinator = method.make_coordinator(n_sites, split, dev)
    coordinator.connect(engine)
    coordinator.start()
    ran = 0
    for rnd in range(1, cfg.rounds + 1):
        coordinator.run_round(rnd)
        ran = rnd
        if not coordinator.active:
            break
    coordinator.flush()
    return ArraysRun(the_plan, coordinator, engine, ran)
