"""``silofl`` command line: ``run``, ``launch``, ``tune``, ``compare``, ``evaluate``, ``predict``, ``export``,
``audit`` and the ``pubsub``, ``site`` and ``deploy`` groups.

The run options of ``run``, ``compare``, ``audit``, ``tune`` and ``deploy local/start`` are generated from
:class:`~silofl.runner.config.RunConfig` and every registered method's options
(:mod:`silofl.cli.config_options`), and
each command calls the Python API (:mod:`silofl.api`). Flags override ``--set KEY=VALUE``, which overrides
``--config FILE.yaml``, which overrides the defaults. Errors a user can fix are printed as one line (exit code
2),
never as a traceback.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from types import SimpleNamespace

import typer
import typer.main
from rich.console import Console
from rich.table import Table

from silofl.cli.common import check_seconds, err_console, friendly_errors
from silofl.cli.config_options import config_command, parse_list, run_options
from silofl.comm.engines import selectable_engines
from silofl.core.errors import ConfigError

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="silofl: cross-silo learning with measured privacy."
)
console = Console()


OUTPUT, ENGINE = (
    "Output",
    "Engine",
)  # help panels of the commands' own options (the generated ones: config_options)


def _version(value: bool) -> None:
    if value:
        from silofl import __version__

        typer.echo(f"silofl {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_version, help="Print silofl's version and exit."
    ),
) -> None:
    """silofl: cross-silo learning with measured privacy."""


def describe(resolved) -> None:
    """Print what a run will do (its method, data, models, privacy) before it starts."""
    head = (
        f"[bold]silofl run[/] {resolved.method} on {resolved.dataset}: {resolved.clients} clients, "
        f"{resolved.rounds} rounds, "
    )
    o = resolved.options
    if resolved.is_client_level:
        clip_txt = f"adaptive from {resolved.clip:g}" if o.adaptive_clip else f"{resolved.clip:g}"
        console.print(
            head + f"model {o.proxy_model}, privacy [bold]{resolved.privacy}[/] per "
            f"{o.privacy_unit} (z={resolved.noise_multiplier:g}, clip {clip_txt}, intermediaries "
            f"{o.intermediaries}) → {resolved.out}"
        )
    else:
        models = [
            f"{role} {getattr(o, f)}"
            for role, f in (("private", "private_model"), ("proxy", "proxy_model"))
            if hasattr(o, f)
        ]
        dml = f" (α={o.dml_alpha}, β={o.dml_beta})" if resolved.info.mutual_learning else ""
        console.print(
            head + f"{' / '.join(models)}, privacy [bold]{resolved.privacy}[/]{dml} → {resolved.out}"
        )
    if resolved.defaults:
        from silofl.runner.recipe import defaults_line

        console.print(defaults_line(resolved))
    if resolved.seed is not None and resolved.is_private:
        console.print(
            f"[bold yellow]seed {resolved.seed}:[/] a seeded research run — noise and sampling come from the "
            "seed, so the privacy guarantee holds only while the seed stays secret"
        )


def run_command(
    cfg,
    *,
    engine: str = "simulator",
    resume: bool = False,
    overwrite: bool = False,
    quiet: bool = False,
    vs_alone: bool = False,
    engine_options=None,
) -> None:
    """What `silofl run` and the deploy commands share: say what runs, run it through the API, print the
    summary."""
    from silofl import api

    requested = cfg.privacy
    resolved = cfg.resolve()
    describe(resolved)
    if requested != resolved.privacy and not resolved.info.traits.nonprivate:
        console.print(
            f"note: privacy {requested!r} concerns mutual learning only; {resolved.method} runs in "
            f"{resolved.privacy!r} mode"
        )
    api.run(
        cfg,
        engine=engine,
        resume=resume,
        overwrite=overwrite,
        quiet=quiet,
        vs_alone=vs_alone,
        console=console,
        engine_options=engine_options,
        on_summary=print_summary,
    )


@config_command(app)
def run(
    recipe: str | None = typer.Argument(
        None,
        metavar="[RECIPE]",
        help="What to run: a recipe of silofl's (silofl/recipes: proxyfl-scatter, the README's main job; "
        "proxyfl-paper; proxyfl-table) or a recipe file's path. Options given here override it.",
        show_default=False,
    ),
    config: Path | None = typer.Option(
        None, "--config", help="YAML file with any run options (a method's own under its name)."
    ),
    set_: list[str] = typer.Option([], "--set", help="Any other option, KEY=VALUE (YAML value); repeatable."),
    engine: str = typer.Option(
        "simulator",
        "--engine",
        rich_help_panel=ENGINE,
        help="The engine, from the engines' "
        f"registry: {' | '.join(selectable_engines())} (silofl deploy local / start use the "
        "Flower ones; torch.distributed: silofl launch).",
    ),
    peer_timeout: float = typer.Option(
        300.0,
        "--peer-timeout",
        rich_help_panel=ENGINE,
        help="Seconds to wait for a peer's message (multi-process runs).",
    ),
    resume: bool = typer.Option(
        False,
        "--resume",
        rich_help_panel=OUTPUT,
        help="Continue OUT from its latest "
        "checkpoint (same options; --rounds may grow). The privacy spend carries on.",
    ),
    overwrite: bool = typer.Option(
        False,
        "--overwrite",
        rich_help_panel=OUTPUT,
        help="Replace the run already in OUT (refused otherwise).",
    ),
    quiet: bool = typer.Option(False, "--quiet", rich_help_panel=OUTPUT, help="No progress bar."),
    vs_alone: bool = typer.Option(
        False,
        "--vs-alone",
        rich_help_panel=OUTPUT,
        help="Afterwards train each site alone "
        "without DP (Regular, same split and rounds) into OUT/alone and print how this run "
        "compares.",
    ),
    deploy_timeout: float = typer.Option(
        900.0,
        "--deploy-timeout",
        rich_help_panel=ENGINE,
        help="flower-local, flower: seconds the deployed run may take.",
    ),
    insecure: bool = typer.Option(
        False,
        "--insecure",
        rich_help_panel=ENGINE,
        help="flower-local: no TLS, no node authentication (recorded in the summary; loopback tests).",
    ),
    restart_sites: bool = typer.Option(
        False,
        "--restart-sites",
        rich_help_panel=ENGINE,
        help="flower-local: restart a site process that dies.",
    ),
    deployment: Path | None = typer.Option(
        None,
        "--deployment",
        rich_help_panel=ENGINE,
        help="flower: the coordinator's deployment folder (its registered sites: silofl deploy register).",
    ),
    superlink: str | None = typer.Option(
        None, "--superlink", rich_help_panel=ENGINE, help="flower: the SuperLink's HOST:PORT."
    ),
):
    """Run a method and write a run folder (config.yaml, metrics.jsonl, summary.json, plots, models/)."""
    from silofl.api import EngineOptions, engine_names
    from silofl.comm.engines import engine_entry
    from silofl.runner.config import RunConfig

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    if engine not in engine_names():
        raise ConfigError(f"unknown engine {engine!r}; choose one of: {', '.join(engine_names())}")
    check_seconds("--peer-timeout", peer_timeout)
    check_seconds("--deploy-timeout", deploy_timeout)
    # an engine whose sites read their own data (their site.json): the coordinator reads none
    fixed = {"data_at_sites": True} if engine_entry(engine).data_at_sites else {}
    cfg = RunConfig.from_dict(_with_defaults(run_options(config, set_, recipe, **fixed), recipe))
    opts = EngineOptions(
        timeout_s=deploy_timeout,
        peer_timeout_s=peer_timeout,
        insecure=insecure,
        restart_sites=restart_sites,
        deployment=deployment,
        superlink=superlink,
    )
    launching = _launching()
    if launching is not None:  # `silofl launch`: its processes' entry, from these options parsed once here
        _launch_run(launching, cfg, peer_timeout, resume, overwrite, quiet)
        return
    run_command(
        cfg,
        engine=engine,
        resume=resume,
        overwrite=overwrite,
        quiet=quiet,
        vs_alone=vs_alone,
        engine_options=opts,
    )


def _with_defaults(options: dict, recipe: str | None) -> dict:
    """A run naming no recipe takes its defaults from its data family's (silofl.runner.recipe)."""
    from silofl.runner.recipe import with_family_defaults

    return options if recipe else with_family_defaults(options)


