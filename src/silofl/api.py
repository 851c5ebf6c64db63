"""The Python API: plain functions that run, tune, audit, compare, deploy, predict and export, with
results returned as objects.

```python
import silofl

result = silofl.run("proxyfl-scatter", rounds=5, out="runs/x", overwrite=True)
result.headline, result.epsilon, result.folder   # the judged figure (mean), the worst site's ε, runs/x
```

Each function takes what the ``silofl`` command of the same name takes, by the same names: a run is a
`RunConfig`, a recipe's name or file (`silofl.runner.recipe`), a mapping of options or a config file, and any
run option as a keyword (`lr=0.01`, `private_model="tabmlp"`, `peer_timeout=60`) overriding it. Each writes
the same folder as the command — the CLI calls these functions. Errors a user can fix are `SiloflError` s,
one line each, naming the parameters (`out`, `overwrite`), not the command line's flags.

The engine a run uses is chosen by name from the engines' registry (`silofl.comm.engines.ENGINES`):
`simulator` (every site in this process), `flower-local` (a real Flower deployment on this machine:
`deploy_local`, `silofl deploy local`) and `flower` (the registered sites of a deployment folder:
`silofl deploy start`). torch.distributed runs are started by `silofl launch`.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from silofl.core.errors import ConfigError, SiloflError
from silofl.runner.config import RunConfig, merge_options

__all__ = [
    "run",
    "tune",
    "audit",
    "compare",
    "deploy_local",
    "predict",
    "export",
    "RunConfig",
    "RunResult",
    "TuneResult",
    "AuditResult",
    "CompareResult",
    "engine_names",
]


# ---------------------------------------------------------------------------------------------- errors
_CLI: contextvars.ContextVar[bool] = contextvars.ContextVar("silofl_api_cli", default=False)
_FLAG = re.compile(r"(?<![\w-])--(no-)?([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")


@contextlib.contextmanager
def flag_names() -> Iterator[None]:
    """Within the block the API's errors name the command line's flags (``--out``): the CLI's commands run
    in it (``silofl.cli.common.friendly_errors``); a Python caller gets the parameters' names (``out``)."""
    token = _CLI.set(True)
    try:
        yield
    finally:
        _CLI.reset(token)


def as_parameters(text: str) -> str:
    """An error's text with each flag named as its parameter (``--out`` → ``out``, ``--peer-timeout`` →
    ``peer_timeout``): every option of a command is the API function's parameter by the same name."""
    return _FLAG.sub(lambda m: m.group(2).replace("-", "_") + ("=False" if m.group(1) else ""), text)


