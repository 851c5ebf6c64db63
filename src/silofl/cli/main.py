"""``silofl`` command line: ``run``, ``launch``, ``tune``, ``compare``, ``evaluate``, ``predict``, ``export``, ``audit``
and the ``pubsub``, ``site`` and ``deploy`` groups.

Flags override values from ``--config FILE.yaml``, which override the defaults. Errors a user can
fix are printed as one line (exit code 2), never as a traceback.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from silofl.cli.common import check_seconds, err_console, friendly_errors, hold
from silofl.core.errors import ConfigError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="silofl: cross-silo learning with measured privacy.")
console = Console()


def _method_help() -> str:
    from silofl.fl.registry import methods

    return " | ".join(methods())


@app.command()
@friendly_errors
def run(
    config: Path | None = typer.Option(None, "--config", help="YAML file with any run options (a method's own under its name)."),
    method: str | None = typer.Option(None, help=f"{_method_help()}"),
    dataset: str | None = typer.Option(None, help="fashion-mnist | mnist | cifar10 | digits | npz | folder | bags | table"),
    data_dir: str | None = typer.Option(None, "--data-dir", help="Folder (or .npz file) with the data set files."),
    site_data: str | None = typer.Option(None, "--site-data", help="One source per site, comma-separated: table files "
                                         "(.csv/.parquet, --dataset table) or image folders (--dataset folder)."),
    schema: str | None = typer.Option(None, "--schema", help="--dataset table: the collaboration's schema (YAML/JSON)."),
    test_data: str | None = typer.Option(None, "--test-data", help="With --site-data: a shared external test file or "
                                         "folder (default: the union of the sites' held-out rows)."),
    test_fraction: float | None = typer.Option(None, "--test-fraction", help="With --site-data: each site's internal "
                                               "test share of its own rows (default 0.2)."),
    clients: int | None = typer.Option(None, help="Number of clients K."),
    rounds: int | None = typer.Option(None, help="Number of rounds R."),
    seed: int | None = typer.Option(None, help="A reproducible research run: every party's randomness derives from this seed "
                                    "(the guarantee then holds only while it stays secret). Default: secret randomness."),
    out: str | None = typer.Option(None, help="Run folder to write."),
    privacy: str | None = typer.Option(None, help="strict (β=0, formal DP) | paper (α=β=0.5, ε not a formal guarantee) | off"),
    device: str | None = typer.Option(None, help="auto | cpu | cuda"),
    threads: int | None = typer.Option(None, help="torch threads (default: torch's choice)."),
    private_model: str | None = typer.Option(None, "--private-model", help="mlp | tabmlp | logreg | linear | scattercnn | lenet5 | cnn1 | cnn2 | vgg | resnet18 | deepset"),
    proxy_model: str | None = typer.Option(None, "--proxy-model", help="mlp | tabmlp | logreg | linear | scattercnn | lenet5 | cnn1 | cnn2 | vgg | resnet18 | deepset"),
    partition: str | None = typer.Option(None, help="p_major | iid | dirichlet | site"),
    p_major: float | None = typer.Option(None, "--p-major", help="Fraction of a client's data from its major class."),
    dirichlet_alpha: float | None = typer.Option(None, "--dirichlet-alpha"),
    samples_per_client: int | None = typer.Option(None, "--samples-per-client", help="Default: min(1000, training examples / clients)."),
    batch_size: int | None = typer.Option(None, "--batch-size", help="Expected Poisson batch size B (q = B/n); default n/4, at most 250."),
    lr: float | None = typer.Option(None),
    noise_multiplier: float | None = typer.Option(None, "--noise-multiplier", help="σ"),
    clip: str | None = typer.Option(None, help="Clipping norm C (per example; per client update for client-level "
                                    "methods), or 'adaptive' / 'adaptive:C0' (client-level: private quantile estimate, start C0)."),
    delta: float | None = typer.Option(None, help="δ (must be < 1/n)."),
    accountant: str | None = typer.Option(None, help="rdp | prv"),
    target_epsilon: float | None = typer.Option(None, "--target-epsilon", help="Budget ε per site (per unit for client-level methods): σ is set so that --rounds end at it (budget-first); with "
                                          "--noise-multiplier also given, σ stays as given and a client leaves before exceeding it."),
    target_epsilons: str | None = typer.Option(None, "--target-epsilons", help="One budget per client, comma-separated (e.g. 20,50,80)."),
    dml_alpha: float | None = typer.Option(None, "--dml-alpha", help="α, private model's KL weight."),
    dml_beta: float | None = typer.Option(None, "--dml-beta", help="β, proxy's KL weight (0 in strict mode)."),
    graph: str | None = typer.Option(None, help="exponential | ring"),
    self_weight: float | None = typer.Option(None, "--self-weight", help="PushSum self weight (0: replace)."),
    aggregation: str | None = typer.Option(None, help="FedAvg/FML server weights: size | uniform"),
    optimizer_state: str | None = typer.Option(None, "--optimizer-state", help="keep | reset Adam moments on proxy replacement"),
    dp_backend: str | None = typer.Option(None, "--dp-backend", help="auto | ghost | vmap"),
    privacy_unit: str | None = typer.Option(None, "--privacy-unit", help="Client-level DP: hospital | subclient."),
    intermediaries: str | None = typer.Option(None, help="Client-level DP: sub-clients per client: none | V | adaptive."),
    client_rate: float | None = typer.Option(None, "--client-rate", help="Client-level DP: Poisson rate of clients per round."),
    server_lr: float | None = typer.Option(None, "--server-lr", help="Client-level DP: server learning rate; "
                                           "FedAvg/FML: step on the average of the sites' DP models (default 1)."),
    local_epochs: int | None = typer.Option(None, "--local-epochs", help="Client-level DP: local SGD epochs."),
    local_lr: float | None = typer.Option(None, "--local-lr", help="Client-level DP: local SGD learning rate."),
    optimizer: str | None = typer.Option(None, "--optimizer", help="DP-SGD methods: the DP model's optimizer, "
                                         "adam (default) | sgd."),
    momentum: float | None = typer.Option(None, "--momentum", help="--optimizer sgd: momentum (default 0)."),
    nesterov: bool | None = typer.Option(None, "--nesterov/--no-nesterov", help="--optimizer sgd: Nesterov momentum."),
    ema_decay: float | None = typer.Option(None, "--ema-decay", help="DP-SGD methods: evaluate and save an EMA of the "
                                           "DP model's round-end weights with this decay (default 0: off)."),
    augmult: int | None = typer.Option(None, "--augmult", help="DP-SGD methods, images: K augmented views per sampled "
                                       "example, averaged before clipping (default 0: off)."),
    aug_pad: int | None = typer.Option(None, "--aug-pad", help="--augmult: random-crop padding in pixels (default 4)."),
    aug_flip: bool | None = typer.Option(None, "--aug-flip/--no-aug-flip", help="--augmult: random horizontal flips."),
    sample_rate: float | None = typer.Option(None, "--sample-rate", help="DP-SGD methods: Poisson rate q per step, "
                                             "up to 1 (default: batch size / n)."),
    local_steps: int | None = typer.Option(None, "--local-steps", help="DP-SGD methods: DP steps per round "
                                           "(default: one epoch)."),
    server_momentum: float | None = typer.Option(None, "--server-momentum", help="FedAvg/FML: server momentum on the "
                                                 "average of the sites' DP models (default 0)."),
    mu: float | None = typer.Option(None, "--mu", help="FedProx: the proximal weight μ of μ/2·‖w − w_global‖² "
                                    "(default 0.01; 0: FedAvg)."),
    ditto_lambda: float | None = typer.Option(None, "--ditto-lambda", help="Ditto: the personal model's pull λ "
                                              "towards the received global model (default 0.1)."),
    mrmtl_lambda: float | None = typer.Option(None, "--mrmtl-lambda", help="MR-MTL: each site's pull λ towards the "
                                              "mean of the sites' DP models (default 0.1)."),
    private_lr: float | None = typer.Option(None, "--private-lr", help="DP-SGD methods: the non-DP models' Adam "
                                            "learning rate (a private model, --combine's own model, --vs-alone; "
                                            "default: --lr)."),
    report_nonprivate: bool | None = typer.Option(None, "--report-nonprivate/--keep-nonprivate", help="Whether sites "
                                                  "report figures of non-private data (the private model's accuracy, "
                                                  "gradient norms). Default: yes in one process, no across processes."),
    combine: str | None = typer.Option(None, "--combine", help="Combination at inference (no budget): each site fuses "
                                       "its own non-DP model with the DP model(s) it holds on rows held out from its own "
                                       "training rows: none (default) | weights | stack. Reported as combined_acc "
                                       "(non-private); saved for predict/export --model combined."),
    combine_holdout: float | None = typer.Option(None, "--combine-holdout", help="With --combine: the share of each "
                                                 "site's training rows held out for its combiner (default 0.2; no "
                                                 "model trains on them)."),
    eval_every: int | None = typer.Option(None, "--eval-every", help="Evaluate every N rounds (and at the last)."),
    test_limit: int | None = typer.Option(None, "--test-limit", help="Evaluate on the first N test examples only."),
    checkpoint_every: int | None = typer.Option(None, "--checkpoint-every",
                                                help="Save every party's state to OUT/checkpoint every N rounds."),
    resume: bool = typer.Option(False, "--resume", help="Continue OUT from its latest checkpoint (same options; "
                                "--rounds may grow). The privacy spend carries on."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the run already in OUT (refused otherwise)."),
    distributed: bool = typer.Option(False, "--distributed", hidden=True,
                                     help="Run as one process of a `silofl launch` (torchrun) group."),
    peer_timeout: float = typer.Option(300.0, "--peer-timeout", help="Seconds to wait for a peer's message "
                                       "(multi-process runs)."),
    set_: list[str] = typer.Option([], "--set", help="Any other option, KEY=VALUE (YAML value); repeatable."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
    engine: str = typer.Option("simulator", "--engine", hidden=True, help="simulator | flower-local (silofl deploy local)"),
    deploy_timeout: float = typer.Option(900.0, "--deploy-timeout", hidden=True),
    insecure: bool = typer.Option(False, "--insecure", hidden=True),
    restart_sites: bool = typer.Option(False, "--restart-sites", hidden=True),
    deployment: Path | None = typer.Option(None, "--deployment", hidden=True),
    superlink: str | None = typer.Option(None, "--superlink", hidden=True),
    vs_alone: bool = typer.Option(False, "--vs-alone", help="Afterwards train each site alone without DP (Regular, "
                                  "same split and rounds) into OUT/alone and print how this run compares."),
    features: str | None = typer.Option(None, "--features", help="Site-side feature stage before the models: none | "
                                        "scatter (kymatio ScatterNet + GroupNorm; --set scatter_j=J) | backbone:DIR (a "
                                        "frozen network trained on declared-public data). No budget: see docs/threat_model.md."),
    metric: str | None = typer.Option(None, "--metric", help="The headline figure of the summary and --vs-alone: "
                                      "accuracy (default) | auroc | balanced_accuracy | f1 | ece. All are computed and "
                                      "written to metrics.jsonl and summary.json."),
):
    """Run a method and write a run folder (config.yaml, metrics.jsonl, summary.json, plots, models/)."""
    from silofl.run.config import RunConfig, load_yaml_mapping
    from silofl.run.loop import run as run_loop

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    flags = {k: v for k, v in locals().items() if v is not None and k not in (
        "config", "quiet", "run_loop", "RunConfig", "load_yaml_mapping", "set_", "resume", "overwrite", "distributed",
        "peer_timeout", "engine", "deploy_timeout", "insecure", "deployment", "superlink", "restart_sites", "vs_alone")}
    if target_epsilons is not None:
        flags["target_epsilons"] = _number_list(target_epsilons, "--target-epsilons")
    if clip is not None:
        flags.update(_parse_clip(clip))
    flags = {k: v for k, v in flags.items() if v is not None}
    if engine == "flower":  # silofl deploy start: each site reads its own data (its site.json), the coordinator none
        flags["data_at_sites"] = True
    check_seconds("--peer-timeout", peer_timeout)
    check_seconds("--deploy-timeout", deploy_timeout)
    base = load_yaml_mapping(config) if config else {}
    cfg = RunConfig.from_dict(_over_config(base, {**_parse_sets(set_), **flags}))
    resolved = cfg.resolve()
    if distributed:
        from silofl.comm.torchdist import init_from_env

        init_from_env(timeout_s=peer_timeout)
        if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0" and resolved.checkpoint_every:
            resume = True  # torchrun restarted the group after a failure: every process resumes together
        if _serve_if_worker(resolved, peer_timeout):
            return
    from silofl.run.folder import OutLock

    hold(OutLock(resolved.out))  # one run at a time into OUT, until this command ends (the OS drops it on a crash)
    requested = cfg.privacy
    head = f"[bold]silofl run[/] {resolved.method} on {resolved.dataset}: {resolved.clients} clients, {resolved.rounds} rounds, "
    o = resolved.options
    if resolved.is_client_level:
        clip_txt = f"adaptive from {resolved.clip:g}" if o.adaptive_clip else f"{resolved.clip:g}"
        console.print(head + f"model {o.proxy_model}, privacy [bold]{resolved.privacy}[/] per "
                      f"{o.privacy_unit} (z={resolved.noise_multiplier:g}, clip {clip_txt}, intermediaries "
                      f"{o.intermediaries}) → {resolved.out}")
    else:
        models = [f"{role} {getattr(o, f)}" for role, f in (("private", "private_model"), ("proxy", "proxy_model"))
                  if hasattr(o, f)]
        dml = f" (α={o.dml_alpha}, β={o.dml_beta})" if resolved.info.mutual_learning else ""
        console.print(head + f"{' / '.join(models)}, privacy [bold]{resolved.privacy}[/]{dml} → {resolved.out}")
    if resolved.seed is not None and resolved.is_private:
        console.print(f"[bold yellow]seed {resolved.seed}:[/] a seeded research run — noise and sampling come from the "
                      "seed, so the privacy guarantee holds only while the seed stays secret")
    if requested != resolved.privacy and not resolved.info.traits.nonprivate:
        console.print(f"note: privacy {requested!r} concerns mutual learning only; {resolved.method} runs in "
                      f"{resolved.privacy!r} mode")
    if engine == "flower-local":
        from silofl.deploy.local import deploy_local

        if resume or overwrite:
            raise ConfigError("silofl deploy local starts a fresh deployment: --resume and --overwrite do not apply")
        console.print(f"deploying on this machine: a SuperLink and {resolved.clients} sites as separate processes, "
                      + ("[bold red]INSECURE: no TLS, no node authentication[/]" if insecure else
                         "TLS, SuperNode authentication, payloads between sites sealed end to end"))
        print_summary(deploy_local(resolved, Path(resolved.out), timeout_s=deploy_timeout, insecure=insecure,
                                   progress=not quiet, call_timeout_s=peer_timeout, restart_sites=restart_sites))
        return
    if engine == "flower":
        from silofl.deploy.local import run_deployment

        print_summary(run_deployment(resolved, deployment, superlink, timeout_s=deploy_timeout, progress=not quiet,
                                     call_timeout_s=peer_timeout))
        return
    if engine != "simulator":
        raise ConfigError(f"unknown engine {engine!r}")
    engine_factory = None
    if distributed:
        from silofl.comm.torchdist import TorchDistEngine

        def engine_factory(make_site, n_sites):
            return TorchDistEngine(make_site, n_sites, timeout_s=peer_timeout)
    try:
        summary = run_loop(resolved, progress=not quiet, console=console, resume=resume,
                           engine_factory=engine_factory, overwrite=overwrite)
    finally:
        if distributed:
            from silofl.comm.torchdist import shutdown

            shutdown()
    print_summary(summary)
    if vs_alone and not distributed:
        from silofl.run.alone import compare_with_alone

        compare_with_alone(resolved, summary, console)


def _serve_if_worker(cfg, peer_timeout: float) -> bool:
    """On a rank other than 0 of a `silofl launch` group: build this rank's sites and serve their steps;
    True when this process was such a worker."""
    import torch.distributed as dist

    from silofl.comm.torchdist import serve, shutdown
    from silofl.run.data import prepare_data
    from silofl.run.loop import ledger_root, releases_nonprivate, resolve_device, site_factory

    if dist.get_rank() == 0:
        if dist.get_world_size() > cfg.clients:
            raise ConfigError(f"{dist.get_world_size()} processes for {cfg.clients} clients: use at most one "
                              "process per client")
        return False
    console.quiet = True
    if cfg.threads is not None:
        import torch

        torch.set_num_threads(cfg.threads)
    cfg, split = prepare_data(cfg, resolve_device(cfg.device))
    make, n_sites = site_factory(cfg.info.cls(cfg), split, ledger_root(cfg), releases_nonprivate(cfg, in_process=False))
    try:
        serve(make, n_sites)
    finally:
        shutdown()
    return True


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@friendly_errors
def launch(
    ctx: typer.Context,
    nproc_per_node: int = typer.Option(..., "--nproc-per-node", help="Processes on this machine (sites here)."),
    nnodes: int = typer.Option(1, "--nnodes", help="Machines taking part."),
    rdzv_endpoint: str | None = typer.Option(None, "--rdzv-endpoint", help="host:port every machine reaches "
                                             "(several machines; one machine uses a local endpoint)."),
    rdzv_id: str = typer.Option("silofl", "--rdzv-id", help="A name shared by the machines of one run."),
    max_restarts: int = typer.Option(0, "--max-restarts", help="torchrun: restart every process up to N times "
                                     "after a failure; with --checkpoint-every they resume from the last checkpoint."),
    survive_faults: bool = typer.Option(False, "--survive-faults", help="Start the processes without torchrun's "
                                        "agent (which stops all when one fails): a crashed or hung process is "
                                        "dropped and the others finish."),
    node_rank: int = typer.Option(0, "--node-rank", help="With --survive-faults on several machines: this "
                                  "machine's index (0 hosts the rendezvous at --rdzv-endpoint)."),
    grace_s: float = typer.Option(30.0, "--grace-s", help="With --survive-faults: seconds the processes may take "
                                  "to exit after the reporting one; still running then (hung), they are killed."),
    auth_key_file: str | None = typer.Option(None, "--auth-key-file", help="A file with the run's shared key (hex): "
                                             "every frame between processes is authenticated with it. Needed on "
                                             "several machines (the same file on each); one machine makes its own."),
):
    """Run `silofl run ARGS` as one process per client on torch.distributed (gloo), launched with torchrun.

    Every other option is passed to `silofl run` (e.g. --method fedavg --clients 4 --out runs/x). Client k
    runs on process k mod (processes); a server runs with client 0 on process 0, which writes the run folder.
    """
    from silofl.comm.launcher import ensure_run_key

    ensure_run_key(nnodes, auth_key_file)
    run_args = ["-m", "silofl.cli.main", "run", "--distributed", *ctx.args]
    if nnodes > 1 and not rdzv_endpoint:
        raise ConfigError("several machines need --rdzv-endpoint host:port")
    if survive_faults:
        from silofl.comm.launcher import launch_processes

        code = launch_processes(run_args, nproc_per_node, nnodes, node_rank, rdzv_endpoint, console=err_console,
                                grace_s=grace_s)
        raise typer.Exit(code)
    from torch.distributed.run import main as torchrun

    args = ["--nproc-per-node", str(nproc_per_node), "--nnodes", str(nnodes), "--max-restarts", str(max_restarts)]
    if rdzv_endpoint:
        args += ["--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint, "--rdzv-id", rdzv_id]
    else:
        args += ["--standalone"]
    try:
        torchrun([*args, *run_args])
    except Exception as e:  # torchrun's ChildFailedError: say which process failed, not a traceback
        err_console.print(f"[bold red]error:[/] a process of the run failed: {e}")
        raise typer.Exit(1) from None


def _over_config(base: dict, overrides: dict) -> dict:
    """``overrides`` (flags, --set) over a --config file's mapping: the file's section of the run's method is lifted
    to flat options first, so a flag overrides a method option the file nests under the method's name (a tuned
    best.yaml) instead of being shadowed by it."""
    from silofl.run.config import RunConfig

    method = overrides.get("method", base.get("method", RunConfig.method))
    section = base.get(method) if isinstance(method, str) else None
    if isinstance(section, dict):
        base = {**{k: v for k, v in base.items() if k != method}, **section}
    return {**base, **overrides}


def _parse_sets(items: list[str]) -> dict:
    import yaml

    out = {}
    for item in items:
        key, eq, val = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"--set takes KEY=VALUE, got {item!r}")
        try:
            out[key.strip().replace("-", "_")] = yaml.safe_load(val)
        except yaml.YAMLError:
            raise ConfigError(f"--set {key}: {val!r} is not a valid value") from None
    return out


def _parse_clip(text: str) -> dict:
    """``--clip 0.5`` | ``--clip adaptive`` | ``--clip adaptive:0.1`` → run options (the clip as a number; the
    adaptive form turns on client-level adaptive clipping, starting from C0 or the default clip)."""
    kind, _, start = text.strip().partition(":")
    try:
        if kind == "adaptive":
            return {"adaptive_clip": True, "clip": float(start) if start else None}
        if start:
            raise ValueError
        return {"clip": float(kind)}
    except ValueError:
        raise ConfigError(f"--clip takes a number, 'adaptive' or 'adaptive:C0', got {text!r}") from None


def _number_list(text: str, flag: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{flag} takes comma-separated numbers, got {text!r}") from None


def print_summary(summary: dict) -> None:
    """Print a run's final per-client table, what its ε means, and its timing."""
    from silofl.fl.registry import ACC_FIELDS as ACC_KEYS
    from silofl.training.metrics import higher_is_better, metric_field

    priv = summary["privacy"]
    fin = summary["final"]
    rows = fin["per_client"]
    acc_keys = [k for k in ACC_KEYS if k in fin]
    metric = summary.get("metric", "accuracy")
    if metric != "accuracy":  # the headline metric of every model next to its accuracy
        acc_keys += [metric_field(k, metric) for k in ACC_KEYS if metric_field(k, metric) in fin]
    arch_keys = [k for k in ("private_model", "proxy_model", "global_model") if any(k in r for r in rows)]
    t = Table(title=f"{summary['method']} · {summary['dataset']} · {summary['rounds_run']} rounds")
    any_left = bool(summary["left"])
    cols = ("client", *(k.removesuffix("_model") for k in arch_keys), *(k.replace("_", " ") for k in acc_keys), "ε")
    for col in cols + (("left at",) if any_left else ()):
        t.add_column(col, justify="right", overflow="fold")
    for r in rows:
        row = [str(r["client"]), *(r.get(k) or "—" for k in arch_keys), *(_f(r.get(k)) for k in acc_keys), _f(r["epsilon"], 2)]
        t.add_row(*row, *((str(r["left_at"] or "—"),) if any_left else ()))
    t.add_row("mean±std", *([""] * len(arch_keys)), *(_ms(fin[k], 3) for k in acc_keys), _ms(fin["epsilon"], 2),
              *(("",) if any_left else ()))
    console.print(t)
    if metric != "accuracy" and summary.get("headline") in fin:
        console.print(f"judged by {summary['headline'].replace('_', ' ')} (--metric {metric}"
                      f"{', lower is better' if not higher_is_better(metric) else ''}): "
                      f"{_ms(fin[summary['headline']], 4)}")
    if priv["mode"] == "off":
        console.print("privacy: [bold]off[/] — no differential privacy.")
    else:
        style = "green" if priv["formal_guarantee"] else "bold yellow"
        console.print(f"privacy: [{style}]{priv['mode']}[/] — ε at δ={priv['delta']:g} from {priv['accountant']}; {priv['note']}.")
        if "epsilon_hospital" in priv:
            console.print(f"client-level ε at δ={priv['delta']:g}: hospital {priv['epsilon_hospital']:.3f}, "
                          f"sub-client {priv['epsilon_subclient']:.3f} — {priv['note_units']}")
    console.print(f"wall time {summary['wall_time_s']:.1f} s, {summary['seconds_per_round']:.2f} s/round "
                  f"({summary['threads']} threads, {summary['device']})")
    if summary["left"]:
        for x in summary["left"]:
            console.print(f"client {x['client']} left the protocol before round {x['round']}: "
                          f"{x.get('reason', 'budget spent')}")
    if summary["rejected_messages"]:
        console.print(f"[yellow]{len(summary['rejected_messages'])} received models rejected[/] (see summary.json)")


