"""``silofl site`` (a site's own commands) and ``silofl deploy`` (the coordinator's, and ``deploy local``).

Between institutions (README, "Deploying between institutions"):

* the coordinator: ``silofl deploy certs DIR --host NAME`` (CA and SuperLink certificate), ``silofl deploy
  superlink DIR`` (TLS, node authentication), ``silofl deploy register DIR CARD.json…`` and ``silofl deploy
  start DIR --site-card …`` (submits the run);
* each site: ``silofl site init DIR --name … --data … --lifetime-epsilon …`` (keys, budget), ``silofl site pin
  DIR CARD.json…`` (the federation's public cards), ``silofl site run DIR --superlink HOST:PORT --ca ca.crt``.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import typer

from silofl.cli.common import check_seconds, friendly_errors
from silofl.cli.config_options import config_command, run_options
from silofl.core.errors import ConfigError

site_app = typer.Typer(
    no_args_is_help=True, help="A site's own commands: its folder, keys, budget, and joining runs."
)
deploy_app = typer.Typer(
    no_args_is_help=True, help="Deploy between institutions on Flower (and `deploy local`)."
)


@site_app.command("init")
@friendly_errors
def site_init(
    folder: Path = typer.Argument(..., help="The site folder to create (refused if it holds a site)."),
    name: str = typer.Option(..., "--name", help="The site's name in the federation."),
    data: str = typer.Option(
        ...,
        "--data",
        help="Its data: a silofl export (.safetensors), a table (.csv/.parquet, "
        "with --schema) or an image folder.",
    ),
    lifetime_epsilon: float = typer.Option(
        ..., "--lifetime-epsilon", help="The most ε this site ever spends, over every run."
    ),
    lifetime_delta: float = typer.Option(1e-5, "--lifetime-delta"),
    schema: str | None = typer.Option(None, "--schema", help="The collaboration's schema, for a table."),
    private_model: str | None = typer.Option(
        None, "--private-model", help="Its private model (never leaves it)."
    ),
    report_test_figures: bool = typer.Option(
        False,
        "--report-test-figures",
        help="Report figures of non-private data (the private model's accuracy) to the coordinator.",
    ),
    allow_research_seed: bool = typer.Option(
        False,
        "--allow-research-seed",
        help="Accept seeded research runs (whoever knows the seed can reproduce this site's noise).",
    ),
    id_column: str | None = typer.Option(
        None,
        "--id-column",
        help="The table's column naming each row's person: the site then samples, clips and accounts by "
        "person in every run (person-level DP).",
    ),
):
    """Create a site folder: site.json (its decisions), fresh keys, its public card (keys/public.json)."""
    from silofl.deploy.site import SiteConfig, init_site, load_local
    from silofl.privacy.ledger import check_site_name

    check_site_name(name)
    cfg = SiteConfig(
        name=name,
        data=str(Path(data).resolve()),
        lifetime_epsilon=lifetime_epsilon,
        lifetime_delta=lifetime_delta,
        private_model=private_model,
        schema=str(Path(schema).resolve()) if schema else None,
        report_test_figures=report_test_figures,
        allow_research_seed=allow_research_seed,
        id_column=id_column,
    )
    if not (math.isfinite(lifetime_epsilon) and lifetime_epsilon > 0 and 0 < lifetime_delta < 1):
        raise ConfigError("the lifetime budget needs 0 < ε < ∞ and 0 < δ < 1")
    local = load_local(folder, cfg)  # the data must be readable (and hold the id column) before it is written
    init_site(folder, cfg)  # with the safe default policy, signed (`silofl site policy` edits it)
    if (
        local.unit_warning
    ):  # an id-like column repeats and no --id-column: silofl.data.sites.repeated_id_warning
        typer.echo(f"warning: site {name}: {local.unit_warning['message']}", err=True)
    typer.echo(
        f"site {name} in {folder}: give {folder / 'keys' / 'public.json'} to the coordinator and the other "
        f"sites; its policy (policy.json, `silofl site policy`) accepts DP-SGD and secure sums only; its "
        f"privacy unit: {f'person (column {id_column})' if id_column else 'row'}"
    )


@site_app.command("policy")
@friendly_errors
def site_policy(
    folder: Path = typer.Argument(..., help="The site folder."),
    allow_unit: list[str] = typer.Option([], "--allow-unit", help="Accept this privacy unit (repeatable)."),
    refuse_unit: list[str] = typer.Option([], "--refuse-unit", help="Refuse this privacy unit."),
    allow_placement: list[str] = typer.Option(
        [], "--allow-placement", help="Accept this noise placement: local, secure, none (repeatable)."
    ),
    refuse_placement: list[str] = typer.Option([], "--refuse-placement", help="Refuse this placement."),
    trust_server_noise: bool | None = typer.Option(
        None,
        "--trust-server-noise/--no-trust-server-noise",
        help="Client-level DP without secure aggregation: upload clipped, un-noised sums for the "
        "coordinator to noise.",
    ),
    min_survivors: int | None = typer.Option(
        None, "--min-survivors", help="The least parties whose noise reaches every secure sum (≥ 2)."
    ),
    survivor_fraction: float | None = typer.Option(
        None, "--survivor-fraction", help="... and at least this share of a secure round's sample."
    ),
    colluders: int | None = typer.Option(
        None, "--colluders", help="Sites assumed to collude with the server (the per-threat ε uses it)."
    ),
    min_noise: float | None = typer.Option(
        None, "--min-noise", help="The least noise multiplier of a secure sum."
    ),
    max_rounds: int | None = typer.Option(None, "--max-rounds", help="The most rounds of one run."),
    min_sigma: float | None = typer.Option(
        None, "--min-sigma", help="The smallest noise multiplier of a run."
    ),
    allow_feature: list[str] = typer.Option([], "--allow-feature", help="Accept this feature stage."),
    register_backbone: list[str] = typer.Option(
        [], "--register-backbone", help="NAME=DIR: a backbone of this site's own, named for runs."
    ),
    unregister_backbone: list[str] = typer.Option([], "--unregister-backbone", help="NAME: forget it."),
    allow_research_seed: bool | None = typer.Option(
        None, "--allow-research-seed/--refuse-research-seed", help="Accept seeded research runs."
    ),
    allow_non_formal: bool | None = typer.Option(
        None, "--allow-non-formal/--refuse-non-formal", help="Accept runs whose ε is not a formal guarantee."
    ),
    clear_limits: bool = typer.Option(
        False, "--clear-limits", help="Drop --max-rounds, --min-sigma and --min-noise."
    ),
):
    """Show or change the site's own privacy policy (policy.json, signed with its key; no coordinator sets or
    widens it). Without options: print it."""
    from silofl.site.folder import SiteFolder
    from silofl.site.policy import policy_changes, save_policy

    site = SiteFolder.load(folder)
    old = site.policy
    changes = policy_changes(
        old,
        units=(allow_unit, refuse_unit),
        placements=(allow_placement, refuse_placement),
        features=allow_feature,
        backbones=(_backbones(register_backbone), unregister_backbone),
        limits=dict(max_rounds=max_rounds, min_sigma=min_sigma, min_noise=min_noise, clear=clear_limits),
        trust_server_noise=trust_server_noise,
        min_survivors=min_survivors,
        survivor_fraction=survivor_fraction,
        colluders=colluders,
        allow_research_seed=allow_research_seed,
        allow_non_formal=allow_non_formal,
    )
    if changes != old:
        save_policy(site, changes)
    typer.echo(f"site {site.name}'s policy: {changes.describe()}")


def _backbones(pairs: list[str]) -> dict[str, str]:
    """NAME=DIR pairs, each DIR this site's own backbone (checked here, by the site's operator)."""
    from silofl.features.backbone import read_card

    out = {}
    for pair in pairs:
        name, sep, d = pair.partition("=")
        if not sep or not name or not d:
            raise ConfigError(f"--register-backbone takes NAME=DIR, got {pair[:80]!r}")
        path = Path(d).expanduser().resolve()
        read_card(path)  # the site's own directory: its operator may see why it is not a backbone
        out[name] = str(path)
    return out


@site_app.command("pin")
@friendly_errors
def site_pin(
    folder: Path = typer.Argument(...),
    cards: list[Path] = typer.Argument(..., help="public.json of every site of the federation"),
    coordinator: Path | None = typer.Option(
        None,
        "--coordinator",
        help="The coordinator's card "
        "(pki/coordinator.json from `silofl deploy certs`): a server "
        "role's models are taken only when signed by it.",
    ),
):
    """Pin the federation's public cards in the site folder (payloads are sealed to and checked against
    them)."""
    from silofl.deploy.site import SiteConfig, pin_federation

    SiteConfig.load(folder)
    from silofl.deploy.pki import check_keys, read_card

    coord = read_card(coordinator, check_keys) if coordinator is not None else None
    pin_federation(folder, [_card(c) for c in cards], coord)
    typer.echo(
        f"pinned {len(cards)} sites{' and the coordinator' if coord else ''} in {folder / 'federation.json'}"
    )


@site_app.command("budget")
@friendly_errors
def site_budget(
    folder: Path = typer.Argument(..., help="The site folder."),
    lifetime_epsilon: float = typer.Option(..., "--lifetime-epsilon", help="The new lifetime ε."),
    lifetime_delta: float | None = typer.Option(
        None, "--lifetime-delta", help="The new lifetime δ (default: as is)."
    ),
    why: str = typer.Option(..., "--why", help="Why it changes (recorded in the ledger)."),
):
    """Change the site's lifetime budget: a ledger entry (old → new, when, why); site.json follows. Editing
    site.json alone changes nothing (the ledger is the budget of record)."""
    from silofl.deploy.site import SiteWorker
    from silofl.site.folder import SiteFolder

    site = SiteFolder.load(folder)  # a folder of an earlier format is converted first
    SiteWorker.check_folder_ledger(folder)  # a missing, shorter or foreign ledger is refused first
    old = site.lifetime
    delta = lifetime_delta if lifetime_delta is not None else old[1]
    site.set_lifetime(lifetime_epsilon, delta, why)  # the ledger entry, then site.json follows
    typer.echo(
        f"site {site.name}: lifetime budget ε {old[0]:g} → {lifetime_epsilon:g}, δ {old[1]:g} → {delta:g}, "
        f"recorded in its ledger (one budget for deployment, PubSub-ML and simulations)"
    )


@site_app.command("ledger")
@friendly_errors
def site_ledger(
    folder: Path = typer.Argument(..., help="The site folder."),
    recompute: bool = typer.Option(
        False,
        "--recompute",
        help="Recompute the composed ε with dp-accounting's RDP accountant, side by side with the site's.",
    ),
):
    """Print the site's ledger: each entry (seq, kind, unit, mechanism parameters) and the composed ε per
    threat — outsiders, the server, the server plus the colluders its policy assumes — by its one accountant;
    with --recompute, dp-accounting's figures beside them, naming what it cannot recompute on its own."""
    from silofl.privacy.site_accountant import statement, threat_label
    from silofl.site.folder import SiteFolder

    site = SiteFolder.load(folder)
    colluders = site.policy.colluders
    life = site.lifetime
    st = statement(site.accountant(colluders), life[1], independent=recompute)
    typer.echo(
        f"site {site.name}: {len(st['entries'])} ledger entries; lifetime ε {life[0]:g}, δ {life[1]:g}; "
        f"its policy assumes {colluders} colluding site{'s' if colluders != 1 else ''}"
    )
    typer.echo(f"{'seq':>4}  {'kind':<16} {'unit':<22} mechanism")
    for row in st["entries"]:
        params = json.dumps(row["parameters"], ensure_ascii=False, separators=(",", ":"), default=str)
        params = params if len(params) <= 160 else params[:157] + "..."
        typer.echo(f"{row['seq']!s:>4}  {row['kind']!s:<16} {row['unit'] or '—'!s:<22} {params}")
    eps = st["epsilon"]
    show = lambda x: "no guarantee" if x is None else f"{x:.4f}"  # noqa: E731
    typer.echo(f"composed ε at δ {life[1]:g} ({st['accountant']}; unit: {st['unit'] or '—'}):")
    for t, label in ((t, threat_label(t, colluders)) for t in eps):
        typer.echo(f"  against {label}: ε {show(eps[t])}")
    if st.get("caveat"):
        typer.echo(f"  note: {st['caveat']}")
    if not recompute:
        return
    rc = st["recomputed"]
    typer.echo(f"recomputed by {rc['accountant']}:")
    typer.echo(f"  {'threat':<10} {'silofl':>14} {'dp-accounting':>14}   part")
    for part, name in (("whole", "whole ledger"), ("independent_part", "independent part")):
        for t, v in rc[part].items():
            typer.echo(f"  {t:<10} {show(v['silofl']):>14} {show(v['dp_accounting']):>14}   {name}")
    typer.echo(
        f"  independent part: {', '.join(rc['independent_kinds']) or 'nothing'} (dp-accounting's events)"
    )
    if rc["not_independent"]:
        typer.echo(
            f"  not recomputed independently: {', '.join(rc['not_independent'])} (dp-accounting has no "
            "event for it: silofl's own RDP curve, added to both figures)"
        )
    if rc["as_recorded"]:
        typer.echo(f"  taken as recorded: {', '.join(rc['as_recorded'])} ((ε, δ) releases, composed on top)")