def _named_by_parameter(fn: Callable) -> Callable:
    """An API function whose one-line errors name its parameters, not flags (outside `flag_names`)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SiloflError as e:
            if not _CLI.get() and e.args and isinstance(e.args[0], str):
                e.args = (as_parameters(e.args[0]), *e.args[1:])
            raise

    return wrapper


# ---------------------------------------------------------------------------------------------- results
@dataclass
class RunResult:
    """A finished run: its resolved config, ``summary.json``'s content and its folder."""

    config: RunConfig
    summary: dict[str, Any]
    folder: Path
    vs_alone: dict[str, Any] | None = None  # with ``vs_alone=True``: the comparison with training alone

    @property
    def per_client(self) -> list[dict[str, Any]]:
        """The final figures of every client (accuracies, ε, architectures)."""
        return list(self.summary["final"]["per_client"])

    @property
    def epsilons(self) -> list[float | None]:
        """Every client's final ε (None without DP)."""
        return [r.get("epsilon") for r in self.per_client]

    @property
    def epsilon(self) -> float | None:
        """The largest ε any client spent (the run's guarantee per site; None without DP). What it protects:
        `privacy`."""
        known = [e for e in self.epsilons if e is not None]
        return max(known) if known else None

    @property
    def privacy(self) -> dict[str, Any]:
        """The privacy mode, unit, δ, accountant and whether the ε is a formal guarantee."""
        return dict(self.summary["privacy"])

    @property
    def headline(self) -> float | None:
        """The mean over clients of the method's judged figure (``summary["headline"]``, by ``metric``)."""
        fig = self.summary["final"].get(self.summary.get("headline", ""))
        return fig.get("mean") if isinstance(fig, dict) else None

    def __str__(self) -> str:
        """A few lines: each model's figure (mean ± spread over sites), the gain over going alone where it
        was trained, and the ε per site against each threat its accountant reports."""
        from silofl.fl.registry import ACC_FIELDS
        from silofl.training.metrics import metric_field, metric_label

        s, fin = self.summary, self.summary["final"]
        metric = s.get("metric", "accuracy")
        lines = [
            f"{s['method']} on {s['dataset']}: {s['clients']} sites, {s['rounds_run']} rounds ({self.folder})"
        ]
        alone = (self.vs_alone or {}).get("alone", {})
        base = alone.get(metric_field("private_acc", metric))
        for acc in ACC_FIELDS:
            fig = fin.get(metric_field(acc, metric))
            if not isinstance(fig, dict) or fig.get("mean") is None:
                continue
            gain = f", {fig['mean'] - base:+.3f} over going alone" if base is not None else ""
            lines.append(
                f"  {acc.removesuffix('_acc')} model: {metric_label(metric)} {fig['mean']:.3f} "
                f"± {fig.get('std') or 0:.3f}{gain}"
            )
        if base is not None:
            lines.append(f"  going alone (no DP, the same rows): {metric_label(metric)} {base:.3f}")
        threats = {label: eps for eps, label in threat_epsilons(s).values()}
        priv = s["privacy"]
        if priv.get("mode") == "off":
            lines.append("  privacy: off (no differential privacy)")
        elif threats:
            per = "; ".join(f"{eps:.2f} against {t}" for t, eps in threats.items())
            lines.append(f"  ε per site at δ = {priv['delta']:g} (the largest over sites): {per}")
        elif self.epsilon is not None:
            lines.append(f"  ε per site at δ = {priv['delta']:g}: at most {self.epsilon:.2f}")
        return "\n".join(lines)


def threat_epsilons(summary: dict[str, Any]) -> dict[str, tuple[float, str]]:
    """Each threat a run's site ledgers report (outsiders, server, server plus the colluders each site's
    policy assumes) → (the largest ε over sites, what it holds against); empty without site ledgers."""
    out: dict[str, tuple[float, str]] = {}
    for site in summary.get("accounting") or []:
        ledger = site.get("site_ledger") or {}
        for threat, eps in (ledger.get("epsilon") or {}).items():
            if eps is not None and eps >= out.get(threat, (-1.0, ""))[0]:
                out[threat] = (float(eps), str((ledger.get("against") or {}).get(threat, threat)))
    return out


@dataclass
class TuneResult:
    """A finished search: ``tune.json``'s content, the chosen settings and config, and the tuning-inclusive
    ε."""

    result: dict[str, Any]
    folder: Path
    best_config: (
        RunConfig | None
    )  # the base config with the chosen settings, scored on the test split (best.yaml)

    @property
    def settings(self) -> dict[str, Any] | None:
        """The chosen settings (None when no trial ran)."""
        best = self.result.get("best")
        return dict(best["settings"]) if best else None

    @property
    def validation(self) -> float | None:
        """The chosen trial's validation figure."""
        best = self.result.get("best")
        return best["validation"] if best else None

    @property
    def trials(self) -> list[dict[str, Any]]:
        """Every trial's settings and validation figure, in the order they ran."""
        return list(self.result["trials"])

    @property
    def epsilon(self) -> float | None:
        """The ε of the whole search: every trial composed, or the random-trials bound (Papernot &
        Steinke)."""
        rt = self.result.get("random_trials")
        return rt["max"] if rt is not None else self.result["tuning_cost"]["max"]


@dataclass
class AuditResult:
    """A finished audit: ``audit.json``'s content and its folder."""

    audit: dict[str, Any]
    folder: Path

    @property
    def epsilon_lower_bound(self) -> float:
        """The empirical ε lower bound (at `audit` ``["confidence"]``)."""
        return float(self.audit["epsilon_lower_bound"])

    @property
    def epsilon_accountant(self) -> float | None:
        """The accountant's ε of the audited run (its upper bound)."""
        return self.audit["epsilon_accountant"]

    @property
    def membership_inference(self) -> dict[str, Any]:
        """The membership-inference attack's figures (AUC, TPR at low FPR, …) against the audited release."""
        return dict(self.audit["membership_inference"])


