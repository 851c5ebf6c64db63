"""``silofl deploy local``: a real deployment on one machine, for demos and tests.

It makes a CA and a server certificate, a site folder per site (its own keys, its exported partition, its
budget), pins every site's public card in every folder, starts a SuperLink (TLS, SuperNode authentication) and
one site process per site (:func:`silofl.deploy.site_run.serve_site`, each starting its own SuperNode,
outbound to the SuperLink), registers the node keys, submits the run, waits for the coordinator's ServerApp to
write the run folder, and stops every process. The processes are in :mod:`silofl.deploy.procs`; the
coordinator's side is :mod:`silofl.deploy.superlink`; a site's process is :mod:`silofl.deploy.site_run`.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from silofl.core.errors import ConfigError
from silofl.core.extras import require
from silofl.core.forking import fork_server, forking
from silofl.core.private import make_private, private_process
from silofl.deploy.procs import SITE_PRELOAD, ForkedServerApp, Proc, SiteProc, free_port, node_id_of, stop_all
from silofl.deploy.site_run import STOCK_ENV, site_entry
from silofl.deploy.superlink import _import_flower_cli, cli_env, register_nodes, start_run, start_superlink

# moved to procs / site_run / superlink when this module was split; still importable from here
__all__ = ["LocalDeployment", "deploy_local", "make_site_folders", "Proc", "free_port", "stop_all"]
__all__ += ["start_superlink", "cli_env", "register_nodes", "start_run", "run_site", "run_deployment"]
__all__ += ["FAB_DIR", "flower_bin", "flower_env", "submit"]
from silofl.deploy.procs import FAB_DIR, flower_bin, flower_env  # noqa: E402
from silofl.deploy.site_run import run_site  # noqa: E402
from silofl.deploy.superlink import run_deployment, submit  # noqa: E402

log = logging.getLogger("silofl")

SITE_RELAY: Callable[[tuple[str, int]], Any] | None = None  # see LocalDeployment


class LocalDeployment:
    """A CA, a SuperLink and one ``silofl site run`` process per partition of ``split`` under ``dep`` (TLS and
    node authentication unless ``insecure``), ready for runs (:meth:`run`) until :meth:`close`. The sites keep
    running between runs, as an institution's service does."""

    def __init__(
        self,
        cfg,
        split,
        dep: Path,
        insecure: bool = False,
        poll_s: float = 0.1,
        prepare_sites: Callable[[Any, list[Path]], None] | None = None,
    ):
        """``prepare_sites(split, folders)``: called once the site folders are made, before any site starts
        (an audit puts its spec in the audited site's folder)."""
        import secrets as _secrets

        from silofl.deploy.pki import make_ca, make_server_cert, write_private

        self.insecure, self.procs = insecure, []
        self.relay: Any = None
        t0 = time.perf_counter()
        self.phases: dict[str, float] = {}  # seconds of each set-up phase (bench/deployment.py shows them)

        def done(phase: str) -> None:
            self.phases[phase] = time.perf_counter() - t0 - sum(self.phases.values())

        dep.mkdir(parents=True)
        try:
            if not insecure:
                (dep / "pki").mkdir()
                make_ca(dep / "pki")
                make_server_cert(dep / "pki", ["localhost", "127.0.0.1"])
            cards, folders = make_site_folders(cfg, split, dep / "sites")
            if prepare_sites is not None:
                prepare_sites(split, folders)
            done("keys_and_site_folders")
            port = free_port()
            address = f"127.0.0.1:{port}"
            self.address, self.ca = address, None if insecure else dep / "pki" / "ca.crt"
            # the ServerApp forked warm (ForkedServerApp), unless forking is off or Flower runs as shipped
            self.secret = _secrets.token_bytes(32) if forking() and os.environ.get(STOCK_ENV) != "1" else None
            secret_file = None
            if self.secret is not None:
                secret_file = dep / "superexec.secret"
                write_private(secret_file, self.secret)
            self.procs.append(
                start_superlink(dep, port, insecure, poll_s, wait=False, secret_file=secret_file)
            )  # the sites start meanwhile
            # and this process imports what registering the nodes and submitting the run use (seconds)
            threading.Thread(target=_import_flower_cli, daemon=True, name="silofl-import").start()
            self.env = cli_env(dep, address, insecure)
            site_address = address
            if SITE_RELAY is not None:  # e.g. bench/relay.py's wide-area stand-in
                self.relay = SITE_RELAY(("127.0.0.1", port))
                site_address = f"127.0.0.1:{self.relay.port}"
            ca = None if insecure else dep / "pki" / "ca.crt"
            env = {**os.environ, "SILOFL_NO_PROGRESS": "1"}
            for k, folder in enumerate(folders):
                entry = site_entry(folder, site_address, ca, insecure, poll_s)
                self.procs.append(SiteProc(f"site{k}", entry, env, dep / "logs"))
            self.procs[0].wait_for("Uvicorn running", 120)
            done("superlink_serving")
            # registered while the sites load (a site's SuperNode connecting before its key is registered
            # retries)
            node_ids = (
                register_nodes([f / "keys" / "node.pub" for f in folders], self.env)
                if not insecure
                else [None] * len(folders)
            )
            done("nodes_registered")
            for p in self.procs[1:]:
                p.wait_for("SuperNode ID", 180)
            done("sites_connected")
            if insecure:  # without node authentication the node ids are learnt from the sites' logs
                node_ids = [node_id_of(p.text()) for p in self.procs[1:]]
        except BaseException:
            self.close()
            raise
        self.sites = [{**c, "node_id": n} for c, n in zip(cards, node_ids, strict=True)]
        self.extra = {
            "coordinator_keys": str(dep / "coordinator-keys"),
            "state_dir": str(dep / "coordinator-state"),
        }
        self.security = {
            "tls": not insecure,
            "node_auth": not insecure,
            "sealed": True,
            "insecure_flag": insecure,
            "outbound_only_sites": True,
        }
        self.setup_s = time.perf_counter() - t0

    def run(
        self,
        cfg,
        out: Path,
        timeout_s: float = 600.0,
        progress: bool = True,
        call_timeout_s: float = 300.0,
        restart_sites: bool = False,
    ) -> dict:
        """Run ``cfg`` on the sites, writing the run folder ``out``; its summary. A lost site is the
        coordinator's business (it retires it; with ``restart_sites`` its process is restarted and it may
        rejoin); a lost SuperLink ends the run."""
        return start_run(
            cfg.replace(out=str(out), report_nonprivate=True),
            self.sites,
            self.env,
            out,
            timeout_s,
            self.security,
            self.procs[:1],
            progress,
            call_timeout_s,
            restart=self.procs[1:] if restart_sites else None,
            extra=self.extra,
            launch=self._serverapp if self.secret is not None else None,
        )

    def _serverapp(self) -> Proc:
        assert self.secret is not None
        return ForkedServerApp(
            self.address, self.secret, self.ca, self.procs[0].env, self.procs[0].log_path.parent
        )

    def close(self) -> None:
        """Stop every process: the sites together, then the SuperLink (the sites leave it first)."""
        stop_all(self.procs[1:])
        stop_all(self.procs[:1], 2.0)  # the SuperLink keeps nothing: not its SuperExec's 1 s grace and more
        if self.relay is not None:
            self.relay.close()


