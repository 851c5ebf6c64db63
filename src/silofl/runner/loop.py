"""A run: data, sites, the method's coordinator and an engine, the rounds, and the run folder.

:func:`run` resolves the config, prepares the data, builds the sites (each with its own training data
and test sets) and the coordinator, and drives the rounds through an engine — the in-process simulator
by default, or one given by ``engine_factory`` (torch.distributed). It evaluates every ``eval_every``
rounds (and at the last, and whenever a site leaves), checkpoints every ``checkpoint_every`` rounds,
and writes the run folder (shared/CONVENTIONS.md): config.yaml (what was asked), plan.json (what the run
derived from it and the data, :class:`~silofl.runner.plan.RunPlan`), metrics.jsonl/.csv, summary.json, plots,
models/. The round loop's state is one :class:`~silofl.runner.checkpoint.RunState`, which is also what a
checkpoint's
``run.json`` saves. The engine and the method never meet: the coordinator talks to sites only through
``engine.call``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from silofl.comm.engine import Engine, InProcessEngine
from silofl.comm.messages import Message
from silofl.core.errors import ConfigError
from silofl.core.threads import apply as apply_threads
from silofl.core.threads import choose as choose_threads
from silofl.data import SplitData
from silofl.fl.coordinator import Coordinator, Method
from silofl.fl.registry import ACC_FIELDS
from silofl.privacy.analysis import ACCOUNTANT_NAMES
from silofl.runner.checkpoint import RunState, load_run, save_run, saved_rounds
from silofl.runner.config import RunConfig
from silofl.runner.data import prepare_run
from silofl.runner.folder import RunFolder, Stash, check_out, mean_std
from silofl.runner.plan import RunPlan, check_site_policies, config_with_plan
from silofl.runner.plan import given as given_plan
from silofl.runner.plots import plot_run, plot_server_rounds
from silofl.runner.tracking import open_tracker
from silofl.site.base import Site
from silofl.training.metrics import ECE_BINS, METRICS, metric_field

log = logging.getLogger("silofl")

CHECKPOINT_DIR = "checkpoint"
# options that may differ between a run and its resumption (metric: which computed figure is the
# headline; track: where the figures are also logged)
RESUMABLE_CHANGES = ("rounds", "threads", "checkpoint_every", "metric", "track")
EngineFactory = Callable[[Callable[[int], Site], int], Engine]
SiteMaker = Callable[[int], Site]


@dataclass(frozen=True)
class RunHooks:
    """Research hooks (``silofl audit``): change the split before any site is built, or add sites after the
    method's own (ids ``n..``). Neither changes a method; a run without hooks is untouched."""

    split: Callable[[RunConfig, SplitData], SplitData] | None = (
        None  # gets the config with its data-dependent settings
    )
    sites: Callable[[SiteMaker, int], tuple[SiteMaker, int]] | None = None


