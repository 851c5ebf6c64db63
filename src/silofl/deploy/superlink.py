"""The coordinator's side of a deployment: its SuperLink (:func:`start_superlink`), node registration and run
submission on Flower's Control API, a run started and waited for (:func:`start_run`) and ``silofl deploy
start`` (:func:`run_deployment`)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from silofl.core.errors import ConfigError, SiloflError
from silofl.core.extras import require
from silofl.core.private import make_private, private_process
from silofl.deploy.procs import FAB_DIR, SERVERAPP_START_S, Proc, flower_bin, flower_env

log = logging.getLogger("silofl")

SERVERAPP_EXIT_S = 30.0  # a forked ServerApp's time to push its task's output once its run is done


FEDERATION = "silofl"  # the name of the SuperLink connection in the CLI's config


def start_superlink(
    folder: Path,
    port: int,
    insecure: bool = False,
    poll_s: float = 0.1,
    host: str = "127.0.0.1",
    wait: bool = True,
    secret_file: Path | None = None,
) -> Proc:
    """The coordinator's SuperLink on ``host:port`` with TLS (folder/pki) and SuperNode authentication
    (serving when this returns, unless not ``wait``). It starts each run's ServerApp itself (Flower's
    subprocess isolation: a ``flower-superexec`` process, and a ``flwr-serverapp`` process per run), unless
    ``secret_file`` is given: then the ServerApp's task waits for a SuperExec holding that secret (Flower's
    process isolation; :class:`ForkedServerApp`)."""
    cmd = [
        flower_bin("flower-superlink"),
        "--host",
        host,
        "--port",
        str(port),
        "--disable-runtime-dependency-installation",
    ]
    if secret_file is None:
        cmd += ["--isolation", "subprocess"]
    else:
        cmd += ["--isolation", "process", "--superexec-auth-secret-file", str(secret_file)]
    if insecure:
        cmd.append("--insecure")
    else:
        pki = folder / "pki"
        cmd += [
            "--ssl-ca-certfile",
            str(pki / "ca.crt"),
            "--ssl-certfile",
            str(pki / "server.crt"),
            "--ssl-keyfile",
            str(pki / "server.key"),
            "--enable-supernode-auth",
        ]
    proc = Proc("superlink", cmd, flower_env(folder / "flwr-superlink", poll_s), folder / "logs")
    if wait:
        proc.wait_for("Uvicorn running", 120)
    return proc


def cli_env(folder: Path, address: str, insecure: bool) -> dict[str, str]:
    """The environment of the ``flwr`` CLI talking to the SuperLink at ``address``."""
    env = flower_env(folder / "flwr-cli")
    conn = f'[superlink]\ndefault = "{FEDERATION}"\n\n[superlink.{FEDERATION}]\naddress = "{address}"\n'
    conn += "insecure = true\n" if insecure else f'root-certificates = "{folder / "pki" / "ca.crt"}"\n'
    (folder / "flwr-cli" / "config.toml").write_text(conn)
    return env


def flwr(args: list[str], env: dict[str, str], timeout_s: float = 120) -> dict:
    """Run the ``flwr`` CLI with JSON output; its parsed output, or SiloflError with what it printed."""
    cp = subprocess.run(
        [flower_bin("flwr"), *args, "--format", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    try:
        out = json.loads(cp.stdout)
    except ValueError:
        out = None
    if cp.returncode != 0 or not isinstance(out, dict) or out.get("success") is False:
        raise SiloflError(f"flwr {' '.join(args)} failed: {(cp.stdout + cp.stderr)[-800:]}")
    return out


def register_nodes(pubs: list[Path], env: dict[str, str]) -> list[int]:
    """Register sites' node keys with the SuperLink (only registered nodes may connect); their node ids.

    What ``flwr supernode register`` does for each, in this process and over one connection (a CLI process per
    site cost seconds of imports each); through the CLI on any Flower but the one whose internals
    :mod:`silofl.deploy.flower_shim` knows."""
    from silofl.deploy.flower_shim import supported

    require("flwr", "deploy")
    if not supported():
        return [int(flwr(["supernode", "register", str(pub), FEDERATION], env)["node-id"]) for pub in pubs]
    from flwr.cli.flower_config import read_superlink_connection
    from flwr.cli.supernode.register import try_load_public_key
    from flwr.cli.utils import init_http_client_from_connection
    from flwr.proto.control_pb2 import RegisterNodeRequest

    ids = []
    with _control_api(env, "registering the sites' node keys with the SuperLink"):
        client = init_http_client_from_connection(read_superlink_connection(FEDERATION))
        try:
            for pub in pubs:
                res = client.RegisterNode(RegisterNodeRequest(public_key=try_load_public_key(Path(pub))))
                if not res.node_id:
                    raise SiloflError(f"the SuperLink did not register {pub}")
                ids.append(int(res.node_id))
        finally:
            client.close()
    return ids


_REGISTER_LOCK = threading.Lock()


@contextlib.contextmanager
def _control_api(env: dict[str, str], what: str) -> Iterator[None]:
    """Call Flower's Control API in this process with the deployment's ``FLWR_HOME`` (one caller at a time:
    it is process-wide, put back afterwards); any of Flower's errors becomes one line naming ``what``."""
    with _REGISTER_LOCK:
        old = os.environ.get("FLWR_HOME")
        os.environ["FLWR_HOME"] = env["FLWR_HOME"]
        try:
            yield
        except Exception as e:  # noqa: BLE001 - Flower's errors, as one line
            raise SiloflError(f"{what} failed: {e}") from None
        finally:
            if old is None:
                os.environ.pop("FLWR_HOME", None)
            else:
                os.environ["FLWR_HOME"] = old