@dataclass
class CompareResult:
    """A finished comparison: its rows (one per method and variant, mean ± std over seeds), failures,
    folder."""

    report: dict[str, Any]
    folder: Path

    @property
    def rows(self) -> list[dict[str, Any]]:
        """One row per method and variant: its figures, mean ± std over seeds."""
        return list(self.report["rows"])

    @property
    def failed(self) -> list[dict[str, Any]]:
        """The runs that failed, with their errors."""
        return list(self.report["failed"])

    @property
    def markdown(self) -> Path:
        """The comparison's Markdown report."""
        return self.folder / "report.md"


# ---------------------------------------------------------------------------------------------- engines
@dataclass(frozen=True)
class EngineOptions:
    """What an engine besides the simulator needs (the deploy commands' options)."""

    timeout_s: float = 900.0  # seconds the deployed run may take
    peer_timeout_s: float = 300.0  # seconds to wait for a site's answer
    insecure: bool = False  # flower-local: no TLS, no node authentication (recorded in the summary)
    restart_sites: bool = False  # flower-local: restart a site process that dies
    deployment: Path | None = None  # flower: the coordinator's deployment folder (registered sites)
    superlink: str | None = None  # flower: the SuperLink, HOST:PORT


def start_simulator(
    cfg: RunConfig, *, resume: bool, overwrite: bool, progress: bool, console: Any, opts: EngineOptions
) -> dict:
    """Run ``cfg`` with every site in this process (the simulator engine)."""
    from silofl.runner.loop import run as run_loop

    return run_loop(cfg, progress=progress, console=console, resume=resume, overwrite=overwrite)


def start_torch_distributed(
    cfg: RunConfig, *, resume: bool, overwrite: bool, progress: bool, console: Any, opts: EngineOptions
) -> dict:
    """Rank 0 of a `silofl launch` group (the process group is up; the other ranks serve their sites)."""
    from silofl.comm.torchdist import TorchDistEngine
    from silofl.runner.loop import run as run_loop

    def factory(make_site, n_sites):
        return TorchDistEngine(make_site, n_sites, timeout_s=opts.peer_timeout_s)

    return run_loop(
        cfg, progress=progress, console=console, resume=resume, overwrite=overwrite, engine_factory=factory
    )


def start_flower_local(
    cfg: RunConfig, *, resume: bool, overwrite: bool, progress: bool, console: Any, opts: EngineOptions
) -> dict:
    """Run ``cfg`` as a Flower deployment on this machine (``silofl deploy local``)."""
    from silofl.deploy.local import deploy_local

    if resume or overwrite:
        raise ConfigError(
            "silofl deploy local starts a fresh deployment: --resume and --overwrite do not apply"
        )
    if console is not None:
        console.print(
            f"deploying on this machine: a SuperLink and {cfg.clients} sites as separate processes, "
            + (
                "[bold red]INSECURE: no TLS, no node authentication[/]"
                if opts.insecure
                else "TLS, SuperNode authentication, payloads between sites sealed end to end"
            )
        )
    return deploy_local(
        cfg,
        Path(cfg.out),
        timeout_s=opts.timeout_s,
        insecure=opts.insecure,
        progress=progress,
        call_timeout_s=opts.peer_timeout_s,
        restart_sites=opts.restart_sites,
    )


def start_flower(
    cfg: RunConfig, *, resume: bool, overwrite: bool, progress: bool, console: Any, opts: EngineOptions
) -> dict:
    """Run ``cfg`` on a deployment's registered sites (``silofl deploy start``)."""
    from silofl.deploy.local import run_deployment

    if resume or overwrite:
        raise ConfigError("silofl deploy start starts a fresh run: --resume and --overwrite do not apply")
    return run_deployment(
        cfg,
        opts.deployment,
        opts.superlink,
        timeout_s=opts.timeout_s,
        progress=progress,
        call_timeout_s=opts.peer_timeout_s,
    )


def engine_names() -> tuple[str, ...]:
    """The engines a run can be given by name (the registry `silofl.comm.engines.ENGINES`; ``silofl launch``
    starts torch.distributed runs)."""
    from silofl.comm.engines import selectable_engines

    return selectable_engines()