def resolve_device(name: str) -> torch.device:
    """The torch device for ``auto`` | ``cpu`` | ``cuda``."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda requested but no CUDA device is available")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


@dataclasses.dataclass
class SiteInputs:
    """What one site is built from: its training data, its test sets and its preprocessing (JSON)."""

    x: torch.Tensor
    y: torch.Tensor
    external: tuple[torch.Tensor, torch.Tensor] | None
    internal: tuple[torch.Tensor, torch.Tensor] | None = None
    preprocessing: dict | None = None
    persons: torch.Tensor | None = None  # --id-column: each training row's person (silofl.privacy.person)
    id_column: str | None = None


def site_inputs(method: Method, split: SplitData) -> list[SiteInputs]:
    """Each site's inputs from the split: its partition, the shared test set as it sees it (its own view with
    per-site sources), its own held-out rows and preprocessing where the split has one per site."""
    data = method.site_data(split.parts)

    def per_site(items):
        return items if items and len(items) == len(data) else None

    external, internal, prep = (
        per_site(split.external),
        per_site(split.internal),
        per_site(split.preprocessing),
    )
    persons = site_persons(split, len(data))
    return [
        SiteInputs(
            x,
            y,
            external[k] if external is not None else split.test,
            internal[k] if internal is not None else None,
            prep[k] if prep is not None else None,
            persons[k] if persons is not None else None,
            getattr(split, "id_column", None),
        )
        for k, (x, y) in enumerate(data)
    ]


def site_persons(split: SplitData, n_sites: int) -> list[torch.Tensor] | None:
    """Each site's training rows' person (``--id-column``), or None: the clients' own where every client is a
    site, renumbered apart where one site pools every client's rows (Joint: a person is a unit of one
    table)."""
    persons = getattr(split, "persons", None)
    if persons is None:
        return None
    if n_sites == len(persons):
        return list(persons)
    if n_sites == 1:
        out, offset = [], 0
        for p in persons:
            out.append(p + offset)
            offset += int(p.max()) + 1 if len(p) else 0
        return [torch.cat(out)]
    raise ConfigError(f"--id-column: {n_sites} sites built from {len(persons)} tables")


def make_site(
    method: Method,
    k: int,
    inputs: SiteInputs,
    shape,
    folder: Path | None = None,
    run_label: str = "run",
    release_nonprivate: bool = True,
) -> Site:
    """Site ``k`` of ``method`` built from its inputs (``shape``: input shape and classes), keeping its ledger
    and the figures it does not release in ``folder`` when given."""
    from silofl.site.combine import combination_for

    x, y, combination = combination_for(  # rows held out for the combiner, if on
        method.plan.config, k, inputs.x, inputs.y, batch_size=method.plan.batch_size
    )
    site = method.make_site(k, x, y, shape)
    site.combination = combination
    if inputs.persons is not None:  # person-level DP: the sampling, clipping and accountant's q are by person
        use = getattr(site, "use_persons", None)
        if use is None:
            raise ConfigError(
                f"--id-column: {method.plan.config.method}'s sites do not train with example-level DP-SGD"
            )
        use(inputs.persons.to(x.device), inputs.id_column or "id")
    if inputs.external is not None:
        site.tests["external"] = inputs.external
    if inputs.internal is not None:
        site.tests["internal"] = inputs.internal
    if folder is not None:
        site.open_folder(folder, run_label=run_label, release_nonprivate=release_nonprivate)
    if inputs.preprocessing is not None:
        site.preprocessing = inputs.preprocessing
    if (
        getattr(shape, "features", None) is not None
    ):  # the feature stage its inputs went through (silofl.features)
        site.features = shape.features
    return site


def site_factory(
    method: Method, split: SplitData, ledgers: Path | None = None, release_nonprivate: bool = True
) -> tuple[Callable[[int], Site], int]:
    """(a function building site k with its training data and test sets — and, with ``ledgers``, its own
    folder ``ledgers/client<k>`` for its privacy ledger and the figures it keeps —, the number of sites)."""
    inputs = site_inputs(method, split)

    def make(k: int) -> Site:
        return make_site(
            method,
            k,
            inputs[k],
            split,
            ledgers / f"client{k}" if ledgers is not None else None,
            Path(cast(RunConfig, method.plan.config).out).name,
            release_nonprivate,
        )

    return make, len(inputs)


@dataclass
class Built:
    """A run ready for its rounds: the plan (what was derived from the config and the data: the method was
    built from it), the config as asked (resolved; ``plan.config``), the split, the coordinator connected to
    its sites over an engine, the device."""

    plan: RunPlan
    cfg: RunConfig
    split: Any
    coordinator: Coordinator
    engine: Engine
    device: torch.device


def build_run(
    cfg: RunConfig,
    device: torch.device | None = None,
    engine_factory: EngineFactory | None = None,
    data=None,
    ledgers: bool = False,
    hooks: RunHooks | None = None,
    remote=None,
) -> Built:
    """Resolve ``cfg``, prepare its data, plan the run (:mod:`silofl.runner.plan`) and connect its coordinator
    to its sites over an engine (in-process unless ``engine_factory`` makes another). With ``ledgers`` every
    party keeps its privacy ledger under ``OUT/sites/``. ``remote``: the sites hold their own data elsewhere
    (a deployment, :class:`silofl.deploy.coordinator.RemoteSplit`: shapes and public facts only); nothing is
    loaded here and ``engine_factory`` gets no site factory. Raises ConfigError / BudgetExhausted before a run
    folder is written."""
    cfg = cfg.resolve()
    device = device if device is not None else resolve_device(cfg.device)
    root = ledger_root(cfg) if ledgers else None
    release = releases_nonprivate(cfg, engine_factory is None)
    if remote is not None:
        the_plan = given_plan(cfg)  # the deployment filled the sizes from the sites' hellos
        method = cfg.info.cls(the_plan)
        if engine_factory is None:
            raise ConfigError("a run on remote sites needs their engine")
        split, n_sites = remote, len(remote.sites)
        engine = engine_factory(None, n_sites)
    else:
        the_plan, split = prepare_run(cfg, device, data)
        if hooks is not None and hooks.split is not None:
            split = hooks.split(config_with_plan(the_plan), split)
        method = cfg.info.cls(the_plan)
        make, n_sites = site_factory(method, split, root, release)
        if hooks is not None and hooks.sites is not None:
            check_site_policies(hooks.sites, the_plan)  # sites with folders: their policies first
            make, n_sites = hooks.sites(make, n_sites)
        engine = (
            engine_factory(make, n_sites)
            if engine_factory is not None
            else InProcessEngine({k: make(k) for k in range(n_sites)})
        )
    coordinator = method.make_coordinator(n_sites, split, device)
    coordinator.release_nonprivate = release
    if root is not None:
        coordinator.open_ledger(root / "server")
    coordinator.connect(engine)
    return Built(the_plan, cfg, split, coordinator, engine, device)


def build(
    cfg: RunConfig,
    device: torch.device | None = None,
    engine_factory: EngineFactory | None = None,
    data=None,
    ledgers: bool = False,
    hooks: RunHooks | None = None,
    remote=None,
) -> tuple[RunConfig, SplitData, Coordinator, Engine]:
    """:func:`build_run` as (the config with the plan's values written in — :func:`config_with_plan`, for a
    caller that reads one flat config —, the split, the coordinator, the engine)."""
    b = build_run(cfg, device, engine_factory, data, ledgers, hooks, remote)
    return config_with_plan(b.plan), b.split, b.coordinator, b.engine


def releases_nonprivate(cfg: RunConfig, in_process: bool) -> bool:
    """Whether sites report figures computed from non-private data: the config's choice, else only when one
    process runs every site (a simulation; the figures are labelled)."""
    return cfg.report_nonprivate if cfg.report_nonprivate is not None else in_process


def ledger_root(cfg: RunConfig) -> Path:
    """Where a run's parties keep their privacy ledgers: ``OUT/sites/``."""
    return Path(cfg.out) / "sites"