def _import_flower_cli() -> None:
    """Import the parts of Flower's CLI that :func:`register_nodes` and :func:`submit` use in-process (while
    the SuperLink starts); a failure is theirs to report."""
    try:
        import flwr.cli.build  # noqa: F401
        import flwr.cli.config_utils  # noqa: F401
        import flwr.cli.flower_config  # noqa: F401
        import flwr.cli.supernode.register  # noqa: F401
        import flwr.cli.utils  # noqa: F401
    except Exception as e:  # noqa: BLE001 - see the doc
        log.debug("importing Flower's CLI failed: %s", e)


def submit(coordinator_json: Path, env: dict[str, str]) -> int:
    """Submit silofl's Flower app for the coordinator folder; the Flower run id.

    What ``flwr run APP FEDERATION --run-config …`` does (build the FAB, StartRun on the Control API), in this
    process (the CLI process cost seconds of imports); through the CLI on any Flower but the one whose
    internals :mod:`silofl.deploy.flower_shim` knows."""
    from silofl.deploy.flower_shim import supported

    override = f'coordinator="{coordinator_json}"'
    require("flwr", "deploy")
    if not supported():
        return int(flwr(["run", str(FAB_DIR), FEDERATION, "--run-config", override], env)["run-id"])
    import hashlib

    from flwr.cli.build import build_fab_from_disk
    from flwr.cli.config_utils import load_and_validate
    from flwr.cli.flower_config import read_superlink_connection
    from flwr.cli.utils import init_http_client_from_connection
    from flwr.common.config import parse_config_args
    from flwr.common.constant import FAB_CONFIG_FILE
    from flwr.common.serde import fab_to_proto, user_config_to_proto
    from flwr.proto.control_pb2 import StartRunRequest
    from flwr.supercore.fab import Fab

    with _control_api(env, "submitting the run to the SuperLink"):
        load_and_validate(FAB_DIR / FAB_CONFIG_FILE)  # as `flwr run` checks the app (ValueError if not)
        conn = read_superlink_connection(FEDERATION)
        fab_bytes = build_fab_from_disk(FAB_DIR)
        req = StartRunRequest(
            fab=fab_to_proto(Fab(hashlib.sha256(fab_bytes).hexdigest(), fab_bytes, {})),
            override_config=user_config_to_proto(parse_config_args([override])),
            federation=conn.federation or "",
            app_spec="",
        )
        client = init_http_client_from_connection(conn)
        try:
            res = client.StartRun(req)
        finally:
            client.close()
    if not res.HasField("run_id"):
        raise SiloflError("the SuperLink did not start the run")
    return int(res.run_id)