# ---------------------------------------------------------------------------------------------- run
def as_config(config: RunConfig | Mapping[str, Any] | str | Path | None = None, **options: Any) -> RunConfig:
    """A RunConfig from a RunConfig, a mapping of options (as in a YAML file), a recipe's name or file
    (`silofl.runner.recipe`), a config file's path, or nothing (the defaults) — with ``options`` (any
    run option by its name: ``rounds=5``, ``private_model="tabmlp"``) over it."""
    from silofl.runner.recipe import with_family_defaults

    recipe = None
    if config is None:
        base: dict[str, Any] = {}
    elif isinstance(config, RunConfig):
        if not options:
            return config
        base = config.to_dict()
    elif isinstance(config, Mapping):
        base = dict(config)
    elif isinstance(config, (str, Path)):
        base, recipe = _file_or_recipe(config)
    else:
        raise ConfigError(
            "a run config must be a RunConfig, a mapping, a recipe or a YAML file, got "
            f"{type(config).__name__}"
        )
    merged = merge_options(base, options)
    if recipe is not None or isinstance(config, RunConfig):  # a recipe named: its settings are the defaults
        return RunConfig.from_dict(merged)
    return RunConfig.from_dict(with_family_defaults(merged))  # else its data family's recipe's


def _file_or_recipe(ref: str | Path) -> tuple[dict[str, Any], str | None]:
    """(the run options of a recipe (by name or file) or of a config file, the recipe's name or None)."""
    from silofl.runner.config import load_yaml_mapping
    from silofl.runner.recipe import is_recipe_path, load_recipe, parse_recipe

    if not is_recipe_path(ref):
        return load_recipe(ref).options, str(ref)
    data = load_yaml_mapping(ref)
    if "recipe" in data and "run" in data:
        return parse_recipe(data, str(ref)).options, str(ref)
    return data, None


ENGINE_OPTIONS = {  # run()'s keyword → EngineOptions field (the command line's engine flags, same names)
    "deploy_timeout": "timeout_s",
    "peer_timeout": "peer_timeout_s",
    "insecure": "insecure",
    "restart_sites": "restart_sites",
    "deployment": "deployment",
    "superlink": "superlink",
}


def _engine_options(given: EngineOptions | None, options: dict[str, Any]) -> EngineOptions:
    """``engine_options`` with the engine keywords among ``options`` (taken out of it) applied."""
    picked = {ENGINE_OPTIONS[k]: options.pop(k) for k in list(options) if k in ENGINE_OPTIONS}
    for name in ("timeout_s", "peer_timeout_s"):
        v = picked.get(name)
        if v is not None and not (isinstance(v, (int, float)) and 0 < v < float("inf")):
            raise ConfigError(f"--{name[:-2].replace('_', '-')} must be a finite positive number of seconds")
    return dataclasses.replace(given or EngineOptions(), **picked)