@site_app.command("ledger-restore")
@friendly_errors
def site_ledger_restore(
    folder: Path = typer.Argument(..., help="The site folder whose ledger was lost."),
    spent_epsilon: float = typer.Option(
        ...,
        "--spent-epsilon",
        help="The ε the site had spent before (declared; it counts against the lifetime budget).",
    ),
    spent_delta: float = typer.Option(0.0, "--spent-delta", help="The δ it had spent before."),
    why: str = typer.Option(..., "--why", help="What happened (recorded in the ledger)."),
):
    """Start a new ledger after the old one was lost, recording the declared prior spend and a new epoch (the
    coordinator accepts the restored ledger's head; the old file, if any, is kept beside it)."""
    from silofl.deploy.site import SiteConfig, SiteState
    from silofl.privacy.ledger import restore_ledger

    cfg = SiteConfig.load(folder)
    card = json.loads((folder / "keys" / "public.json").read_text())
    state = SiteState(folder.resolve())
    led = restore_ledger(
        folder / "ledger",
        cfg.name,
        card["sign"],
        (cfg.lifetime_epsilon, cfg.lifetime_delta),
        spent_epsilon,
        spent_delta,
        why,
        state.head,
    )
    typer.echo(
        f"site {cfg.name}: a new ledger ({len(led.entries)} entries) declaring a prior spend of ε "
        f"{spent_epsilon:g}, δ {spent_delta:g}; lifetime budget ε {cfg.lifetime_epsilon:g}, δ "
        f"{cfg.lifetime_delta:g}"
    )