def run(
    cfg: RunConfig,
    progress: bool = True,
    console=None,
    resume: bool = False,
    engine_factory: EngineFactory | None = None,
    overwrite: bool = False,
    hooks: RunHooks | None = None,
    remote=None,
) -> dict:
    """Run ``cfg`` and write its run folder; ``resume`` continues from the folder's latest checkpoint
    (models, optimizers, accountants, RNGs: the privacy spend carries on, it never restarts). ``hooks``: see
    :class:`RunHooks`; ``remote``: the sites run elsewhere (see :func:`build`). Returns the summary."""
    cfg = cfg.resolve()
    check_out(cfg.out, resume=resume, overwrite=overwrite)
    apply_threads(cfg.threads)  # one per process unless --threads (silofl.core.threads)
    if cfg.seed is not None:
        torch.manual_seed(cfg.seed)
    device = resolve_device(cfg.device)
    t_start = time.perf_counter()
    out = Path(cfg.out)
    asked = cfg
    if resume:
        rounds = saved_rounds(out / CHECKPOINT_DIR)
        if not rounds:
            raise ConfigError(
                f"no checkpoint to resume from in {out / CHECKPOINT_DIR} (run with --checkpoint-every N "
                "first)"
            )
        if cfg.data_seed is None:  # the same simulated split as the run being resumed
            _, saved = load_run(out / CHECKPOINT_DIR, rounds[-1])
            cfg = dataclasses.replace(cfg, split_seed=saved["config"].get("split_seed"))
    existed = out.exists()
    stash = Stash(out) if overwrite and not resume else None  # the previous run, kept until this one starts
    try:
        built = build_run(cfg, device, engine_factory, ledgers=True, hooks=hooks, remote=remote)
    except (
        BaseException
    ):  # bad input: leave nothing behind (a fresh run's site folders), restore what was there
        if not resume:
            shutil.rmtree(ledger_root(cfg), ignore_errors=True)
            if not existed and out.is_dir() and not any(out.iterdir()):
                out.rmdir()
        if stash is not None:
            stash.restore()
        raise
    if stash is not None:
        stash.drop()
    if built.plan.calibration is not None and console is not None:
        console.print(calibration_line(built.plan.calibration))
    tracker = open_tracker(cfg.track)  # --track KIND DIR (silofl.runner.tracking), else None
    try:
        return _run(built, asked, RunState(started=t_start), progress, console, resume, tracker)
    finally:
        built.engine.close()
        if tracker is not None:
            tracker.close()