def _f(v, nd: int = 4) -> str:
    return "—" if v is None else f"{v:.{nd}f}"


def _ms(d: dict, nd: int = 4) -> str:
    return "—" if d["mean"] is None else f"{d['mean']:.{nd}f}±{d['std']:.{nd}f}"


@app.command()
@friendly_errors
def tune(
    method: str = typer.Option("proxyfl", help=f"{_method_help()}"),
    target_epsilon: float = typer.Option(..., "--target-epsilon", help="Budget ε per site: every trial's σ is set "
                                         "from it (budget-first)."),
    grid: list[str] = typer.Option([], "--grid", help="KEY=V1,V2,… (e.g. lr=0.001,0.003, rounds=10,30, batch_size="
                                   "100,250, clip=0.5,1, dml_alpha=0,0.5, sample_rate=0.25,0.5, momentum=0,0.9, "
                                   "local_steps=1,4, features=none,scatter); repeatable; every combination is a "
                                   "trial."),
    config: Path | None = typer.Option(None, "--config", help="YAML with the base run options."),
    out: str = typer.Option("runs/tune", help="Folder for the trials, tune.json/tune.md and best.yaml."),
    set_: list[str] = typer.Option([], "--set", help="Any other run option, KEY=VALUE; repeatable."),
    quiet: bool = typer.Option(True, "--quiet/--progress", help="Progress bar per trial."),
    random_trials: str | None = typer.Option(None, "--random-trials", help="Instead of every grid combination, "
                                             "K random trials, K ~ poisson:MU | negbin:ETA,GAMMA | geometric:GAMMA | "
                                             "logarithmic:GAMMA, each with settings drawn from the grid; only the best "
                                             "is kept, its ε bounded by Papernot & Steinke (ICLR 2022)."),
    max_trials: int | None = typer.Option(None, "--max-trials", help="With --random-trials: run at most this many "
                                          "(the cut-off chance is paid in δ). Default: the smallest cap that costs "
                                          "at most 0.1% of δ."),
    features: str | None = typer.Option(None, "--features", help="none | scatter | backbone:DIR for every trial (see "
                                        "silofl run; search it with --grid features=none,scatter)."),
    metric: str | None = typer.Option(None, "--metric", help="Select on this validation figure: accuracy (default) | "
                                      "auroc | balanced_accuracy | f1 | ece (lowest wins)."),
):
    """Search settings for a budget on the validation split (training data no client holds, as public data) —
    never the test set; write the best config to OUT/best.yaml and the tuning-inclusive ε to tune.json."""
    from silofl.experiments.tune import parse_grid
    from silofl.experiments.tune import tune as run_tune
    from silofl.privacy.tuning import parse_trial_count
    from silofl.run.config import RunConfig, load_yaml_mapping

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    count = parse_trial_count(random_trials) if random_trials is not None else None
    if max_trials is not None and (count is None or max_trials < 1):
        raise ConfigError("--max-trials needs --random-trials and a value of at least 1"
                          if count is None else f"--max-trials must be at least 1, got {max_trials}")
    base = load_yaml_mapping(config) if config else {}
    cfg = RunConfig.from_dict(_over_config(base, {**_parse_sets(set_), "method": method,
                                                  "target_epsilon": target_epsilon, "eval_split": "validation",
                                                  **({"features": features} if features is not None else {}),
                                                  **({"metric": metric} if metric is not None else {})}))
    result = run_tune(cfg, parse_grid(grid), out, progress=not quiet, console=console, random_trials=count,
                      max_trials=max_trials)
    b = result["best"]
    c = result["tuning_cost"]
    rt = result.get("random_trials")
    if b is None:
        console.print(f"K = 0 trials drawn from {rt['distribution']}: nothing ran, nothing chosen (no best.yaml); "
                      f"see {out}/tune.md")
    else:
        console.print(f"best on validation: {b['settings']} ({result['selection']} {b['validation']:.4f}) → "
                      f"{out}/best.yaml")
    if rt is not None:
        console.print(f"{rt['drawn']} random trials (K ~ {rt['distribution']}, E[K] = {rt['mean']:.3g}, at most "
                      f"{rt['max_trials']}): best trial only, Papernot–Steinke ε ≤ {rt['max']:.3f} (one trial "
                      f"ε ≤ {rt['one_trial_max']:.3f}) at δ = {rt['delta']:g}")
    if c["max"] is not None:
        console.print(f"each run: ε ≤ {target_epsilon:g}; tuning-inclusive (all {c['trials']} trials composed): "
                      f"ε ≤ {c['max']:.3f} at δ = {c['delta']:g}")