def _card(path: Path) -> dict:
    from silofl.deploy.pki import read_card

    return read_card(path)  # a plain name, hex keys, one node key line: checked before anything is written


@site_app.command("run")
@friendly_errors
def site_run(
    site_dir: Path = typer.Option(..., "--site-dir", help="The site folder."),
    superlink: str = typer.Option(..., "--superlink", help="The coordinator's SuperLink, HOST:PORT."),
    ca: Path | None = typer.Option(None, "--ca", help="The coordinator's CA certificate (TLS)."),
    insecure: bool = typer.Option(
        False, "--insecure", help="No TLS and no node authentication (tests only)."
    ),
    poll_s: float = typer.Option(
        0.1, "--poll-s", help="Seconds between the SuperNode's polls of the SuperLink for a task."
    ),
):
    """Serve this site to the coordinator until stopped: its worker and a SuperNode connecting out over
    TLS."""
    from silofl.deploy.site_run import serve_site

    check_seconds("--poll-s", poll_s)
    serve_site(str(site_dir), superlink, None if ca is None else str(ca), insecure=insecure, poll_s=poll_s)


@config_command(deploy_app, "local", exclude=("clients",))
def deploy_local_cmd(
    sites: int = typer.Option(
        ..., "--sites", help="Sites (K), each its own SuperNode process with its own folder."
    ),
    timeout_s: float = typer.Option(
        900.0, "--timeout", rich_help_panel="Engine", help="Seconds the run may take."
    ),
    insecure: bool = typer.Option(
        False,
        "--insecure",
        rich_help_panel="Engine",
        help="No TLS, no node authentication (recorded in the summary; payloads stay sealed).",
    ),
    restart_sites: bool = typer.Option(
        False,
        "--restart-sites",
        rich_help_panel="Engine",
        help="Restart a site "
        "process that dies (as its operator would): it rejoins from its own checkpoint "
        "(with --checkpoint-every).",
    ),
    peer_timeout: float = typer.Option(
        300.0, "--peer-timeout", rich_help_panel="Engine", help="Seconds to wait for a site's answer."
    ),
    config: Path | None = typer.Option(None, "--config", help="YAML file with any run options."),
    set_: list[str] = typer.Option(
        [], "--set", help="Any other run option, KEY=VALUE (YAML value); repeatable."
    ),
    quiet: bool = typer.Option(False, "--quiet", rich_help_panel="Output", help="No progress bar."),
):
    """A real deployment on this machine: CA, certificates and keys, a site folder per site with its own
    partition, a SuperLink and K SuperNodes as separate processes; writes the same run folder as `silofl run`
    (every run option below, e.g. --method proxyfl --rounds 3 --out runs/d)."""
    from silofl.api import EngineOptions
    from silofl.cli.main import run_command
    from silofl.runner.config import RunConfig

    if sites < 1:
        raise ConfigError("--sites must be at least 1")
    check_seconds("--timeout", timeout_s)
    check_seconds("--peer-timeout", peer_timeout)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    cfg = RunConfig.from_dict(run_options(config, set_, clients=sites))
    run_command(
        cfg,
        engine="flower-local",
        quiet=quiet,
        engine_options=EngineOptions(
            timeout_s=timeout_s, peer_timeout_s=peer_timeout, insecure=insecure, restart_sites=restart_sites
        ),
    )