@_named_by_parameter
def run(
    config: RunConfig | Mapping[str, Any] | str | Path | None = None,
    *,
    resume: bool = False,
    overwrite: bool = False,
    quiet: bool = True,
    vs_alone: bool = False,
    engine: str = "simulator",
    console: Any = None,
    engine_options: EngineOptions | None = None,
    on_summary: Callable[[dict], Any] | None = None,
    **options: Any,
) -> RunResult:
    """Run ``config`` and write its run folder (config.yaml, metrics.jsonl, summary.json, plots, models/).

    ``config``: a `RunConfig`, a recipe's name (``"proxyfl-scatter"``) or file, a mapping of options or a
    config file (None: the defaults); ``options``: any run option by its name (``out="runs/x"``,
    ``rounds=5``, ``lr=0.01``), over ``config``, and the engine's (``peer_timeout``, ``deploy_timeout``,
    ``insecure``, ``restart_sites``, ``deployment``, ``superlink``). ``resume``: continue the folder's
    latest checkpoint (the privacy spend carries on); ``overwrite``: replace the run already in ``out``
    (refused otherwise); ``quiet``: no progress bar; ``vs_alone``: afterwards train each site alone without
    DP into ``OUT/alone`` (simulator only); ``engine``: a registered engine's name; ``console``: a rich
    Console for progress lines (None: silent); ``on_summary``: called with the summary as soon as the run
    ends (before the ``vs_alone`` baseline trains)."""
    from silofl.comm.engines import ENGINES
    from silofl.runner.folder import OutLock, check_out

    opts = _engine_options(engine_options, options)
    cfg = as_config(config, **options)
    if engine not in ENGINES:
        raise ConfigError(f"unknown engine {engine!r}; choose one of: {', '.join(engine_names())}")
    entry = ENGINES.get(engine)
    if (
        entry.data_at_sites and not cfg.data_at_sites
    ):  # each site reads its own data (its site.json), the coordinator none
        cfg = dataclasses.replace(cfg, data_at_sites=True)
    if vs_alone and not entry.vs_alone:
        raise ConfigError(
            f"--vs-alone trains the baseline with the simulator; engine {engine!r} does not take it"
        )
    resolved = cfg.resolve()
    if resolved.track is not None:
        _check_makeable(resolved.track[1], f"--track {resolved.track[0]} DIR")
    with OutLock(resolved.out):  # one run at a time into OUT (the OS drops the lock on a crash)
        check_out(resolved.out, resume=resume, overwrite=overwrite)  # before any engine starts
        from silofl.runner.decision import deferred

        # with a baseline to come, the decision table is printed once, after it (runner.alone)
        with deferred() if vs_alone else contextlib.nullcontext():
            summary = entry.starter()(
                resolved,
                resume=resume,
                overwrite=overwrite,
                progress=not quiet,
                console=console,
                opts=opts,
            )
        if on_summary is not None:
            on_summary(summary)
        alone = None
        if vs_alone and engine == "simulator":
            from silofl.runner.alone import compare_with_alone

            alone = compare_with_alone(resolved, summary, console)
    if alone is not None:
        import json

        summary = json.loads((Path(resolved.out) / "summary.json").read_text())
    return RunResult(resolved, summary, Path(resolved.out), alone)


@_named_by_parameter
def deploy_local(
    config: RunConfig | Mapping[str, Any] | str | Path | None = None,
    *,
    sites: int | None = None,
    quiet: bool = True,
    console: Any = None,
    **options: Any,
) -> RunResult:
    """``silofl deploy local``: a real Flower deployment on this machine (CA, keys, a site folder per site, a
    SuperLink and ``sites`` SuperNodes as processes) writing the same run folder as `run`; ``options``
    as `run`'s (``timeout``: the seconds the run may take, as ``deploy_timeout``)."""
    if sites is not None:
        if sites < 1:
            raise ConfigError("--sites must be at least 1")
        options["clients"] = sites
    if "timeout" in options:
        options["deploy_timeout"] = options.pop("timeout")
    return run(config, engine="flower-local", quiet=quiet, console=console, **options)


@_named_by_parameter
def predict(
    run_dir: str | Path,
    client: int,
    data: str | Path,
    out: str | Path,
    *,
    model: str = "private",
    overwrite: bool = False,
) -> dict[str, Any]:
    """``silofl predict``: client ``client``'s model of ``run_dir`` on new rows or images ``data``, with
    exactly the preprocessing its site trained with; writes the CSV ``out`` and returns what it scored
    (rows, model, architecture, and the accuracy / Dice / C-index against labels the data holds)."""
    from silofl.inference import predict as run_predict

    return run_predict(Path(run_dir), client, Path(data), Path(out), model=model, overwrite=overwrite)


@_named_by_parameter
def export(
    run_dir: str | Path,
    client: int,
    out: str | Path,
    *,
    model: str = "private",
    format: str = "onnx",  # noqa: A002 - the command line's --format, by the same name
    overwrite: bool = False,
) -> dict[str, Any]:
    """``silofl export``: client ``client``'s model of ``run_dir`` to ONNX (its preprocessing inside the
    graph) with a model card, in the folder ``out``; returns the card."""
    from silofl.inference.export import export as run_export

    return run_export(Path(run_dir), client, Path(out), model=model, fmt=format, overwrite=overwrite)


def _check_makeable(path: str | Path, name: str) -> None:
    """Refuse (one line) a folder that cannot be made, before anything runs: made and removed again."""
    missing, p = [], Path(path)
    while not p.exists():
        missing.append(p)
        p = p.parent
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot make {name} {path}: {e.strerror}") from None
    finally:
        for m in missing:  # deepest first
            if m.is_dir():
                m.rmdir()