def _launch_run(
    launching: dict, cfg, peer_timeout: float, resume: bool, overwrite: bool, quiet: bool
) -> None:
    """Fill in what `silofl launch` asked of `run` (:func:`_launching`): the ranks' typed entry and how the
    launch reports the result; with ``check``, the options checked once on this machine first."""
    from silofl.runner.entry import PRELOAD, RankOptions, check_launched_processes, rank_entry
    from silofl.runner.folder import check_out

    resolved = cfg.resolve()
    if launching["check"]:
        check_launched_processes(launching["processes"], resolved.clients)
        check_out(resolved.out, resume=resume, overwrite=overwrite)
        describe(resolved)
    launching.update(
        entry=rank_entry(cfg, RankOptions(peer_timeout, resume, overwrite, quiet)),
        preload=PRELOAD,
        result=Path(resolved.out) / "summary.json",
        report=print_summary,
    )


LAUNCHING = "silofl_launching"  # click's context meta: `silofl launch` asks its command for the entry


def _launching() -> dict | None:
    """What `silofl launch` asks of the command it parses (``processes``, ``check``: whether this machine
    checks the options), which the command fills in (``entry``, ``preload``, ``result``, ``report``)
    instead of running; None when the command runs itself."""
    import click

    return click.get_current_context().meta.get(LAUNCHING)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@friendly_errors