def _run(
    built: Built, asked: RunConfig, state: RunState, progress: bool, console, resume: bool, tracker=None
) -> dict:
    """The rounds of a built run, from ``state`` (a fresh one, or the checkpoint's when resuming), and the run
    folder (``asked``: the config as the user asked, config.yaml; the plan: plan.json); ``tracker``:
    --track's, or None."""
    cfg, coordinator, engine = built.cfg, built.coordinator, built.engine
    info = cfg.info
    root = Path(cfg.out) / CHECKPOINT_DIR
    if resume:
        state = _resume(built, root, state)
        log.info("resuming %s after round %d", cfg.out, state.round)
        folder = RunFolder(cfg.out, keep_until=state.round)
    else:
        folder = RunFolder(cfg.out)
        coordinator.start()
    folder.write_config(asked, built.plan)
    if tracker is not None:
        tracker.start(asked)  # what config.yaml holds (plan.json: what was derived)
    first = state.round + 1
    internal = built.split.internal is not None and len(built.split.internal) == coordinator.n_sites

    bar = _progress(console) if progress else nullcontext()
    deferred: dict | None = None  # the facts of an evaluation that goes with the next round's messages
    with bar as p:
        task = p.add_task(info.name, total=cfg.rounds, completed=first - 1) if p else None

        def show(rnd: int, records: list[dict]) -> None:
            labels = {r["client"]: r.pop("_labels") for r in records}
            state.last.update({r["client"]: r for r in records})
            folder.add_metrics(records)
            if tracker is not None:
                tracker.log_round(rnd, records, labels)
            if p and records:
                p.update(task, description=_describe(info, records))

        for rnd in range(first, cfg.rounds + 1):
            t0 = time.perf_counter()
            ev = coordinator.run_round(rnd)
            state.train_s += time.perf_counter() - t0
            state.round = rnd
            state.left += [{"client": c, "round": rnd, "reason": "budget spent"} for c in ev.left]
            state.left += [
                {"client": c, "round": rnd, "reason": f"process lost: {why}"} for c, why in ev.lost.items()
            ]
            state.rejoined += [{"client": c, "round": rnd} for c in ev.rejoined]
            state.rejected += (
                ev.rejected + coordinator.take_late()
            )  # late: refusals of the last round's deliveries
            t0 = time.perf_counter()
            if deferred is not None:  # the last evaluation, whose replies came with this round's messages
                done, deferred = deferred, None
                show(done["round"], _record(cfg, done, coordinator.deferred_evaluation()))
            if rnd % cfg.eval_every == 0 or rnd == cfg.rounds or ev.left or ev.lost or ev.rejoined:
                checkpoint = bool(cfg.checkpoint_every and rnd % cfg.checkpoint_every == 0)
                facts = _site_facts(coordinator, engine, rnd)
                if (
                    rnd < cfg.rounds  # one message per site per round: it goes with the next round's step
                    and not (checkpoint or ev.left or ev.lost or ev.rejoined)
                    and coordinator.defer_evaluation(rnd, internal)
                ):
                    deferred = facts
                else:
                    show(rnd, _record(cfg, facts, coordinator.evaluate(rnd, internal)))
            state.eval_s += time.perf_counter() - t0
            if cfg.checkpoint_every and (rnd % cfg.checkpoint_every == 0 or rnd == cfg.rounds):
                _save(built, root, state)
            if p:
                p.update(task, advance=1)
            if not coordinator.active:
                log.info("every client has left the protocol after round %d", rnd)
                break
        assert deferred is None, "the last round, and one a site left, are evaluated at once"

    wall = time.perf_counter() - state.started
    coordinator.before_finish(state.round if state.round >= first else None)
    finals = coordinator.call(
        "finish",
        {k: Message({"models_dir": str(Path(cfg.out) / "models")}) for k in range(coordinator.n_sites)},
    )
    reports = {k: coordinator.site_report(k, r.meta) for k, r in sorted(finals.items())}
    state.rejected += coordinator.take_late()
    summary = _summary(built, state, reports, wall)
    if state.rejoined:
        summary["rejoined"] = state.rejoined
    folder.write_metrics_csv()
    guarantee = cfg.guarantee()
    if folder.records:
        eps_note = (
            ""
            if guarantee.formal
            else {"paper": "ε: NOT a formal guarantee (paper mode)", "off": "no DP"}.get(cfg.privacy, "")
        )
        summary["plots"] = [
            plot_run(
                folder.records,
                folder.path / "accuracy_epsilon.png",
                title=f"{info.name} on {cfg.dataset}, {cfg.clients} clients, privacy {cfg.privacy}",
                epsilon_note=eps_note,
                delta=cfg.delta if cfg.is_private else None,
            ).name
        ]
    history = coordinator.round_history()
    if history:
        summary.setdefault("plots", []).append(
            plot_server_rounds(
                history,
                folder.path / "server_rounds.png",
                title=f"{info.name}: noise level, diversity and sub-clients per round",
            ).name
        )
    folder.write_summary(summary)
    if isinstance(built.split, SplitData):  # each site's answer on its own rows (silofl.runner.decision)
        from silofl.runner.decision import report

        report(cfg, built.split, summary, folder.path, console)
    if tracker is not None:
        tracker.finish(summary)
    return summary