# ---------------------------------------------------------------------------------------------- the
# coordinator
@deploy_app.command("certs")
@friendly_errors
def deploy_certs(
    folder: Path = typer.Argument(..., help="The coordinator's deployment folder."),
    host: list[str] = typer.Option(
        ..., "--host", help="A name or IP address the sites reach the SuperLink at (repeatable)."
    ),
    days: int = typer.Option(365, "--days", help="Validity of the certificates."),
):
    """Make the deployment's CA and the SuperLink's TLS certificate (FOLDER/pki); give pki/ca.crt to every
    site."""
    from silofl.deploy.pki import make_ca, make_coordinator_keys, make_server_cert

    if not 1 <= days <= 36500:
        raise ConfigError(f"--days must lie in [1, 36500], got {days}")
    pki = folder / "pki"
    if (pki / "ca.key").exists():
        if not (pki / "coordinator.sign.key").exists():  # a folder made before the coordinator had keys
            make_coordinator_keys(pki)
            typer.echo(
                f"{pki} already holds a CA (kept); made the coordinator's keys: give "
                f"{pki / 'coordinator.json'} "
                "to every site"
            )
            return
        raise ConfigError(f"{pki} already holds a CA: certificates are never overwritten")
    pki.mkdir(parents=True, exist_ok=True)
    make_ca(pki, days=days)
    # the SuperLink's own ServerApp executor reaches it over TLS at 127.0.0.1 on its machine, whatever name
    # the sites use
    make_server_cert(pki, [*dict.fromkeys([*host, "127.0.0.1"])], days=days)
    make_coordinator_keys(pki)
    typer.echo(
        f"CA, SuperLink certificate for {', '.join(host)} and the coordinator's keys in {pki}; give "
        f"{pki / 'ca.crt'} and {pki / 'coordinator.json'} to every site"
    )