def launch(
    ctx: typer.Context,
    nproc_per_node: int = typer.Option(
        ..., "--nproc-per-node", help="Processes on this machine (sites here)."
    ),
    nnodes: int = typer.Option(1, "--nnodes", help="Machines taking part."),
    rdzv_endpoint: str | None = typer.Option(
        None,
        "--rdzv-endpoint",
        help="host:port every machine reaches (several machines; one machine uses a local endpoint).",
    ),
    rdzv_id: str = typer.Option("silofl", "--rdzv-id", help="A name shared by the machines of one run."),
    max_restarts: int = typer.Option(
        0,
        "--max-restarts",
        help="torchrun: restart every process up to N times "
        "after a failure; with --checkpoint-every they resume from the last checkpoint.",
    ),
    survive_faults: bool = typer.Option(
        False,
        "--survive-faults",
        help="Start the processes without torchrun's "
        "agent (which stops all when one fails): a crashed or hung process is "
        "dropped and the others finish.",
    ),
    node_rank: int = typer.Option(
        0,
        "--node-rank",
        help="With --survive-faults on several machines: this "
        "machine's index (0 hosts the rendezvous at --rdzv-endpoint).",
    ),
    grace_s: float = typer.Option(
        30.0,
        "--grace-s",
        help="With --survive-faults: seconds the processes may take "
        "to exit after the reporting one; still running then (hung), they are killed.",
    ),
    auth_key_file: str | None = typer.Option(
        None,
        "--auth-key-file",
        help="A file with the run's shared key (hex): "
        "every frame between processes is authenticated with it. Needed on "
        "several machines (the same file on each); one machine makes its own.",
    ),
):
    """Run `silofl run ARGS` as one process per client on torch.distributed (gloo), launched with torchrun.

    Every other option is passed to `silofl run` (e.g. --method fedavg --clients 4 --out runs/x). Client k
    runs on process k mod (processes); a server runs with client 0 on process 0, which writes the run folder.
    `silofl launch … audit ARGS` runs `silofl audit ARGS` the same way (gradient canaries of an example-level
    method; process 0 holds the audited site and writes the audit folder).
    """
    import shlex

    from silofl.comm.launcher import ensure_run_key

    ensure_run_key(nnodes, auth_key_file)
    if nnodes > 1 and not rdzv_endpoint:
        raise ConfigError("several machines need --rdzv-endpoint host:port")
    command, args_of = ("audit", ctx.args[1:]) if ctx.args[:1] == ["audit"] else ("run", ctx.args)
    launching = {
        "processes": nproc_per_node * nnodes,
        "check": node_rank == 0,
        # the command line an audit records (never parsed again: the processes get the entry)
        "command": "silofl " + shlex.join(sys.argv[1:]) if sys.argv[1:2] == ["launch"] else None,
    }
    _plan_launch(ctx, command, args_of, launching)
    entry, preload = launching["entry"], launching["preload"]
    if survive_faults:
        from silofl.comm.launcher import launch_processes

        code = launch_processes(
            entry, nproc_per_node, nnodes, node_rank, rdzv_endpoint, err_console, grace_s, preload
        )
        if code == 0:
            _report_launched(launching)
        raise typer.Exit(code)
    from silofl.comm.launcher import torchrun

    args = [
        "--nproc-per-node",
        str(nproc_per_node),
        "--nnodes",
        str(nnodes),
        "--max-restarts",
        str(max_restarts),
    ]
    if rdzv_endpoint:
        args += ["--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint, "--rdzv-id", rdzv_id]
    else:
        args += ["--standalone"]
    try:
        torchrun(args, entry, preload)
    except Exception as e:  # torchrun's ChildFailedError: say which process failed, not a traceback
        err_console.print(f"[bold red]error:[/] a process of the run failed: {e}")
        raise typer.Exit(1) from None
    _report_launched(launching)


def _plan_launch(ctx: typer.Context, command: str, args: list[str], launching: dict) -> None:
    """Parse and check a launched command's options once, in this process: the command fills ``launching``
    with its processes' :class:`~silofl.core.forking.Entry` (the run as data) instead of running. A bad
    option is one line and exit code 2 before any process starts."""
    import click

    sub = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    ctx.meta[LAUNCHING] = launching
    try:
        with sub.make_context(f"silofl {command}", list(args), parent=ctx) as sub_ctx:
            sub.invoke(sub_ctx)
    except click.ClickException as e:  # a malformed option, as the command itself would show it
        e.show()
        raise typer.Exit(2) from None
    finally:
        ctx.meta.pop(LAUNCHING, None)


def _report_launched(launching: dict) -> None:
    """Print what the launched run or audit wrote (its summary.json or audit.json), where process 0 wrote it
    on this machine."""
    result: Path = launching["result"]
    if launching["check"] and result.is_file():
        launching["report"](json.loads(result.read_text()))


def _number_list(text: str, flag: str) -> list[float]:
    return parse_list(text, flag, "float")


def print_summary(summary: dict) -> None:
    """Print a run's final per-client table, what its ε means, and its timing."""
    from silofl.fl.registry import ACC_FIELDS as ACC_KEYS
    from silofl.training.metrics import higher_is_better, metric_field

    priv = summary["privacy"]
    fin = summary["final"]
    rows = fin["per_client"]
    acc_keys = [k for k in ACC_KEYS if k in fin]
    # a survival run has no accuracy (all null): only its headline's column
    acc_keys = [k for k in acc_keys if not isinstance(fin[k], dict) or fin[k].get("mean") is not None]
    metric = summary.get("metric", "accuracy")
    if metric != "accuracy":  # the headline metric of every model next to its accuracy
        acc_keys += [metric_field(k, metric) for k in ACC_KEYS if metric_field(k, metric) in fin]
    arch_keys = [k for k in ("private_model", "proxy_model", "global_model") if any(k in r for r in rows)]
    t = Table(title=f"{summary['method']} · {summary['dataset']} · {summary['rounds_run']} rounds")
    any_left = bool(summary["left"])
    cols = (
        "client",
        *(k.removesuffix("_model") for k in arch_keys),
        *(k.replace("_", " ") for k in acc_keys),
        "ε",
    )
    for col in cols + (("left at",) if any_left else ()):
        t.add_column(col, justify="right", overflow="fold")
    for r in rows:
        row = [
            str(r["client"]),
            *(r.get(k) or "—" for k in arch_keys),
            *(_f(r.get(k)) for k in acc_keys),
            _f(r["epsilon"], 2),
        ]
        t.add_row(*row, *((str(r["left_at"] or "—"),) if any_left else ()))
    t.add_row(
        "mean±std",
        *([""] * len(arch_keys)),
        *(_ms(fin[k], 3) for k in acc_keys),
        _ms(fin["epsilon"], 2),
        *(("",) if any_left else ()),
    )
    console.print(t)
    if metric != "accuracy" and summary.get("headline") in fin:
        console.print(
            f"judged by {summary['headline'].replace('_', ' ')} (--metric {metric}"
            f"{', lower is better' if not higher_is_better(metric) else ''}): "
            f"{_ms(fin[summary['headline']], 4)}"
        )
    _print_site_ledgers(summary)
    if priv["mode"] == "off":
        console.print("privacy: [bold]off[/] — no differential privacy.")
    else:
        style = "green" if priv["formal_guarantee"] else "bold yellow"
        console.print(
            f"privacy: [{style}]{priv['mode']}[/] — ε at δ={priv['delta']:g} from {priv['accountant']}; "
            f"{priv['note']}."
        )
        if "epsilon_hospital" in priv:
            console.print(
                f"client-level ε at δ={priv['delta']:g}: hospital {priv['epsilon_hospital']:.3f}, "
                f"sub-client {priv['epsilon_subclient']:.3f} — {priv['note_units']}"
            )
    if priv.get("secure_aggregation") and priv.get("server_sees"):  # FedAvg / FML: uploads DP at the site
        console.print(
            f"secure aggregation: on — the server saw {priv['server_sees']}; the example-level ε is "
            f"unchanged (noise placement: {priv['noise_placement']}); {priv['bits_per_coordinate']} bits per "
            f"coordinate, range {priv['secagg_range']:g}, {priv['rounds_released']} rounds released, "
            f"{priv['rounds_abandoned']} abandoned."
        )
    elif priv.get("secure_aggregation"):
        eps = priv.get("epsilon_vs_server")
        console.print(
            "secure aggregation: on — the server saw masked vectors and sums only; "
            + (
                f"ε against the server {eps:.3f} at δ={priv['delta']:g} (noise placement: "
                f"{priv['noise_placement']}, at least {priv['min_survivors']} sites' noise per sum); "
                if eps is not None
                else "no DP noise; "
            )
            + f"{priv['bits_per_coordinate']} bits per coordinate, {priv['rounds_released']} rounds "
            f"released, {priv['rounds_abandoned']} abandoned."
        )
        if priv.get("note_sampling"):  # what the ε holds against; no amplification by sampling claimed
            console.print(f"{priv['note_sampling']}.")
    console.print(
        f"wall time {summary['wall_time_s']:.1f} s, {summary['seconds_per_round']:.2f} s/round "
        f"({summary['threads']} threads, {summary['device']})"
    )
    if summary["left"]:
        for x in summary["left"]:
            console.print(
                f"client {x['client']} left the protocol before round {x['round']}: "
                f"{x.get('reason', 'budget spent')}"
            )
    if summary["rejected_messages"]:
        console.print(
            f"[yellow]{len(summary['rejected_messages'])} received models rejected[/] (see summary.json)"
        )


def _print_site_ledgers(summary: dict) -> None:
    """One line per site that keeps a lifetime budget: its whole ledger (every run, every protocol) composed
    by its one accountant, ε per threat with the parties it holds against."""
    for a in summary.get("accounting", []):
        led = a.get("site_ledger") if isinstance(a, dict) else None
        if not led or not led.get("lifetime"):
            continue
        figures = "; ".join(
            f"{'no guarantee' if e is None else f'ε {e:.3f}'} against {led['against'][t]}"
            for t, e in led["epsilon"].items()
            if t != "colluders" or led.get("colluders")
        )
        console.print(
            f"client {a.get('client')}'s whole ledger (its one accountant, every run and protocol, unit "
            f"{led.get('unit')}) at δ={led['delta']:g}: {figures}; lifetime ε {led['lifetime'][0]:g}"
        )


def _f(v, nd: int = 4) -> str:
    return "—" if v is None else f"{v:.{nd}f}"


def _ms(d: dict, nd: int = 4) -> str:
    return "—" if d["mean"] is None else f"{d['mean']:.{nd}f}±{d['std']:.{nd}f}"


@config_command(app, exclude=("out",))
def tune(
    grid: list[str] = typer.Option(
        [],
        "--grid",
        help="KEY=V1,V2,… (e.g. lr=0.001,0.003, rounds=10,30, batch_size="
        "100,250, clip=0.5,1, dml_alpha=0,0.5, sample_rate=0.25,0.5, momentum=0,0.9, "
        "local_steps=1,4, features=none,scatter); repeatable; every combination is a "
        "trial.",
    ),
    config: Path | None = typer.Option(None, "--config", help="YAML with the base run options."),
    out: str = typer.Option(
        "runs/tune", rich_help_panel=OUTPUT, help="Folder for the trials, tune.json/tune.md and best.yaml."
    ),
    set_: list[str] = typer.Option([], "--set", help="Any other run option, KEY=VALUE; repeatable."),
    quiet: bool = typer.Option(
        True, "--quiet/--progress", rich_help_panel=OUTPUT, help="Progress bar per trial."
    ),
    random_trials: str | None = typer.Option(
        None,
        "--random-trials",
        help="Instead of every grid combination, "
        "K random trials, K ~ poisson:MU | negbin:ETA,GAMMA | geometric:GAMMA | "
        "logarithmic:GAMMA, each with settings drawn from the grid; only the best "
        "is kept, its ε bounded by Papernot & Steinke (ICLR 2022).",
    ),
    max_trials: int | None = typer.Option(
        None,
        "--max-trials",
        help="With --random-trials: run at most this many "
        "(the cut-off chance is paid in δ). Default: the smallest cap that costs "
        "at most 0.1% of δ.",
    ),
    site_folder: list[str] = typer.Option(
        [],
        "--site-folder",
        help="A site's folder (silofl site init), one per site in the order of its table; repeatable. "
        "Each site's ledger is charged the tuning, checked against its policy and lifetime budget, before "
        "the first trial.",
    ),
):
    """Search settings for a budget (--target-epsilon, required) on the validation split (training data no
    client holds, as public data; per-site tables: each site's own validation rows) — never the test set;
    write the best config to OUT/best.yaml and the tuning-inclusive ε to tune.json."""
    from silofl import api
    from silofl.runner.config import RunConfig

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    cfg = RunConfig.from_dict(run_options(config, set_, eval_split="validation"))
    res = api.tune(
        cfg,
        grid,
        out=out,
        random_trials=random_trials,
        max_trials=max_trials,
        quiet=quiet,
        console=console,
        site_folders=site_folder or None,
    )
    result = res.result
    b = result["best"]
    c = result["tuning_cost"]
    rt = result.get("random_trials")
    if b is None:
        console.print(
            f"K = 0 trials drawn from {rt['distribution']}: nothing ran, nothing chosen (no best.yaml); "
            f"see {out}/tune.md"
        )
    else:
        console.print(
            f"best on validation: {b['settings']} ({result['selection']} {b['validation']:.4f}) → "
            f"{out}/best.yaml, as a recipe: silofl run {out}/recipe.yaml --out DIR"
        )
    if rt is not None:
        console.print(
            f"{rt['drawn']} random trials (K ~ {rt['distribution']}, E[K] = {rt['mean']:.3g}, at most "
            f"{rt['max_trials']}): best trial only, Papernot–Steinke ε ≤ {rt['max']:.3f} (one trial "
            f"ε ≤ {rt['one_trial_max']:.3f}) at δ = {rt['delta']:g}"
        )
    if c["max"] is not None:
        console.print(
            f"each run: ε ≤ {cfg.target_epsilon:g}; tuning-inclusive (all {c['trials']} trials composed): "
            f"ε ≤ {c['max']:.3f} at δ = {c['delta']:g}"
        )
    for name, led in result.get("site_ledgers", {}).items():
        rep = led["site_ledger"]
        eps, who = rep["epsilon"]["colluders"], rep["against"]["colluders"]
        console.print(
            f"site {name}: tuning charged to its ledger (entry {', '.join(map(str, led['charged']))}); "
            f"its whole ledger: ε {'∞' if eps is None else f'{eps:.3f}'} against {who} at δ = "
            f"{rep['delta']:g} (lifetime ε {rep['lifetime'][0]:g})"
        )


@config_command(app, exclude=("method", "seed", "out"))
def compare(
    config: Path | None = typer.Option(
        None,
        "--config",
        help="YAML with compare options (methods, seeds, preset, variants, jobs, comm_clients, out) and run "
        "options under 'run:'.",
    ),
    methods: str | None = typer.Option(
        None,
        help="Comma-separated, e.g. proxyfl,fedavg,fml,avgpush,cwt,regular,joint; 'regular:nodp' runs a "
        "method without DP.",
    ),
    seeds: str | None = typer.Option(None, help="Comma-separated seeds, e.g. 0,1,2."),
    preset: str | None = typer.Option(
        None, help="Ablation: none | noniid | hetero | dp | batch | alpha | privacy-mode"
    ),
    out: str | None = typer.Option(
        None, rich_help_panel=OUTPUT, help="Report folder (runs go under OUT/runs/)."
    ),
    jobs: int | None = typer.Option(
        None,
        rich_help_panel=ENGINE,
        help="Runs in parallel processes (one torch thread each unless --threads).",
    ),
    resume: bool = typer.Option(
        False,
        "--resume",
        rich_help_panel=OUTPUT,
        help="Skip runs whose folder already holds a finished run of the same config.",
    ),
    report_only: bool = typer.Option(
        False,
        "--report-only",
        rich_help_panel=OUTPUT,
        help="Write the report from the runs already finished; run nothing.",
    ),
    comm_clients: str | None = typer.Option(
        None, "--comm-clients", help="Also measure bytes per round at these K, e.g. 2,4,8,16,32,64."
    ),
    set_: list[str] = typer.Option(
        [], "--set", help="Any other run option, KEY=VALUE (YAML value); repeatable."
    ),
    quiet: bool = typer.Option(False, "--quiet", rich_help_panel=OUTPUT, help="No progress bar."),
):
    """Run methods × variants × seeds and write a report (report.md, results.csv/json, plots); every run
    option below applies to every run (where its method has it)."""
    from silofl import api
    from silofl.cli.config_options import config_flags, parse_sets
    from silofl.experiments.compare import CompareConfig

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    cc = CompareConfig.from_yaml(config) if config else CompareConfig()
    res = api.compare(
        cc,
        methods=[m.strip() for m in methods.split(",") if m.strip()] if methods is not None else None,
        seeds=[int(x) for x in _number_list(seeds, "--seeds")] if seeds is not None else None,
        comm_clients=[int(x) for x in _number_list(comm_clients, "--comm-clients")]
        if comm_clients is not None
        else None,
        preset=preset,
        out=out,
        jobs=jobs,
        resume=resume,
        report_only=report_only,
        run={**parse_sets(set_), **config_flags()},
        quiet=quiet,
        console=console,
    )
    from silofl.report.comparison import markdown_table

    if res.rows:
        console.print(markdown_table(res.rows), markup=False, highlight=False)
    console.print(f"report: {res.markdown}")
    if res.failed:
        err_console.print(
            f"[red]{len(res.failed)} run(s) failed[/]: " + ", ".join(f["run"] for f in res.failed)
        )
        raise typer.Exit(1)


@app.command()
@friendly_errors
def evaluate(
    run_dir: Path = typer.Argument(..., help="A run folder written by `silofl run`."),
    data_dir: str | None = typer.Option(None, "--data-dir"),
):
    """Reload a run's saved models and recompute their test accuracy (and AUROC, balanced accuracy, F1,
    ECE)."""
    from silofl.experiments.evaluate import evaluate_run

    results = evaluate_run(run_dir, data_dir=data_dir)
    t = Table(title=f"evaluate {run_dir}")
    if results and all(r.get("metrics", {}).get("c_index") is not None for r in results):
        # a survival run (silofl.training.survival): the C-index, no accuracy
        for col in ("model", "architecture", "test C-index", "in summary"):
            t.add_column(col, justify="right")
        for r in results:
            t.add_row(r["model"], r["architecture"], _f(r["metrics"]["c_index"]), _f(r["recorded"]))
        console.print(t)
        (Path(run_dir) / "evaluation.json").write_text(json.dumps(results, indent=2) + "\n")
        return
    for col in ("model", "architecture", "test accuracy", "in summary", "AUROC", "balanced acc", "F1", "ECE"):
        t.add_column(col, justify="right")
    for r in results:
        m = r.get("metrics", {})
        t.add_row(
            r["model"],
            r["architecture"],
            f"{r['accuracy']:.4f}",
            _f(r["recorded"]),
            *(_f(m.get(k)) for k in ("auroc", "balanced_accuracy", "f1", "ece")),
        )
    console.print(t)
    (Path(run_dir) / "evaluation.json").write_text(json.dumps(results, indent=2) + "\n")


@app.command()
@friendly_errors
def predict(
    run_dir: Path = typer.Argument(..., help="A run folder (models/ inside) or a site's folder of models."),
    client: int = typer.Option(
        ..., "--client", help="Whose model: client K (its site's preprocessing comes with it)."
    ),
    data: Path = typer.Option(
        ...,
        "--data",
        help="New rows (.csv/.parquet, checked against the schema; the target "
        "column is optional) or a folder of images (class sub-folders optional).",
    ),
    out: Path = typer.Option(
        ..., "--out", help="CSV to write: id, prediction, p_<class> per class[, label]."
    ),
    model: str = typer.Option(
        "private",
        "--model",
        help="private (the site's own model) | shared (its proxy or "
        "global model) | combined (both fused: runs with --combine; non-private).",
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace --out if it exists."),
):
    """Predict with client K's model on new data, with exactly the preprocessing its site trained with."""
    from silofl import api

    res = api.predict(run_dir, client, data, out, model=model, overwrite=overwrite)
    acc = (
        f"; accuracy {res['accuracy']:.4f} against the labels in the data"
        if res["accuracy"] is not None
        else ""
    )
    if res.get("masks"):  # a segmentation model: one mask per input (silofl.inference.predict.predict_masks)
        acc = (
            f"; pixel accuracy {res['accuracy']:.4f}, Dice {res['dice']:.4f}, IoU {res['iou']:.4f} against "
            "the masks in the data"
            if res["dice"] is not None
            else ""
        )
    if "c_index" in res:  # a survival model: one risk score per row (silofl.inference.predict.predict_risk)
        acc = (
            f"; C-index {res['c_index']:.4f} against the times and events in the data"
            if res["c_index"] is not None
            else ""
        )
    nan = (
        f"; [yellow]{res['nan_rows']} rows have missing values the schema does not impute (probabilities "
        f"NaN)[/]"
        if res["nan_rows"]
        else ""
    )
    console.print(
        f"{res['rows']} predictions by {res['model']} ({res['architecture']}) → {res['out']}{acc}{nan}"
    )


@app.command()
@friendly_errors
def export(
    run_dir: Path = typer.Argument(..., help="A run folder (models/ inside) or a site's folder of models."),
    client: int = typer.Option(..., "--client", help="Whose model: client K."),
    out: Path = typer.Option(
        ..., "--out", help="Folder to write model.onnx, preprocessing.json, model_card.json/.md."
    ),
    fmt: str = typer.Option("onnx", "--format", help="onnx"),
    model: str = typer.Option(
        "private",
        "--model",
        help="private | shared (the proxy or global model) | combined (runs with --combine; non-private).",
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Write into a non-empty --out."),
):
    """Export client K's model to ONNX (its preprocessing inside the graph) with a model card (JSON +
    Markdown)."""
    from silofl import api

    card = api.export(run_dir, client, out, model=model, format=fmt, overwrite=overwrite)
    console.print(
        f"exported client {client}'s {card['model']['role']} model ({card['model']['architecture']}) → "
        f"{out}/model.onnx, preprocessing.json, model_card.json, model_card.md"
    )
    console.print(f"privacy: {card['privacy']['statement']}", markup=False, highlight=False)


@config_command(app, exclude=("out", "seed"))
def audit(
    out: str = typer.Option(
        ...,
        "--out",
        rich_help_panel=OUTPUT,
        help="Audit folder to write (audit.json, audit.md, "
        "attacks.csv, canary_scores.csv, split.json, audit.png; the audited run in OUT/run).",
    ),
    canaries: int = typer.Option(
        1000,
        "--canaries",
        help="m: canaries, each included with probability ½ (examples at "
        "the audited site; clients for client-level methods; rows of a published model).",
    ),
    canary_kind: str = typer.Option(
        "mislabelled",
        "--canary-kind",
        help="Example canaries: mislabelled (pool "
        "examples with a wrong label) | noise (out-of-distribution inputs, random labels); white-box "
        "gradient canaries inside the DP step (example-level DP-SGD): dirac | random.",
    ),
    canary_placement: str = typer.Option(
        "quiet",
        "--canary-placement",
        help="Gradient canaries' coordinates: quiet (where real gradients on public data — training rows "
        "no client holds — are smallest at the initial model) | random (anywhere on the largest tensor).",
    ),
    audited_site: int = typer.Option(
        0, "--audited-site", help="The client whose data (or whose peers) get the canaries."
    ),
    reference_models: int = typer.Option(
        4,
        "--reference-models",
        help="Reference models per attacked model "
        "(LiRA/RMIA offline), trained on data disjoint from every candidate.",
    ),
    nonmembers: int | None = typer.Option(
        None,
        "--nonmembers",
        help="Non-members of the attack (default: as many as the audited site's examples).",
    ),
    confidence: float = typer.Option(0.95, "--confidence", help="Confidence of the ε lower bound."),
    pubsub_model: str | None = typer.Option(
        None,
        "--pubsub-model",
        help="Audit a PubSub-ML published model instead of a run: dp-nn | dp-logreg | dp-nb | dp-forest.",
    ),
    epsilon: float | None = typer.Option(None, "--epsilon", help="The published model's ε (--pubsub-model)."),
    epochs: int = typer.Option(20, "--epochs", help="dp-nn training epochs (--pubsub-model)."),
    attack: list[str] = typer.Option(
        [],
        "--attack",
        help="A further attack to run, repeatable: inversion (client-level methods on images: the server "
        "reconstructs a hospital's images from its clipped update, with and without the noise; SSIM/PSNR, "
        "inversion.png).",
    ),
    inversion_images: int = typer.Option(
        1, "--inversion-images", help="--attack inversion: images of the attacked sub-client (1 or a few)."
    ),
    inversion_round: int = typer.Option(
        1, "--inversion-round", help="--attack inversion: the round whose update the server inverts."
    ),
    inversion_iterations: int = typer.Option(
        1500, "--inversion-iterations", help="--attack inversion: optimisation steps per restart."
    ),
    seed: int | None = typer.Option(
        None,
        rich_help_panel="Privacy",
        help="A reproducible research audit: the "
        "canaries, their coins, the reference models and the run's noise and sampling "
        "derive from this seed (the run's ε then holds only while it stays secret). "
        "Default: secret randomness, as in any run.",
    ),
    config: Path | None = typer.Option(None, "--config", help="YAML file with the audited run's options."),
    set_: list[str] = typer.Option(
        [], "--set", help="Any other run option, KEY=VALUE (YAML value); repeatable."
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", rich_help_panel=OUTPUT, help="Replace the audit already in OUT."
    ),
    quiet: bool = typer.Option(False, "--quiet", rich_help_panel=OUTPUT, help="No progress bar."),
    engine: str = typer.Option(
        "simulator",
        "--engine",
        rich_help_panel=ENGINE,
        help="Where the audited run runs: simulator | flower-local (a Flower deployment on this machine, "
        "gradient canaries; the audited site arms and scores itself). torch.distributed: "
        "silofl launch … audit.",
    ),
    peer_timeout: float = typer.Option(
        300.0, "--peer-timeout", help="Seconds to wait for a peer's message (silofl launch)."
    ),
):
    """Measure what a run leaks: canaries → a one-run empirical ε lower bound next to the accountant's ε, and
    membership inference on real examples (silofl.auditing). The run options below set the audited run
    (--eval-every defaults to the last round only). Over torch.distributed: `silofl launch --nproc-per-node N
    audit …` (gradient canaries of an example-level method; the audited site on process 0)."""
    _audit(SimpleNamespace(**locals()))  # the options above, by name


def _audit(o: SimpleNamespace) -> None:
    """``silofl audit`` from its options ``o``: the audited run's config and the audit's settings, then the
    audit (in this process, or as this process's part of ``silofl launch … audit``)."""
    import shlex

    from silofl import api
    from silofl.auditing import AuditSettings
    from silofl.runner.config import RunConfig

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    merged = run_options(o.config, o.set_)
    if "eval_every" not in merged:
        merged["eval_every"] = int(merged.get("rounds", RunConfig.rounds))
    if str(merged.get("features") or "none") != "none":
        raise ConfigError(
            "silofl audit does not take a feature stage yet: its canaries are drawn from the raw inputs"
        )
    cfg = RunConfig.from_dict(merged)
    settings = AuditSettings(
        canaries=o.canaries,
        canary_kind=o.canary_kind,
        canary_placement=o.canary_placement,
        site=o.audited_site,
        reference_models=o.reference_models,
        nonmembers=o.nonmembers,
        confidence=o.confidence,
        seed=o.seed if o.seed is not None else cfg.seed,  # --seed, else a seed in --config / --set
        pubsub_model=o.pubsub_model,
        epsilon=o.epsilon,
        pubsub_epochs=o.epochs,
        attacks=tuple(o.attack),
        inversion_images=o.inversion_images,
        inversion_round=o.inversion_round,
        inversion_iterations=o.inversion_iterations,
    )
    what = f"published {o.pubsub_model}" if o.pubsub_model else f"{cfg.method} ({cfg.resolve().privacy})"
    how = (
        f"seed {settings.seed} (seeded research run: the run's ε holds only while the seed stays secret)"
        if settings.seeded
        else "secret randomness (not reproducible; --seed for a research audit)"
    )
    launching = _launching()
    if launching is None or launching["check"]:
        console.print(
            f"[bold]silofl audit[/] {what} on {cfg.dataset}: {o.canaries} canaries, {how} → {o.out}"
        )
    if launching is not None:  # `silofl launch … audit`: its processes' entry, from these options
        _launch_audit(cfg, settings, o.out, o.engine, o.peer_timeout, o.overwrite, o.quiet, launching)
        return
    command = "silofl " + shlex.join(sys.argv[1:]) if sys.argv[1:2] == ["audit"] else None
    a = api.audit(
        cfg,
        out=o.out,
        settings=settings,
        overwrite=o.overwrite,
        quiet=o.quiet,
        console=console,
        command=command,
        engine=o.engine,
    ).audit
    print_audit(a, o.out)


def _launch_audit(
    cfg, settings, out: str, engine: str, peer_timeout: float, overwrite: bool, quiet: bool, launching: dict
) -> None:
    """Fill ``launching`` with the entry of a launched audit's processes, its options checked once here."""
    from silofl.auditing import check_engine, report
    from silofl.auditing.entry import audit_entry
    from silofl.auditing.example import run_config
    from silofl.runner.entry import PRELOAD, RankOptions, check_launched_processes

    if engine != "simulator":
        raise ConfigError("silofl launch … audit runs over torch.distributed: leave out --engine")
    check_seconds("--peer-timeout", peer_timeout)
    settings.validate()
    if launching["check"]:
        check_engine(cfg, settings, launching["processes"])
        report.check_out(Path(out), overwrite)  # before any process waits for another
        check_launched_processes(launching["processes"], cfg.clients)
        run_config(cfg, settings, Path(out)).resolve()
    opts = RankOptions(peer_timeout_s=peer_timeout, overwrite=overwrite, quiet=quiet)
    launching.update(
        entry=audit_entry(cfg, settings, out, opts, launching["command"]),
        preload=PRELOAD,
        result=Path(out) / "audit.json",
        report=lambda a: print_audit(a, out),
    )


def print_audit(a: dict, out: str) -> None:
    """The audit's figures (audit.json's content ``a``), a line each, and where its report is."""
    b = a["bound"]
    eps_acc = "—" if a["epsilon_accountant"] is None else f"{a['epsilon_accountant']:.3f}"
    label = (
        ""
        if a["epsilon_accountant"] is None
        else " (NOT a formal guarantee in this mode)"
        if not a["formal_guarantee"]
        else " (seeded research run: formal only while the seed is secret)"
        if a.get("seeded")
        else ""
    )
    console.print(
        f"empirical ε lower bound {a['epsilon_lower_bound']:.3f} ({a['confidence']:.0%} confidence, "
        f"δ={a['delta']:g}; {b['correct']}/{b['guesses']} guesses right on score '{b['score']}', "
        f"at most {b['max_auditable_epsilon']:.2f} measurable) · accountant ε {eps_acc}{label}"
    )
    if a.get("epsilon_gauss") is not None or "bounds" in a:
        console.print(
            f"threat model {a['threat_model']}; Gaussian-pair estimate ε "
            f"{'> 700' if a.get('epsilon_gauss_unbounded') else format(a.get('epsilon_gauss') or 0, '.3f')} "
            "(an estimate, not a guarantee)",
            markup=False,
            highlight=False,
        )
    for target, t in a["membership_inference"]["targets"].items():
        figs = ", ".join(
            f"{k} AUC {f['auc']:.3f} TPR@1% {f['tpr_at_1%_fpr']:.3f}" for k, f in t["attacks"].items()
        )
        console.print(f"membership inference on {target} ({t['model']}): {figs}")
    if a.get("attacks_run"):
        from silofl.auditing.settings import AUDIT_ATTACKS

        for name in a["attacks_run"]:
            console.print(AUDIT_ATTACKS.get(name).summary(a[name]), markup=False, highlight=False)
    console.print(f"report: {Path(out) / 'audit.md'}")


from silofl.cli.deploy import deploy_app, site_app  # noqa: E402 - the subcommand groups register after the commands
from silofl.cli.pubsub import app as pubsub_app  # noqa: E402

app.add_typer(pubsub_app, name="pubsub")
app.add_typer(site_app, name="site")
app.add_typer(deploy_app, name="deploy")
from silofl.cli.backbone import backbone_app  # noqa: E402

app.add_typer(backbone_app, name="backbone")
from silofl.cli.schema import schema_app  # noqa: E402

app.add_typer(schema_app, name="schema")


def main() -> None:  # pragma: no cover
    """The ``silofl`` console entry point."""
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