def deploy_local(
    cfg,
    out: Path,
    timeout_s: float = 600.0,
    insecure: bool = False,
    poll_s: float = 0.1,
    progress: bool = True,
    call_timeout_s: float = 300.0,
    restart_sites: bool = False,
    prepare_sites: Callable[[Any, list[Path]], None] | None = None,
) -> dict:
    """A real deployment of ``cfg`` on this machine (see the module doc); the run's summary.
    ``prepare_sites(split, folders)`` runs once the sites' folders are made, before they start."""
    require("flwr", "deploy", "silofl deploy local")
    import torch

    from silofl.deploy.site import NOT_DEPLOYABLE
    from silofl.runner.data import prepare_data
    from silofl.runner.folder import check_out

    cfg = cfg.resolve()
    if cfg.method in NOT_DEPLOYABLE:
        raise ConfigError(
            f"method {cfg.method} is not run between institutions: {NOT_DEPLOYABLE[cfg.method]}"
        )
    out = Path(out).resolve()
    private_process()  # the sites' and coordinator's folders it makes (and its processes): owner only
    check_out(out)
    make_private(out)  # the run folder, made by the command's lock before it came here
    dep = out / "deployment"
    if dep.exists():
        raise ConfigError(f"{dep} exists: choose another --out")
    if forking():
        fork_server(SITE_PRELOAD)  # its imports overlap the data, keys and SuperLink set-up below
    # the one-machine stand-in for K institutions' own data: raw inputs (each site computes its own features)
    cfg, split = prepare_data(cfg, torch.device("cpu"), features=False)
    deployment = LocalDeployment(cfg, split, dep, insecure, poll_s, prepare_sites)
    try:
        summary = deployment.run(cfg, out, timeout_s, progress, call_timeout_s, restart_sites)
    finally:
        deployment.close()
    summary["deployment"]["setup_s"] = deployment.setup_s
    summary["deployment"]["setup_phases_s"] = deployment.phases
    summary["deployment"].pop("started_s", None)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def make_site_folders(cfg, split, root: Path) -> tuple[list[dict], list[Path]]:
    """One site folder per partition of ``split`` under ``root`` (its exported data, fresh keys, a budget and
    a policy that admit the run — one user plays every party here —, reporting its test figures), with the
    federation's cards pinned in each; (cards, folders)."""
    from silofl.deploy.pki import make_coordinator_keys
    from silofl.deploy.site import SiteConfig, export_data, init_site, pin_federation
    from silofl.runner.loop import site_inputs

    coordinator = make_coordinator_keys(
        root.parent / "coordinator-keys"
    )  # the coordinator's, pinned by every site

    cards, folders = [], []
    lifetime = cfg.target_epsilon * 2 if cfg.target_epsilon else 1e6
    warning = getattr(split, "privacy_unit_warning", None)  # each site's hello repeats it
    for k, inp in enumerate(site_inputs(cfg.info.cls(cfg), split)):
        name = f"site{k}"
        folder = root / name
        folder.mkdir(parents=True)
        export_data(
            folder / "data.safetensors",
            inp.x,
            inp.y,
            inp.external,
            inp.internal,
            {
                "num_classes": split.num_classes,
                "classes": split.dataset.class_names,
                "preprocessing": inp.preprocessing,
                "source": f"{split.source} (partition {k}, exported by deploy local)",
                **({"id_column": inp.id_column} if inp.persons is not None else {}),
                **({"unit_warning": warning} if warning else {}),
            },
            inp.persons,
        )
        sc = SiteConfig(
            name=name,
            data="data.safetensors",
            lifetime_epsilon=lifetime,
            lifetime_delta=max(cfg.delta, 1e-5) if cfg.is_private else 1e-5,
            report_test_figures=True,
            id_column=inp.id_column if inp.persons is not None else None,
            allow_research_seed=cfg.seed is not None,
            allow_non_formal=not cfg.guarantee().formal,
        )
        from silofl.runner.plan import policy_request
        from silofl.site.policy import SitePolicy

        admit = SitePolicy.from_site_json(sc.to_dict()).admitting(policy_request(cfg, k))
        cards.append(init_site(folder, sc, policy=admit))
        folders.append(folder)
    for folder in folders:
        pin_federation(folder, cards, coordinator)
    return cards, folders