@deploy_app.command("superlink")
@friendly_errors
def deploy_superlink(
    folder: Path = typer.Argument(
        ..., help="The coordinator's deployment folder (with pki/ from `deploy certs`)."
    ),
    host: str = typer.Option("0.0.0.0", "--host", help="Address to listen on."),
    port: int = typer.Option(9092, "--port"),
):
    """Run the SuperLink (TLS, only registered SuperNodes admitted) until Ctrl-C; sites connect out to it."""
    import time

    from silofl.deploy.superlink import start_superlink

    folder = folder.resolve()  # Flower reads certificate paths as absolute ones
    if not 1 <= port <= 65535:
        raise ConfigError(f"--port must lie in [1, 65535], got {port}")
    if not (folder / "pki" / "server.crt").is_file():
        raise ConfigError(
            f"{folder / 'pki'} has no certificate: run `silofl deploy certs {folder} --host NAME` first"
        )
    import signal

    def stop(signum, frame):  # noqa: ARG001 - SIGTERM stops the SuperLink too
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    proc = start_superlink(folder, port, host=host)
    typer.echo(
        f"SuperLink on {host}:{port} (TLS, SuperNode authentication); log: {proc.log_path}; Ctrl-C stops it"
    )
    try:
        while proc.p.poll() is None:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        proc.stop()