@app.command()
@friendly_errors
def compare(
    config: Path | None = typer.Option(None, "--config", help="YAML with compare options (methods, seeds, preset, variants, jobs, comm_clients, out) and run options under 'run:'."),
    methods: str | None = typer.Option(None, help="Comma-separated, e.g. proxyfl,fedavg,fml,avgpush,cwt,regular,joint; 'regular:nodp' runs a method without DP."),
    seeds: str | None = typer.Option(None, help="Comma-separated seeds, e.g. 0,1,2."),
    preset: str | None = typer.Option(None, help="Ablation: none | noniid | hetero | dp | batch | alpha | privacy-mode"),
    out: str | None = typer.Option(None, help="Report folder (runs go under OUT/runs/)."),
    jobs: int | None = typer.Option(None, help="Runs in parallel processes (one torch thread each unless --threads)."),
    resume: bool = typer.Option(False, "--resume", help="Skip runs whose folder already holds a finished run of the same config."),
    report_only: bool = typer.Option(False, "--report-only", help="Write the report from the runs already finished; run nothing."),
    comm_clients: str | None = typer.Option(None, "--comm-clients", help="Also measure bytes per round at these K, e.g. 2,4,8,16,32,64."),
    dataset: str | None = typer.Option(None), data_dir: str | None = typer.Option(None, "--data-dir"),
    rounds: int | None = typer.Option(None), clients: int | None = typer.Option(None),
    samples_per_client: int | None = typer.Option(None, "--samples-per-client"),
    batch_size: int | None = typer.Option(None, "--batch-size"), privacy: str | None = typer.Option(None),
    private_model: str | None = typer.Option(None, "--private-model"), proxy_model: str | None = typer.Option(None, "--proxy-model"),
    eval_every: int | None = typer.Option(None, "--eval-every"), test_limit: int | None = typer.Option(None, "--test-limit"),
    threads: int | None = typer.Option(None),
    set_: list[str] = typer.Option([], "--set", help="Any other run option, KEY=VALUE (YAML value); repeatable."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
    features: str | None = typer.Option(None, "--features", help="none | scatter | backbone:DIR (see silofl run)."),
    metric: str | None = typer.Option(None, "--metric", help="The table's figure: accuracy (default) | auroc | "
                                      "balanced_accuracy | f1 | ece."),
):
    """Run methods × variants × seeds and write a report (report.md, results.csv/json, plots)."""
    from silofl.experiments.compare import CompareConfig, run_compare

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    cc = CompareConfig.from_yaml(config) if config else CompareConfig()
    if methods is not None:
        cc.methods = [m.strip() for m in methods.split(",") if m.strip()]
    if seeds is not None:
        cc.seeds = [int(x) for x in _number_list(seeds, "--seeds")]
    if comm_clients is not None:
        cc.comm_clients = [int(x) for x in _number_list(comm_clients, "--comm-clients")]
    for name, v in (("preset", preset), ("out", out), ("jobs", jobs)):
        if v is not None:
            setattr(cc, name, v)
    cc.resume = cc.resume or resume
    cc.report_only = cc.report_only or report_only
    run_opts = {"dataset": dataset, "data_dir": data_dir, "rounds": rounds, "clients": clients,
                "samples_per_client": samples_per_client, "batch_size": batch_size, "privacy": privacy,
                "private_model": private_model, "proxy_model": proxy_model, "eval_every": eval_every,
                "test_limit": test_limit, "threads": threads, "features": features, "metric": metric}
    run_opts.update(_parse_sets(set_))
    cc.run = {**cc.run, **{k: v for k, v in run_opts.items() if v is not None}}
    report = run_compare(cc, console=console, progress=not quiet)
    from silofl.report.comparison import markdown_table

    if report["rows"]:
        console.print(markdown_table(report["rows"]), markup=False, highlight=False)
    console.print(f"report: {Path(cc.out) / 'report.md'}")
    if report["failed"]:
        err_console.print(f"[red]{len(report['failed'])} run(s) failed[/]: " + ", ".join(f["run"] for f in report["failed"]))
        raise typer.Exit(1)


@app.command()
@friendly_errors
def evaluate(
    run_dir: Path = typer.Argument(..., help="A run folder written by `silofl run`."),
    data_dir: str | None = typer.Option(None, "--data-dir"),
):
    """Reload a run's saved models and recompute their test accuracy (and AUROC, balanced accuracy, F1, ECE)."""
    from silofl.experiments.evaluate import evaluate_run

    results = evaluate_run(run_dir, data_dir=data_dir)
    t = Table(title=f"evaluate {run_dir}")
    for col in ("model", "architecture", "test accuracy", "in summary", "AUROC", "balanced acc", "F1", "ECE"):
        t.add_column(col, justify="right")
    for r in results:
        m = r.get("metrics", {})
        t.add_row(r["model"], r["architecture"], f"{r['accuracy']:.4f}", _f(r["recorded"]),
                  *(_f(m.get(k)) for k in ("auroc", "balanced_accuracy", "f1", "ece")))
    console.print(t)
    (Path(run_dir) / "evaluation.json").write_text(json.dumps(results, indent=2) + "\n")


@app.command()
@friendly_errors
def predict(
    run_dir: Path = typer.Argument(..., help="A run folder (models/ inside) or a site's folder of models."),
    client: int = typer.Option(..., "--client", help="Whose model: client K (its site's preprocessing comes with it)."),
    data: Path = typer.Option(..., "--data", help="New rows (.csv/.parquet, checked against the schema; the target "
                              "column is optional) or a folder of images (class sub-folders optional)."),
    out: Path = typer.Option(..., "--out", help="CSV to write: id, prediction, p_<class> per class[, label]."),
    model: str = typer.Option("private", "--model", help="private (the site's own model) | shared (its proxy or "
                              "global model) | combined (both fused: runs with --combine; non-private)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace --out if it exists."),
):
    """Predict with client K's model on new data, with exactly the preprocessing its site trained with."""
    from silofl.inference import predict as run_predict

    res = run_predict(run_dir, client, data, out, model=model, overwrite=overwrite)
    acc = f"; accuracy {res['accuracy']:.4f} against the labels in the data" if res["accuracy"] is not None else ""
    nan = (f"; [yellow]{res['nan_rows']} rows have missing values the schema does not impute (probabilities NaN)[/]"
           if res["nan_rows"] else "")
    console.print(f"{res['rows']} predictions by {res['model']} ({res['architecture']}) → {res['out']}{acc}{nan}")


@app.command()
@friendly_errors
def export(
    run_dir: Path = typer.Argument(..., help="A run folder (models/ inside) or a site's folder of models."),
    client: int = typer.Option(..., "--client", help="Whose model: client K."),
    out: Path = typer.Option(..., "--out", help="Folder to write model.onnx, preprocessing.json, model_card.json/.md."),
    fmt: str = typer.Option("onnx", "--format", help="onnx"),
    model: str = typer.Option("private", "--model", help="private | shared (the proxy or global model) | combined "
                              "(runs with --combine; non-private)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Write into a non-empty --out."),
):
    """Export client K's model to ONNX (its preprocessing inside the graph) with a model card (JSON + Markdown)."""
    from silofl.inference.export import export as run_export

    card = run_export(run_dir, client, out, model=model, fmt=fmt, overwrite=overwrite)
    console.print(f"exported client {client}'s {card['model']['role']} model ({card['model']['architecture']}) → "
                  f"{out}/model.onnx, preprocessing.json, model_card.json, model_card.md")
    console.print(f"privacy: {card['privacy']['statement']}", markup=False, highlight=False)


@app.command()
@friendly_errors
def audit(
    out: str = typer.Option(..., "--out", help="Audit folder to write (audit.json, audit.md, attacks.csv, "
                            "canary_scores.csv, split.json, audit.png; the audited run in OUT/run)."),
    canaries: int = typer.Option(1000, "--canaries", help="m: canaries, each included with probability ½ (examples at "
                                 "the audited site; clients for client-level methods; rows of a published model)."),
    canary_kind: str = typer.Option("mislabelled", "--canary-kind", help="Example canaries: mislabelled (pool "
                                    "examples with a wrong label) | noise (out-of-distribution inputs, random labels); white-box "
                                    "gradient canaries inside the DP step (example-level DP-SGD): dirac | random."),
    audited_site: int = typer.Option(0, "--audited-site", help="The client whose data (or whose peers) get the canaries."),
    reference_models: int = typer.Option(4, "--reference-models", help="Reference models per attacked model "
                                         "(LiRA/RMIA offline), trained on data disjoint from every candidate."),
    nonmembers: int | None = typer.Option(None, "--nonmembers", help="Non-members of the attack (default: as many "
                                          "as the audited site's examples)."),
    confidence: float = typer.Option(0.95, "--confidence", help="Confidence of the ε lower bound."),
    pubsub_model: str | None = typer.Option(None, "--pubsub-model", help="Audit a PubSub-ML published model "
                                            "instead of a run: dp-nn | dp-logreg | dp-nb | dp-forest."),
    epsilon: float | None = typer.Option(None, "--epsilon", help="The published model's ε (--pubsub-model)."),
    epochs: int = typer.Option(20, "--epochs", help="dp-nn training epochs (--pubsub-model)."),
    config: Path | None = typer.Option(None, "--config", help="YAML file with the audited run's options."),
    method: str | None = typer.Option(None, help=f"{_method_help()}"),
    dataset: str | None = typer.Option(None), data_dir: str | None = typer.Option(None, "--data-dir"),
    clients: int | None = typer.Option(None), rounds: int | None = typer.Option(None),
    seed: int | None = typer.Option(None, help="A reproducible research audit: the canaries, their coins, the reference "
                                    "models and the run's noise and sampling derive from this seed (the run's ε then "
                                    "holds only while it stays secret). Default: secret randomness, as in any run."),
    privacy: str | None = typer.Option(None, help="strict | paper | off"),
    private_model: str | None = typer.Option(None, "--private-model"), proxy_model: str | None = typer.Option(None, "--proxy-model"),
    partition: str | None = typer.Option(None), samples_per_client: int | None = typer.Option(None, "--samples-per-client"),
    batch_size: int | None = typer.Option(None, "--batch-size"), lr: float | None = typer.Option(None),
    noise_multiplier: float | None = typer.Option(None, "--noise-multiplier"), clip: str | None = typer.Option(None),
    delta: float | None = typer.Option(None), accountant: str | None = typer.Option(None),
    intermediaries: str | None = typer.Option(None), privacy_unit: str | None = typer.Option(None, "--privacy-unit"),
    client_rate: float | None = typer.Option(None, "--client-rate"), server_lr: float | None = typer.Option(None, "--server-lr"),
    local_epochs: int | None = typer.Option(None, "--local-epochs"), local_lr: float | None = typer.Option(None, "--local-lr"),
    eval_every: int | None = typer.Option(None, "--eval-every", help="Default for an audit: only the last round."),
    test_limit: int | None = typer.Option(None, "--test-limit"), threads: int | None = typer.Option(None),
    set_: list[str] = typer.Option([], "--set", help="Any other run option, KEY=VALUE (YAML value); repeatable."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the audit already in OUT."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
):
    """Measure what a run leaks: canaries → a one-run empirical ε lower bound next to the accountant's ε, and
    membership inference on real examples (silofl.audit)."""
    from silofl.audit import AuditSettings, run_audit
    from silofl.run.config import RunConfig, load_yaml_mapping

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    run_opts = {"method": method, "dataset": dataset, "data_dir": data_dir, "clients": clients, "rounds": rounds,
                "privacy": privacy, "private_model": private_model, "proxy_model": proxy_model, "partition": partition,
                "samples_per_client": samples_per_client, "batch_size": batch_size, "lr": lr,
                "noise_multiplier": noise_multiplier, "delta": delta, "accountant": accountant,
                "intermediaries": intermediaries, "privacy_unit": privacy_unit, "client_rate": client_rate,
                "server_lr": server_lr, "local_epochs": local_epochs, "local_lr": local_lr, "eval_every": eval_every,
                "test_limit": test_limit, "threads": threads}
    if clip is not None:
        run_opts.update(_parse_clip(clip))
    base = load_yaml_mapping(config) if config else {}
    merged = {**base, **_parse_sets(set_), **{k: v for k, v in run_opts.items() if v is not None}}
    if "eval_every" not in merged:
        merged["eval_every"] = int(merged.get("rounds", 300))
    if str(merged.get("features") or "none") != "none":
        raise ConfigError("silofl audit does not take a feature stage yet: its canaries are drawn from the raw inputs")
    cfg = RunConfig.from_dict(merged)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    settings = AuditSettings(canaries=canaries, canary_kind=canary_kind, site=audited_site, reference_models=reference_models,
                             nonmembers=nonmembers, confidence=confidence,
                             seed=seed if seed is not None else cfg.seed,  # --seed, else a seed in --config / --set
                             pubsub_model=pubsub_model, epsilon=epsilon, pubsub_epochs=epochs)
    what = f"published {pubsub_model}" if pubsub_model else f"{cfg.method} ({cfg.resolve().privacy})"
    how = (f"seed {settings.seed} (seeded research run: the run's ε holds only while the seed stays secret)"
           if settings.seeded else "secret randomness (not reproducible; --seed for a research audit)")
    console.print(f"[bold]silofl audit[/] {what} on {cfg.dataset}: {canaries} canaries, {how} → {out}")
    import shlex

    command = "silofl " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["audit"] else None
    a = run_audit(cfg, settings, out, overwrite=overwrite, progress=not quiet, console=console, command=command)
    b = a["bound"]
    eps_acc = "—" if a["epsilon_accountant"] is None else f"{a['epsilon_accountant']:.3f}"
    label = ("" if a["epsilon_accountant"] is None else " (NOT a formal guarantee in this mode)"
             if not a["formal_guarantee"] else " (seeded research run: formal only while the seed is secret)"
             if a.get("seeded") else "")
    console.print(f"empirical ε lower bound {a['epsilon_lower_bound']:.3f} ({a['confidence']:.0%} confidence, "
                  f"δ={a['delta']:g}; {b['correct']}/{b['guesses']} guesses right on score '{b['score']}', "
                  f"at most {b['max_auditable_epsilon']:.2f} measurable) · accountant ε {eps_acc}{label}")
    if a.get("epsilon_gauss") is not None or "bounds" in a:
        console.print(f"threat model {a['threat_model']}; Gaussian-sum estimate ε {a.get('epsilon_gauss') or 0:.3f} "
                      "(an estimate, not a guarantee)", markup=False, highlight=False)
    for target, t in a["membership_inference"]["targets"].items():
        figs = ", ".join(f"{k} AUC {f['auc']:.3f} TPR@1% {f['tpr_at_1%_fpr']:.3f}" for k, f in t["attacks"].items())
        console.print(f"membership inference on {target} ({t['model']}): {figs}")
    console.print(f"report: {Path(out) / 'audit.md'}")


from silofl.cli.deploy import deploy_app, site_app  # noqa: E402 - the subcommand groups register after the commands
from silofl.cli.pubsub import app as pubsub_app  # noqa: E402

app.add_typer(pubsub_app, name="pubsub")
app.add_typer(site_app, name="site")
app.add_typer(deploy_app, name="deploy")
from silofl.cli.backbone import backbone_app  # noqa: E402

app.add_typer(backbone_app, name="backbone")


def main() -> None:  # pragma: no cover
    """The ``silofl`` console entry point."""
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())