def start_run(
    cfg,
    sites: list[dict],
    env: dict[str, str],
    out: Path,
    timeout_s: float,
    security: dict,
    procs: list[Proc] | None = None,
    progress: bool = True,
    call_timeout_s: float = 300.0,
    restart: list[Proc] | None = None,
    extra: dict | None = None,
    launch: Callable[[], Proc] | None = None,
) -> dict:
    """Submit ``cfg`` to the SuperLink the ``flwr`` environment ``env`` points at, over ``sites`` (their
    public cards with their node ids), and wait for the coordinator's ServerApp to write the run folder
    ``out``; its summary (with a ``deployment`` section). ``procs``: local processes whose exit means the run
    failed. ``extra``: the coordinator's key folder (``coordinator_keys``) and state folder (``state_dir``:
    the sites' ledger heads). ``launch``: starts the run's ServerApp once it is submitted (else the SuperLink
    starts it)."""
    coord = out / "coordinator"
    coord.mkdir(parents=True)
    spec = {
        "config": cfg.to_dict(),
        "out": str(out),
        "timeout_s": call_timeout_s,
        "sites": sites,
        "security": security,
        **(extra or {}),
    }
    (coord / "coordinator.json").write_text(json.dumps(spec, indent=1))
    started = time.perf_counter()
    run_id = submit(coord / "coordinator.json", env)
    app = launch() if launch is not None else None
    try:
        status = _wait(
            coord / "status.json",
            [*(procs or []), *([app] if app else [])],
            timeout_s,
            progress,
            cfg.rounds,
            restart or [],
        )
    finally:
        if app is not None:  # it pushes the task's output and exits once the run is done
            with contextlib.suppress(subprocess.TimeoutExpired):
                app.p.wait(SERVERAPP_EXIT_S)
            app.stop(5.0)
    if status["state"] != "done":
        raise SiloflError(f"the deployment failed: {status.get('error')}")
    summary = json.loads((out / "summary.json").read_text())
    summary["deployment"] = {
        "flower_run_id": run_id,
        "sites": [c["name"] for c in sites],
        "started_s": started,
        "submit_to_done_s": time.perf_counter() - started,
        "coordinator": str(coord),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def run_deployment(
    cfg,
    folder: Path | None,
    superlink: str | None,
    timeout_s: float = 3600.0,
    progress: bool = True,
    call_timeout_s: float = 300.0,
) -> dict:
    """``silofl deploy start``: a run over the sites registered in ``folder/federation.json``, through the
    SuperLink at ``superlink`` (this machine runs it: its ServerApp reads the coordinator folder)."""
    from silofl.runner.folder import check_out

    require("flwr", "deploy", "silofl deploy start")
    if folder is None or superlink is None:
        raise ConfigError("a deployed run needs the coordinator's folder and --superlink HOST:PORT")
    fed = Path(folder) / "federation.json"
    if not fed.is_file():
        raise ConfigError(f"{fed} not found: register the sites first (`silofl deploy register`)")
    sites = json.loads(fed.read_text())["sites"]
    cfg = cfg.replace(clients=len(sites))
    out = Path(cfg.out).resolve()
    private_process()  # the coordinator's run folder: 0600 files in 0700 folders
    check_out(out)
    make_private(out)
    if (out / "coordinator").exists():
        raise ConfigError(f"{out / 'coordinator'} exists: choose another --out")
    env = cli_env(Path(folder), superlink, insecure=False)
    security = {
        "tls": True,
        "node_auth": True,
        "sealed": True,
        "insecure_flag": False,
        "outbound_only_sites": True,
    }
    keys = Path(folder).resolve() / "pki"
    if not (keys / "coordinator.sign.key").is_file():
        raise ConfigError(
            f"{keys} has no coordinator keys: run `silofl deploy certs` (it makes them) and give "
            f"{keys / 'coordinator.json'} to every site (`silofl site pin --coordinator`)"
        )
    summary = start_run(
        cfg.replace(out=str(out)),
        sites,
        env,
        out,
        timeout_s,
        security,
        None,
        progress,
        call_timeout_s,
        extra={"coordinator_keys": str(keys), "state_dir": str(Path(folder).resolve() / "state")},
    )
    summary["deployment"].pop("started_s", None)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def _wait(
    status_path: Path, procs: list[Proc], timeout_s: float, progress: bool, rounds: int, restart: list[Proc]
) -> dict:
    from contextlib import nullcontext

    from silofl.runner.loop import progress_bar

    t0 = time.monotonic()
    deadline = t0 + timeout_s + 120
    with progress_bar(None) if progress else nullcontext() as bar:
        task = bar.add_task("deployed run", total=rounds) if bar else None
        while time.monotonic() < deadline:
            st: dict = {"state": "running"}
            if not status_path.is_file() and time.monotonic() - t0 > SERVERAPP_START_S:
                raise SiloflError(
                    f"the coordinator's ServerApp did not start within {SERVERAPP_START_S:g} s of the "
                    "submission (the SuperLink's log says why; e.g. a certificate that does not name "
                    "127.0.0.1, where the SuperLink starts it)"
                )
            if status_path.is_file():
                try:
                    st = json.loads(status_path.read_text())
                except ValueError:
                    pass
                if st.get("state") != "running":
                    return st
                if bar and isinstance(st.get("round"), int):
                    bar.update(task, completed=max(0, st["round"] - 1))
            for p in procs:
                if p.p.poll() is not None:
                    raise SiloflError(
                        f"{p.name} exited during the run ({p.p.returncode}): {p.text()[-1500:]}"
                    )
            for p in restart:  # a site's operator restarts its service; it rejoins from its own checkpoint
                if p.p.poll() is not None:
                    log.warning("%s exited (%s); restarting it", p.name, p.p.returncode)
                    p.restart()
            time.sleep(0.2)
    raise SiloflError(f"the deployment did not finish within {timeout_s:g} s")