@deploy_app.command("register")
@friendly_errors
def deploy_register(
    folder: Path = typer.Argument(..., help="The coordinator's deployment folder."),
    cards: list[Path] = typer.Argument(..., help="Every site's keys/public.json, in the order of the sites."),
    superlink: str = typer.Option(
        ..., "--superlink", help="The SuperLink, HOST:PORT (as the certificate names it)."
    ),
):
    """Register every site's node key with the SuperLink (only they may connect) and write
    FOLDER/federation.json."""
    from silofl.deploy.superlink import cli_env, register_nodes

    folder = folder.resolve()  # the flwr CLI's configuration takes the CA certificate's absolute path
    parsed = [_card(c) for c in cards]
    names = [c["name"] for c in parsed]
    if len(set(names)) != len(names):
        raise ConfigError("two cards share a site name")
    env = cli_env(folder, superlink, insecure=False)
    pubs = []
    from silofl.deploy.site import inside

    for c in parsed:
        pub = inside(folder / "nodes", f"{c['name']}.pub")  # a checked plain name: never outside
        pub.parent.mkdir(parents=True, exist_ok=True)
        pub.write_text(c["node"].strip() + f" {c['name']}\n")
        pubs.append(pub)
    sites = [{**c, "node_id": n} for c, n in zip(parsed, register_nodes(pubs, env), strict=True)]
    (folder / "federation.json").write_text(json.dumps({"sites": sites}, indent=1) + "\n")
    typer.echo(f"registered {len(sites)} sites; federation in {folder / 'federation.json'}")


@config_command(deploy_app, "start")
def deploy_start(
    folder: Path = typer.Argument(..., help="The coordinator's deployment folder (registered sites)."),
    superlink: str = typer.Option(
        ..., "--superlink", rich_help_panel="Engine", help="The SuperLink, HOST:PORT."
    ),
    timeout_s: float = typer.Option(
        3600.0, "--timeout", rich_help_panel="Engine", help="Seconds the run may take."
    ),
    peer_timeout: float = typer.Option(
        300.0, "--peer-timeout", rich_help_panel="Engine", help="Seconds to wait for a site's answer."
    ),
    config: Path | None = typer.Option(None, "--config", help="YAML file with any run options."),
    set_: list[str] = typer.Option(
        [], "--set", help="Any other run option, KEY=VALUE (YAML value); repeatable."
    ),
    quiet: bool = typer.Option(False, "--quiet", rich_help_panel="Output", help="No progress bar."),
):
    """Start a run on the registered sites (each running `silofl site run`); run on the SuperLink's machine.
    Each site reads its own data (its site.json); every run option below applies (e.g. --method proxyfl
    --rounds 100 --out runs/x)."""
    from silofl.api import EngineOptions
    from silofl.cli.main import run_command
    from silofl.runner.config import RunConfig

    check_seconds("--timeout", timeout_s)
    check_seconds("--peer-timeout", peer_timeout)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    cfg = RunConfig.from_dict(run_options(config, set_, data_at_sites=True))
    run_command(
        cfg,
        engine="flower",
        quiet=quiet,
        engine_options=EngineOptions(
            timeout_s=timeout_s, peer_timeout_s=peer_timeout, deployment=folder.resolve(), superlink=superlink
        ),
    )