def _site_facts(coordinator: Coordinator, engine: Engine, rnd: int) -> dict:
    """What the coordinator knows of each reported site when round ``rnd`` is evaluated (taken then, even when
    the sites' replies come with the next round's messages): the bytes include the round's deliveries that
    wait for the sites' next message."""
    sent, received = coordinator.undelivered_bytes()
    return {
        "round": rnd,
        "sites": {
            k: {
                "active": k in coordinator.active,
                "bytes_sent": engine.bytes_sent[k] + sent.get(k, 0),
                "bytes_received": engine.bytes_received[k] + received.get(k, 0),
                "extra": coordinator.extra_metrics(k),
            }
            for k in coordinator.evaluated(rnd)
        },
    }


def _record(cfg: RunConfig, facts: dict, replies: dict[int, dict]) -> list[dict]:
    """One metrics record per reported site: accuracies, ε, bytes so far, the method's figures (and, under
    ``_labels``, each site's labels of its figures), from its evaluation reply and the coordinator's
    ``facts``."""
    records = []
    for k, r in sorted(replies.items()):
        accs = dict(r["accs"])
        accs.update({f"{name}_internal": v for name, v in r.get("internal", {}).items()})
        site = facts["sites"][k]
        records.append(
            {
                "round": facts["round"],
                "client": k,
                "active": site["active"],
                **accs,
                "epsilon": r["epsilon"],
                "delta": cfg.delta if cfg.is_private else None,
                "bytes_sent": site["bytes_sent"],
                "bytes_received": site["bytes_received"],
                **site["extra"],
                **r["extra"],
                **r["train"],
                "_labels": dict(r.get("labels", {})),
            }
        )
    return records


def _save(built: Built, root: Path, state: RunState) -> None:
    """Checkpoint round ``state.round``: every site saves its own state, then the coordinator's state and the
    round loop's (:class:`RunState`, with the torch RNG and the engine's byte counts) complete the round's
    folder."""
    coordinator, engine, rnd = built.coordinator, built.engine, state.round
    keep = 2 if engine.processes > 1 else 1
    coordinator.call(
        "save",
        {k: Message({"root": str(root), "round": rnd, "keep": keep}) for k in range(coordinator.n_sites)},
    )
    state.bytes_sent, state.bytes_received = dict(engine.bytes_sent), dict(engine.bytes_received)
    parties = {**coordinator.state_dict(), "torch_rng": torch.get_rng_state()}
    save_run(
        root,
        rnd,
        parties,
        state.to_record(config_with_plan(built.plan), built.plan, coordinator.n_sites),
        keep=keep,
    )