# ---------------------------------------------------------------------------------------------- tune
@_named_by_parameter
def tune(
    config: RunConfig | Mapping[str, Any] | str | Path,
    grid: Mapping[str, list[Any]] | list[str],
    *,
    out: str | Path = "runs/tune",
    random_trials: str | None = None,
    max_trials: int | None = None,
    quiet: bool = True,
    console: Any = None,
    site_folders: list[str | Path] | None = None,
    **options: Any,
) -> TuneResult:
    """Search ``grid`` (``{"lr": [1e-3, 3e-3]}`` or ``["lr=0.001,0.003"]``) around ``config`` for its budget
    (``target_epsilon``: every trial's σ is set from it) on the validation split — never the test split — and
    write ``out`` (trials/, tune.json, tune.md, tune.csv, best.yaml). ``random_trials``: K ~ ``poisson:MU`` |
    ``negbin:ETA,GAMMA`` | ``geometric:GAMMA`` | ``logarithmic:GAMMA`` random trials instead of every
    combination, at most ``max_trials``. ``site_folders``: each site's folder, in the order of its table; the
    tuning is charged to each one's ledger before the first trial. ``options``: any run option by its name,
    over ``config``."""
    from silofl.experiments.tune import parse_grid
    from silofl.experiments.tune import tune as run_tune
    from silofl.privacy.tuning import parse_trial_count

    cfg = as_config(config, **options)
    if cfg.target_epsilon is None:
        raise ConfigError("tuning needs a budget: give --target-epsilon E (every trial's σ is set from it)")
    count = parse_trial_count(random_trials) if random_trials is not None else None
    if max_trials is not None and (count is None or max_trials < 1):
        raise ConfigError(
            "--max-trials needs --random-trials and a value of at least 1"
            if count is None
            else f"--max-trials must be at least 1, got {max_trials}"
        )
    if cfg.eval_split != "validation":
        cfg = cfg.replace(eval_split="validation")
    parsed = (
        parse_grid(list(grid)) if not isinstance(grid, Mapping) else {k: list(v) for k, v in grid.items()}
    )
    result = run_tune(
        cfg,
        parsed,
        out,
        progress=not quiet,
        console=console,
        random_trials=count,
        max_trials=max_trials,
        site_folders=site_folders,
    )
    best = result.get("best")
    best_cfg = None
    if best is not None and (Path(out) / "best.yaml").is_file():
        best_cfg = RunConfig.from_yaml(Path(out) / "best.yaml")
        _write_tuned_recipe(best_cfg, result, Path(out))
    return TuneResult(result, Path(out), best_cfg)


TUNED_RECIPE = "recipe.yaml"  # what `silofl tune` chose, as a recipe: `silofl run OUT/recipe.yaml`


def _write_tuned_recipe(best: RunConfig, result: dict[str, Any], out: Path) -> None:
    """``OUT/recipe.yaml``: the chosen config as a recipe (what to run; ``silofl run OUT/recipe.yaml --out
    DIR``), its source the search, with the validation figure and the search's own ε; ``tuning_trials``: how
    many trials the search ran (a run from the recipe with ``--vs-alone`` tunes going alone with as many)."""
    from silofl.runner.recipe import recipe_of

    cost = result.get("random_trials") or result["tuning_cost"]
    chosen = result["best"]
    recipe = recipe_of(
        dataclasses.replace(best, tuning_trials=len(result["trials"])),
        f"tuned-{out.name}",
        f"{best.method} on {best.dataset} with the settings silofl tune chose: {chosen['settings']}.",
        f"silofl tune into {out}: {len(result['trials'])} trials on the validation split, the chosen one's "
        f"{result.get('selection', 'figure')} {chosen['validation']:.4f}; the search itself spent ε up to "
        f"{cost['max']:.3g} per site (tune.json), on top of the final run's.",
    )
    (out / TUNED_RECIPE).write_text(recipe.to_yaml())


