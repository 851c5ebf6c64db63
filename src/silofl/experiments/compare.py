"""``silofl compare``: methods × variants × seeds, one run folder each, then one report.

A :class:`CompareConfig` names the methods (``regular:nodp`` = that method with privacy off), the
seeds, a base :class:`~silofl.config.RunConfig` and either a named ablation *preset* or explicit
variants (a label and the options it changes). Runs go to ``OUT/runs/<variant>/<method>/seed<s>``.
A run that raises is recorded as failed and the others still run; with ``resume`` a run whose
folder already holds a ``summary.json`` for the same resolved config is not run again. With
``jobs > 1`` runs execute in separate processes (one torch thread each unless ``threads`` is set).
``comm_clients`` adds a measured communication sweep: bytes of one round at K clients.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import yaml

from silofl.core.errors import ConfigError
from silofl.fl.registry import methods as registered_methods
from silofl.run.config import RunConfig, load_yaml_mapping
from silofl.run.folder import read_run_config

log = logging.getLogger("silofl")

HETERO_ARCHS = ("mlp", "lenet5", "cnn1", "cnn2")  # one architecture per pair of clients (paper's ablation)


def _hetero(clients: int) -> list[str]:
    return [HETERO_ARCHS[(k // 2) % len(HETERO_ARCHS)] for k in range(clients)]


PRESETS: dict[str, tuple[str, list[tuple[str, dict]]]] = {
    "none": ("no ablation: the base config", [("base", {})]),
    "noniid": (
        "non-IID sweep: fraction of each client's data from its major class",
        [(f"p_major={p}", {"p_major": p}) for p in (0.1, 0.3, 0.5, 0.8)],
    ),
    "hetero": (
        "heterogeneous private architectures, one per pair of clients",
        [("homogeneous", {}), ("mixed", {"private_models": "hetero"})],
    ),
    "dp": ("DP vs non-DP", [("DP", {}), ("no DP", {"privacy": "off"})]),
    "batch": ("batch size vs ε", [(f"B={b}", {"batch_size": b}) for b in (50, 125, 250, 500)]),
    "alpha": ("DML weight α sweep", [(f"alpha={a}", {"dml_alpha": a}) for a in (0.1, 0.3, 0.5, 0.7, 0.9)]),
    "privacy-mode": (
        "ProxyFL strict vs paper privacy mode",
        [("strict", {"privacy": "strict"}), ("paper", {"privacy": "paper"})],
    ),
}

CLIENT_DP_SIZES = {6: 2000, 20: 600}  # examples per client: 12,000 Fashion-MNIST images in both splits


def _client_dp_variants() -> list[tuple[str, dict]]:
    """Client-level DP study (Jiang et al., Table 1): N × (no DP | z × intermediaries and unit)."""
    out = []
    for n, spc in CLIENT_DP_SIZES.items():
        base = {"clients": n, "samples_per_client": spc}
        out.append((f"N={n} no DP", {**base, "privacy": "off"}))
        for z in (0.5, 1.0, 1.5):
            out.append((f"N={n} z={z} none", {**base, "noise_multiplier": z, "intermediaries": "none"}))
            for unit in ("subclient", "hospital"):
                out.append(
                    (
                        f"N={n} z={z} adaptive {unit}",
                        {**base, "noise_multiplier": z, "intermediaries": "adaptive", "privacy_unit": unit},
                    )
                )
    return out


PRESETS["client-dp"] = (
    "client-level DP: clients N, noise z, intermediaries and privacy unit",
    _client_dp_variants(),
)


def comm_methods() -> list[str]:
    """The example-level methods that exchange models (the communication sweep's)."""
    return [
        m
        for m, i in registered_methods().items()
        if i.exchange in ("gossip", "server") and not i.client_level
    ]


@dataclass
class CompareConfig:
    methods: list[str] = field(default_factory=lambda: list(registered_methods()))
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    out: str = "reports/latest"
    preset: str = "none"
    variants: list[dict] | None = None  # [{"name": ..., "set": {option: value}}], overrides preset
    jobs: int = 1
    resume: bool = False
    comm_clients: list[int] | None = None
    report_only: bool = False  # write the report from the finished runs; run nothing
    run: dict[str, Any] = field(default_factory=dict)  # RunConfig options shared by every run

    @classmethod
    def from_yaml(cls, path: str | Path) -> CompareConfig:
        data = load_yaml_mapping(path)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(
                f"unknown compare option(s): {', '.join(unknown)}; known: {', '.join(sorted(known))} "
                "(run options go under 'run:')"
            )
        return cls(**data)

    def base(self) -> RunConfig:
        """The shared run options as a config (options a method lacks are dropped)."""
        return RunConfig.from_dict(self.run, strict=False)

    def variant_list(self) -> list[tuple[str, dict]]:
        """The (name, option changes) of every variant: explicit ones, else the preset's."""
        if self.variants is not None:
            out = []
            for v in self.variants:
                if not isinstance(v, dict) or "name" not in v:
                    raise ConfigError(f"each variant needs a 'name' and optional 'set' mapping, got {v!r}")
                out.append((str(v["name"]), dict(v.get("set") or {})))
            return out
        if self.preset not in PRESETS:
            raise ConfigError(f"unknown preset {self.preset!r}; choose one of: {', '.join(PRESETS)}")
        return PRESETS[self.preset][1]

    def plan(self) -> list[PlannedRun]:
        """Every run of the comparison, resolved and checked against its data once, before any runs."""
        if not self.methods:
            raise ConfigError("no methods to compare")
        if not self.seeds:
            raise ConfigError("no seeds to run")
        if self.jobs < 1:
            raise ConfigError(f"jobs must be at least 1, got {self.jobs}")
        known = registered_methods()
        base = self.base()
        runs = []
        for vname, changes in self.variant_list():
            for label in self.methods:
                method, _, flag = label.partition(":")
                if method not in known:
                    raise ConfigError(
                        f"unknown method {method!r} in {label!r}; choose from: {', '.join(known)}"
                    )
                if flag not in ("", "nodp"):
                    raise ConfigError(f"unknown method flag {flag!r} in {label!r}; the only flag is ':nodp'")
                for seed in self.seeds:
                    ch = dict(changes)
                    if ch.get("private_models") == "hetero":
                        ch["private_models"] = _hetero(ch.get("clients", base.clients))
                    if flag == "nodp":
                        ch["privacy"] = "off"
                    if self.jobs > 1 and base.threads is None:
                        ch["threads"] = 1
                    rid = f"{_slug(vname)}/{_slug(label)}/seed{seed}"
                    # shared and variant options apply where the method has them
                    cfg = RunConfig.from_dict(
                        {
                            **self.run,
                            **ch,
                            "method": method,
                            "seed": int(seed),
                            "out": str(Path(self.out) / "runs" / rid),
                        },
                        strict=False,
                    ).resolve()
                    runs.append(PlannedRun(rid, vname, label, int(seed), cfg))
        return _with_data(runs)


def _with_data(runs: list[PlannedRun]) -> list[PlannedRun]:
    """Each run's config with its data-dependent settings filled and checked (each data set loaded once): a
    comparison that cannot run fails here with one clear error, before anything runs."""
    import torch

    from silofl.data import load_dataset
    from silofl.run.data import prepare_data

    loaded: dict[tuple, object] = {}
    for r in runs:
        c = r.cfg
        key = (
            c.dataset,
            c.data_dir,
            c.image_size,
            c.max_bag_size,
            c.data_seed if c.dataset in ("folder", "bags") else 0,
        )
        if key not in loaded:
            loaded[key] = load_dataset(
                c.dataset, c.data_dir, image_size=c.image_size, max_bag_size=c.max_bag_size, seed=c.data_seed
            )
        try:
            r.cfg, _ = prepare_data(c, torch.device("cpu"), loaded[key])
        except ConfigError as e:
            raise ConfigError(f"run {r.rid}: {e}") from None
    return runs


@dataclass
class PlannedRun:
    rid: str
    variant: str
    label: str
    seed: int
    cfg: RunConfig

    def done(self) -> bool:
        """A finished run of the same resolved config (the thread count aside) is in the folder."""
        d = Path(self.cfg.out)
        if not (d / "summary.json").is_file() or not (d / "config.yaml").is_file():
            return False
        try:  # options added since the run was written take their defaults
            have = read_run_config(d).resolve().to_flat()  # as it ran: config.yaml with plan.json's values
        except Exception:  # noqa: BLE001 - an unreadable or outdated config is simply not "done"
            return False
        want = self.cfg.to_flat()
        # the thread count does not change results; the folder is the one checked, however OUT was spelled
        ignore = {
            "threads": None,
            "out": None,
            "metric": None,
        }  # every metric is in a finished run: any may headline
        ignore["track"] = None  # where figures were also logged (--track) does not change them
        return {**have, **ignore} == {**want, **ignore}


def _slug(s: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_.=" else "_" for ch in s)


def _execute(cfg_dict: dict) -> dict:
    """Run one config; never raises (a crash comes back as {'error': ...})."""
    import os

    os.environ.setdefault("SILOFL_NO_PROGRESS", "1")
    from silofl.run.loop import run

    t0 = time.perf_counter()
    try:
        return {"summary": run(RunConfig.from_dict(cfg_dict), progress=False, overwrite=True)}
    except Exception as e:  # noqa: BLE001 - every failure is reported, the comparison goes on
        return {
            "error": f"{type(e).__name__}: {e}",
            "traceback": traceback.format_exc(),
            "seconds": time.perf_counter() - t0,
        }


def run_compare(cc: CompareConfig, console=None, progress: bool = True) -> dict:
    """Run (or resume) every planned run and write the report; returns its rows and failures."""
    from silofl.report.comparison import write_report

    runs = cc.plan()
    out = Path(cc.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.yaml").write_text(yaml.safe_dump(dataclasses.asdict(cc), sort_keys=False))
    results: dict[str, dict] = {}
    todo = []
    for r in runs:
        if (cc.resume or cc.report_only) and r.done():
            results[r.rid] = {
                "summary": json.loads((Path(r.cfg.out) / "summary.json").read_text()),
                "resumed": True,
            }
        elif cc.report_only:
            results[r.rid] = {"error": "not run (report only)"}
        else:
            todo.append(r)
    complete = sum(1 for r in runs if results.get(r.rid, {}).get("resumed"))
    _say(
        console,
        f"{len(runs)} runs planned, {complete} already complete (resume), {len(todo)} to run"
        f"{f' in {cc.jobs} processes' if cc.jobs > 1 else ''} → {out}",
    )
    with _progress(console, progress) as p:
        task = p.add_task("compare", total=len(todo)) if p else None
        started = 0

        def label(r: PlannedRun) -> str:
            return f"run {started}/{len(todo)}: {r.rid}"

        if cc.jobs == 1:
            for r in todo:
                started += 1
                if p:
                    p.update(task, description=label(r))
                results[r.rid] = _execute(r.cfg.to_dict())
                _report_one(console, r, results[r.rid])
                if p:
                    p.update(task, advance=1)
        else:
            with ProcessPoolExecutor(max_workers=cc.jobs, mp_context=get_context("spawn")) as pool:
                pending = {}
                queue = list(todo)
                while queue or pending:
                    while queue and len(pending) < cc.jobs:
                        r = queue.pop(0)
                        started += 1
                        pending[pool.submit(_execute, r.cfg.to_dict())] = r
                        if p:
                            p.update(task, description=label(r))
                    finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        r = pending.pop(fut)
                        try:
                            results[r.rid] = fut.result()
                        except Exception as e:  # noqa: BLE001 - a dead worker process
                            results[r.rid] = {"error": f"worker died: {type(e).__name__}: {e}"}
                        _report_one(console, r, results[r.rid])
                        if p:
                            p.update(task, advance=1)
    comm = None
    previous = out / "results.json"
    if cc.report_only and previous.is_file():  # keep the measured sweep of the last full run
        comm = json.loads(previous.read_text()).get("communication")
    if cc.comm_clients and not cc.report_only:
        _say(console, f"communication sweep: K = {', '.join(map(str, cc.comm_clients))}")
        try:
            comm = communication_sweep(cc.base(), cc.comm_clients, comm_methods())
        except Exception as e:  # noqa: BLE001 - the runs' report is still written
            log.error("communication sweep failed: %s", e)
            results["communication sweep"] = {"error": f"{type(e).__name__}: {e}"}
    return write_report(out, runs, results, comm, cc)


def _report_one(console, r: PlannedRun, res: dict) -> None:
    if "error" in res:
        _say(console, f"[red]FAILED[/] {r.rid}: {res['error']}")
        log.error("run %s failed:\n%s", r.rid, res.get("traceback", res["error"]))
    else:
        s = res["summary"]
        h = s["final"].get(s["headline"], {}).get("mean")
        _say(
            console,
            f"done {r.rid}: {s['headline']} {'—' if h is None else f'{h:.4f}'}, {s['wall_time_s']:.0f} s",
        )


def communication_sweep(base: RunConfig, ks: list[int], methods: list[str]) -> list[dict]:
    """Bytes of one round (after any start-up broadcast), measured on real messages, per method and K.

    Message sizes do not depend on the data split, so clients get IID shares of at most
    ``n_train / max(K)`` examples each (any partition could not serve 64 clients at p_major 0.8)."""
    from silofl.data import load_dataset
    from silofl.run.loop import build

    data = load_dataset(
        base.dataset,
        base.data_dir,
        image_size=base.image_size,
        max_bag_size=base.max_bag_size,
        seed=base.data_seed,
    )
    n_train = len(data.y_train)
    spc = base.with_data(n_train).samples_per_client
    per = max(2, min(spc, n_train // max(ks)))
    rows = []
    for k in ks:
        for m in methods:
            cfg = RunConfig.from_dict(
                {
                    **base.to_flat(),
                    "method": m,
                    "clients": k,
                    "samples_per_client": per,
                    "batch_size": min(base.with_data(n_train).batch_size, per),
                    "partition": "iid",
                    "delta": min(base.delta, 0.5 / per),
                    "target_epsilon": None,
                    "target_epsilons": None,
                    "private_models": None,
                },
                strict=False,
            )
            _, _, coordinator, engine = build(cfg, data=data)
            coordinator.start()
            sid = coordinator.server_id
            before, server_before = (
                sum(engine.bytes_sent.values()),
                engine.bytes_sent[sid] + engine.bytes_received[sid],
            )
            coordinator.run_round(1)
            total = sum(engine.bytes_sent.values()) - before
            rows.append(
                {
                    "method": m,
                    "clients": k,
                    "bytes_per_round": total,
                    "bytes_per_client_per_round": total / k,
                    "server_bytes_per_round": engine.bytes_sent[sid]
                    + engine.bytes_received[sid]
                    - server_before,
                }
            )
    return rows


def _say(console, text: str) -> None:
    if console is not None:
        console.print(text)


def _progress(console, enabled: bool):
    from contextlib import nullcontext

    if not enabled:
        return nullcontext()
    from silofl.run.loop import progress_bar

    return progress_bar(console)