def _resume(built: Built, root: Path, state: RunState) -> RunState:
    """Load the latest checkpoint every party holds; the round loop's state at its round.

    Every site resumes from the same round: the latest one the coordinator and all of them completed
    (each keeps its newest checkpoints, so a crash while writing leaves an earlier common one). A site
    whose own latest checkpoint is newer keeps that checkpoint's accountant: rounds run again are
    counted again, and the privacy spend never goes back."""
    cfg, coordinator, engine = built.cfg, built.coordinator, built.engine
    rounds = set(saved_rounds(root))
    if not rounds:
        raise ConfigError(f"no checkpoint to resume from in {root} (run with --checkpoint-every N first)")
    held = coordinator.call(
        "checkpoints", {k: Message({"root": str(root)}) for k in range(coordinator.n_sites)}
    )
    for k in range(coordinator.n_sites):
        rounds &= set(held[k].meta["rounds"]) if k in held else set()
    if not rounds:
        raise ConfigError(f"no round of {root} has a checkpoint of every site to resume from")
    rnd = max(rounds)
    parties, record = load_run(root, rnd)
    saved = RunConfig.from_dict(record["config"], strict=False).to_flat()  # the config with its plan's values
    want = config_with_plan(built.plan).to_flat()
    diff = sorted(k for k in want if k not in (*RESUMABLE_CHANGES, "out") and saved.get(k) != want[k])
    if diff:
        raise ConfigError(
            f"cannot resume {cfg.out}: the checkpoint was written with different options "
            f"({', '.join(f'{k}={saved.get(k)!r}' for k in diff)}); only {', '.join(RESUMABLE_CHANGES)} may "
            f"change"
        )
    if rnd >= cfg.rounds:
        raise ConfigError(
            f"the checkpoint of {cfg.out} is at round {rnd}; ask for more rounds than that to resume"
        )
    coordinator.call(
        "load", {k: Message({"root": str(root), "round": rnd}) for k in range(coordinator.n_sites)}
    )
    torch.set_rng_state(parties.pop("torch_rng"))
    coordinator.load_state_dict(parties)
    coordinator.call("status", {k: Message() for k in coordinator.active})
    loaded = RunState.from_record(record, started=state.started)
    engine.bytes_sent.update(loaded.bytes_sent)
    engine.bytes_received.update(loaded.bytes_received)
    return loaded


def _summary(built: Built, state: RunState, reports: dict[int, dict], wall: float) -> dict:
    """summary.json's content (shared/CONVENTIONS.md) from the built run, the round loop's state and the
    sites' final reports."""
    cfg, split, coordinator, engine = built.cfg, built.split, built.coordinator, built.engine
    last, rounds_run = state.last, state.round
    info = cfg.info
    sent, received = dict(engine.bytes_sent), dict(engine.bytes_received)
    acc_keys = [
        k + sfx for sfx in ("", "_internal") for k in ACC_FIELDS if any(k + sfx in r for r in last.values())
    ]
    # every model's other metrics (silofl.training.metrics), after the accuracies
    acc_keys += [
        metric_field(k, m) + sfx
        for sfx in ("", "_internal")
        for k in ACC_FIELDS
        for m in METRICS
        if m != "accuracy" and any(metric_field(k, m) + sfx in r for r in last.values())
    ]
    per_client = [
        {
            "client": k,
            **{f"{role}_model": arch for role, arch in f["architectures"].items()},
            "round": last.get(k, {}).get("round"),
            **{key: last.get(k, {}).get(key) for key in acc_keys},
            "epsilon": f["epsilon"],
            "left_at": f["left_at"],
            "bytes_sent": sent.get(k, 0),
            "bytes_received": received.get(k, 0),
        }
        for k, f in reports.items()
    ]
    g = cfg.guarantee()
    nodes = sorted(set(sent) | set(received))
    opts = cfg.options
    summary = {
        "method": cfg.method,
        "headline": metric_field(info.headline, cfg.metric),  # the method's judged model, scored by --metric
        "metric": cfg.metric,
        "metrics": metrics_note(cfg.dataset, cfg.data_task() if hasattr(cfg, "data_task") else None),
        "dataset": cfg.dataset,
        "data_source": split.source,
        "test_set": split.test_set,
        "features": getattr(split, "features", None) or {"features": {"name": "none"}},
        "sites": split.sites,
        "clients": cfg.clients,
        "sites_trained": coordinator.n_sites,
        "rounds_requested": cfg.rounds,
        "rounds_run": rounds_run,
        "privacy": {
            "mode": cfg.privacy,
            "formal_guarantee": g.formal,
            "formal_if_seed_secret": _unseeded(cfg).guarantee().formal,
            "note": g.note,
            "unit": g.unit,
            "delta": cfg.delta if cfg.is_private else None,
            "accountant": ACCOUNTANT_NAMES[cfg.accountant] if cfg.is_private else None,
            "dml_alpha": opts.dml_alpha if info.mutual_learning else None,
            "dml_beta": opts.dml_beta if info.mutual_learning else None,
            **coordinator.privacy_summary(),
            "noise_calibration": built.plan.calibration,
        },
        "final": {
            "per_client": per_client,
            **{k: mean_std([r[k] for r in per_client]) for k in acc_keys},
            "epsilon": mean_std([r["epsilon"] for r in per_client]),
        },
        "randomness": randomness_report(cfg),
        "reporting": {
            "nonprivate_released": coordinator.release_nonprivate,
            "note": (
                "figures computed from non-private data (private_acc, mean_grad_norm, clipped_fraction, "
                "update_norm_mean, a server's xi/phi/lambda/cos_std) are reported: every site of this run "
                "chose to "
                "(a one-process simulation does by default)"
                if coordinator.release_nonprivate
                else "sites report only figures of DP releases and public ones; each keeps the rest in its "
                "own folder "
                "(OUT/sites/client<k>/metrics.jsonl)"
            ),
        },
        # the split this run drew (the plan's: a fresh draw when no seed was given), so --vs-alone and a rerun
        # train on the same rows
        "data_split_seed": built.plan.split_seed if built.plan.split_seed is not None else cfg.data_seed,
        "wall_time_s": wall,
        "train_time_s": state.train_s,
        "eval_time_s": state.eval_s,
        "seconds_per_round": (state.train_s + state.eval_s) / max(1, rounds_run),
        "threads": torch.get_num_threads(),
        "threads_chosen": choose_threads(cfg.threads).describe(),
        "device": str(built.device),
        "processes": engine.processes,
        "engine": engine.describe(),
        "accounting": [f["privacy"] for f in reports.values()],
        "left": state.left,
        "rejected_messages": state.rejected,
        "bytes": {
            "sent": {str(n): sent.get(n, 0) for n in nodes},
            "received": {str(n): received.get(n, 0) for n in nodes},
            "server_node": coordinator.server_id if info.exchange == "server" else None,
            "total_sent": sum(sent.values()),
            "per_client_mean": statistics.fmean(r["bytes_sent"] + r["bytes_received"] for r in per_client),
        },
    }
    if engine.processes > 1:  # measured between processes
        summary["lost_processes"] = dict(getattr(engine, "lost_processes", {}))
        summary["receive_seconds"] = dict(getattr(engine, "receive_seconds", {}))
    if getattr(cfg, "id_column", None) and cfg.is_private:  # person-level DP (silofl.privacy.person)
        person_unit_or_warning(summary, cfg, info)
    warning = getattr(split, "privacy_unit_warning", None)
    if warning is not None:  # no --id-column, but a column looks like a repeated person id: ε is per row
        summary["privacy_unit_warning"] = warning
    history = coordinator.round_history()
    if history:
        summary["server_rounds"] = history
    summary["models"] = [m for f in reports.values() for m in f["models"]]
    return summary