# ---------------------------------------------------------------------------------------------- audit
@_named_by_parameter
def audit(
    config: RunConfig | Mapping[str, Any] | str | Path,
    *,
    out: str | Path,
    overwrite: bool = False,
    quiet: bool = True,
    console: Any = None,
    command: str | None = None,
    settings: Any = None,
    engine_factory: Any = None,
    engine: str = "simulator",
    **settings_kw: Any,
) -> AuditResult:
    """Measure what a run of ``config`` leaks and write ``out`` (audit.json, audit.md, attacks.csv, …; the
    audited run in OUT/run): canaries → a one-run empirical ε lower bound beside the accountant's ε, and
    membership inference. ``settings``: a `silofl.auditing.AuditSettings`, or its fields as keywords
    (``canaries=1000``, ``canary_kind="mislabelled"``, ``site=0``, ``seed=…``, ``pubsub_model=…``;
    ``attacks=("inversion",)``: the server's gradient inversion of a hospital's update, client-level methods
    on images). Given as a mapping, the config evaluates only at the last round unless it says ``eval_every``.
    ``engine``: ``simulator`` or ``flower-local`` (a local Flower deployment; gradient canaries);
    ``engine_factory``: the audited run's engine made here (torch.distributed; see
    `silofl.auditing.run_audit`)."""
    from silofl.auditing import AuditSettings, run_audit

    if isinstance(config, Mapping):
        config = dict(config)
        config.setdefault("eval_every", int(config.get("rounds", RunConfig.rounds)))
        if str(config.get("features") or "none") != "none":
            raise ConfigError(
                "silofl audit does not take a feature stage yet: its canaries are drawn from the raw inputs"
            )
    cfg = as_config(config)
    if str(cfg.features or "none") != "none":
        raise ConfigError(
            "silofl audit does not take a feature stage yet: its canaries are drawn from the raw inputs"
        )
    if settings is None:
        if settings_kw.get("seed") is None:  # the audit's seed, else the run's (a seed in the config)
            settings_kw["seed"] = cfg.seed
        settings = AuditSettings(**settings_kw)
    elif settings_kw:
        raise TypeError("give either settings or its fields as keywords, not both")
    from silofl.core.threads import apply as apply_threads

    apply_threads(cfg.threads)
    a = run_audit(
        cfg,
        settings,
        out,
        overwrite=overwrite,
        progress=not quiet,
        console=console,
        command=command,
        engine_factory=engine_factory,
        engine=engine,
    )
    return AuditResult(a, Path(out))


# ---------------------------------------------------------------------------------------------- compare
@_named_by_parameter
def compare(
    config: Any = None,
    *,
    methods: list[str] | None = None,
    seeds: list[int] | None = None,
    run: RunConfig | Mapping[str, Any] | None = None,
    preset: str | None = None,
    variants: list[dict] | None = None,
    out: str | Path | None = None,
    jobs: int | None = None,
    resume: bool = False,
    report_only: bool = False,
    comm_clients: list[int] | None = None,
    quiet: bool = True,
    console: Any = None,
) -> CompareResult:
    """Run methods × variants × seeds with shared run options and write a report (report.md, results.csv/json,
    plots). ``config``: a `silofl.experiments.compare.CompareConfig` or its YAML file; the keywords override
    it. ``run``: the shared run options (a mapping, or a RunConfig whose method, seed and out are ignored)."""
    from silofl.experiments.compare import CompareConfig, run_compare

    if config is None:
        cc = CompareConfig()
    elif isinstance(config, CompareConfig):
        cc = dataclasses.replace(config)
    else:
        cc = CompareConfig.from_yaml(config)
    for name, v in (
        ("methods", methods),
        ("seeds", seeds),
        ("preset", preset),
        ("variants", variants),
        ("jobs", jobs),
        ("comm_clients", comm_clients),
    ):
        if v is not None:
            setattr(cc, name, list(v) if isinstance(v, (list, tuple)) else v)
    if out is not None:
        cc.out = str(out)
    cc.resume = cc.resume or resume
    cc.report_only = cc.report_only or report_only
    if isinstance(run, RunConfig):
        shared = {k: v for k, v in run.to_flat().items() if k not in ("method", "seed", "out")}
        run = {k: list(v) if isinstance(v, tuple) else v for k, v in shared.items()}
    if run is not None:
        cc.run = {**cc.run, **dict(run)}
    report = run_compare(cc, console=console, progress=not quiet)
    return CompareResult(report, Path(cc.out))