def person_unit_or_warning(summary: dict, cfg: RunConfig, info) -> None:
    """The privacy unit of a run with ``--id-column``: "person" only when every site's ledger composed this
    run per person (its report's ``run_units``, read back from its ledger); else the unit stays the row and
    ``privacy.person_level_missing`` names the sites, with a warning."""
    from silofl.privacy.person import not_per_person

    summary["privacy"]["id_column"] = cfg.id_column
    missing = not_per_person(summary["accounting"])
    if missing:
        note = (
            f"--id-column {cfg.id_column} was asked, but the ledgers of clients {missing} did not compose "
            "this run per person: their ε is per row (a person with k rows is protected at about k·ε)"
        )
        log.warning("privacy unit: %s", note)
        summary["privacy"]["person_level_missing"] = {"clients": missing, "message": note}
        return
    where = "the pooled data set" if info.traits.pooled else "one client"
    summary["privacy"]["unit"] = (
        f"one person of {where}: every row with the same {cfg.id_column} (privacy unit: person "
        f"(column {cfg.id_column}); example-level DP-SGD with persons sampled and clipped as one)"
    )


def metrics_note(dataset: str | None = None, task: str | None = None) -> dict:
    """What summary.json says about its metrics (silofl.training.metrics); a segmentation data set's runs
    compute pixel accuracy, Dice and IoU (silofl.training.segmentation), a survival target's the C-index
    (``task``: the run's, :meth:`RunConfig.data_task`)."""
    from silofl.data.datasets import dataset_meta
    from silofl.training.metrics import metric_task

    if task is None:
        task = dataset_meta(dataset).get("task", "classification") if dataset else "classification"
    if task == "survival":
        return {
            "computed": ["c_index"],
            "fields": "<role>_c_index (role: private, proxy, global; _internal: on the site's own held-out "
            "rows); <role>_acc is null (accuracy is not defined for a survival target)",
            "c_index": "Harrell's C over the comparable pairs (i had the event, j outlived it) of the risk "
            "scores log Σ_k h_k(x), ties in risk counting 1/2 (silofl.training.survival)",
            "privacy": "each figure is labelled and released like the accuracy of the same model",
        }
    if task == "segmentation":
        return {
            "computed": [m for m in METRICS if metric_task(m) in ("any", task)],
            "fields": "<role>_acc (pixel accuracy), <role>_dice, <role>_iou (role: private, proxy, global; "
            "_internal: on the site's own held-out images)",
            "dice": "2|P∩G| / (|P| + |G|) of the predicted foreground P and the mask G, per image, averaged "
            "over the images (several foreground classes: their mean per image); 1 when both are empty",
            "iou": "|P∩G| / |P∪G|, per image, averaged; 1 when both are empty",
            "privacy": "each figure is labelled and released like the accuracy of the same model",
        }
    return {
        "computed": [m for m in METRICS if metric_task(m) not in ("segmentation", "survival")],
        "fields": "<role>_acc, <role>_auroc, <role>_balanced_accuracy, <role>_f1, "
        "<role>_ece (role: private, proxy, global, combined; _internal: on the site's own held-out rows)",
        "auroc": "binary: AUROC of class 1's probability; more classes: one-vs-rest, macro over the classes "
        "present "
        "in the test labels (null when fewer than two are present)",
        "f1": "macro over the classes in the labels or the predictions",
        "balanced_accuracy": "mean recall over the classes present in the labels",
        "ece": f"{ECE_BINS} equal-width bins (lo, hi] of the confidence (the largest class probability); "
        f"lower is "
        "better",
        "privacy": "each figure is labelled and released like the accuracy of the same model",
    }


def calibration_report(cfg: RunConfig, split: SplitData) -> dict | None:
    """How a budget-first run chose σ (None when σ was given): ``cfg`` as it runs (σ calibrated), the split it
    runs on (:func:`silofl.runner.plan.calibration_report`; a run has it in its plan)."""
    if not cfg.calibrates:
        return None
    from silofl.runner.data import unit_sizes
    from silofl.runner.plan import calibration_report as report
    from silofl.runner.plan import party_plans

    return report(cfg, cfg.noise_multiplier, party_plans(cfg, unit_sizes(cfg, split)))


def calibration_line(cal: dict) -> str:
    """One console line saying which σ the budget set."""
    p = max(cal["parties"], key=lambda x: x["planned_epsilon"])
    return (
        f"budget-first: σ = {cal['noise_multiplier']:.4f} so that {cal['rounds_planned']} rounds "
        f"({p['steps']} steps "
        f"at q = {p['sample_rate']:.4g}) end at ε = {p['planned_epsilon']:.3f} ≤ {p['target_epsilon']:g} "
        f"(δ = {cal['delta']:g}, {cal['accountant']})"
    )


def _unseeded(cfg: RunConfig) -> RunConfig:
    return dataclasses.replace(cfg, seed=None)


def randomness_report(cfg: RunConfig) -> dict:
    """Where the run's noise and sampling came from, for summary.json."""
    from silofl.core.randomness import SOURCE
    from silofl.privacy.guarantee import SEEDED_NOTE

    if cfg.seed is None:
        return {"seeded": False, "source": SOURCE}
    return {
        "seeded": True,
        "seed": cfg.seed,
        "source": "torch/numpy generators seeded from the run seed per party",
        "note": SEEDED_NOTE,
    }


def _describe(info, records: list[dict]) -> str:
    accs = " ".join(
        f"{k.removesuffix('_acc')} {statistics.fmean(r[k] for r in records):.3f}"
        for k in ACC_FIELDS
        if all(r.get(k) is not None for r in records)
    )
    # a survival run has no accuracy (None): its C-index instead (silofl.training.tasks)
    accs += "".join(
        f" {k.removesuffix('_acc')} C {statistics.fmean(r[c] for r in records):.3f}"
        for k in ACC_FIELDS
        for c in [k.removesuffix("_acc") + "_c_index"]
        if all(r.get(c) is not None for r in records)
    )
    eps = [r["epsilon"] for r in records if r["epsilon"] is not None]
    e = f" ε {max(eps):.2f}" if eps else ""
    return f"{info.name} {accs}{e}"


def progress_bar(console):
    """A Rich progress bar (disabled when SILOFL_NO_PROGRESS is set)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
        disable=bool(os.environ.get("SILOFL_NO_PROGRESS")),
    )


_progress = progress_bar
