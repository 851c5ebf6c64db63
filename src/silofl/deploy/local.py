"""Processes of a deployment: a site's SuperNode beside its worker (``silofl site run``), the coordinator's
SuperLink, node registration and run submission — and ``silofl deploy local``, all of it on one machine.

``deploy local`` is a real deployment on loopback, for demos and tests: it makes a CA and a server
certificate, a site folder per site (its own keys, its exported partition, its budget), pins every site's
public card in every folder, starts a SuperLink (TLS, SuperNode authentication) and one ``silofl site run``
process per site (each starting its own SuperNode, outbound to the SuperLink), registers the node keys,
submits the run, waits for the coordinator's ServerApp to write the run folder, and stops every process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from silofl.core.errors import ConfigError, SiloflError
from silofl.core.extras import require
from silofl.core.forking import ForkedChild, ForkedPopen, detach, fork_server, forking, run_cli
from silofl.core.private import make_private, private_process

log = logging.getLogger("silofl")

FAB_DIR = Path(__file__).parent / "fab"
FEDERATION = "silofl"  # the name of the SuperLink connection in the CLI's config
SERVERAPP_START_S = 180.0  # a submitted run whose ServerApp has not said a word by then is not coming
SERVERAPP_EXIT_S = 30.0  # a forked ServerApp's time to push its task's output once its run is done
SERVERAPP_POLL_S = 0.02  # deploy local's wait for the ServerApp task of the run it has just submitted


def flower_bin(name: str) -> str:
    """A Flower executable installed beside this Python."""
    require("flwr", "deploy")
    p = Path(sys.executable).parent / name
    found = str(p) if p.exists() else shutil.which(name)
    if not found:
        raise ConfigError(
            f"{name} not found beside {sys.executable}: pip install 'silofl[deploy]' into this environment"
        )
    return found


def flower_env(home: Path, poll_s: float = 0.1) -> dict[str, str]:
    """The environment of a Flower process: its own home, no telemetry, no update check, quick task
    polling."""
    env = dict(os.environ)
    bin_dir = str(
        Path(sys.executable).parent
    )  # Flower starts its helpers (flower-superexec, flwr-*app) by name
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env.update(
        {
            "FLWR_HOME": str(home),
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "PYTHONUNBUFFERED": "1",
            "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": str(poll_s),
            "SILOFL_NO_PROGRESS": "1",
        }
    )
    home.mkdir(parents=True, exist_ok=True)
    return env


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when the parent dies, so a site's SuperNode never outlives
    its
    worker (it would hold the site's node id with nobody behind it)."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class Proc:
    """A child process in its own process group, its output in a log file."""

    def __init__(
        self,
        name: str,
        cmd: list[str],
        env: dict[str, str],
        log_dir: Path,
        die_with_parent: bool = False,
        log_name: str | None = None,
    ):
        self.name, self.cmd, self.env = name, cmd, env
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{log_name or name}.log"
        self.preexec = _die_with_parent if die_with_parent else None
        self._start()

    def _start(self) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.offset = self._log.tell()  # this start's output begins here
        self.p = self._spawn()

    def _spawn(self) -> subprocess.Popen:
        """The process of this start, its output appended to the log (subclasses fork it instead)."""
        return subprocess.Popen(
            self.cmd,
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=self.preexec,
        )

    def restart(self) -> None:
        """Start the same command again (its log goes on)."""
        self.stop(5)
        self._start()

    def text(self) -> str:
        """Its output since it was (re)started."""
        with open(self.log_path, "rb") as f:
            f.seek(self.offset)
            return f.read().decode(errors="replace")

    def wait_for(self, needle: str, timeout_s: float, stop: threading.Event | None = None) -> None:
        """Wait until ``needle`` appears in its output; SiloflError if it exits, the time runs out or
        ``stop`` is set."""
        deadline = time.monotonic() + timeout_s
        while needle not in self.text():
            if stop is not None and stop.is_set():
                raise SiloflError(f"{self.name}: stopped before it was ready")
            if self.p.poll() is not None:
                raise SiloflError(f"{self.name} exited ({self.p.returncode}): {self.text()[-1500:]}")
            if time.monotonic() > deadline:
                raise SiloflError(f"{self.name}: not ready within {timeout_s:g} s: {self.text()[-1500:]}")
            time.sleep(0.1)

    def stop(self, timeout_s: float = 15.0, signalled: bool = False) -> None:
        """SIGTERM to its group (unless ``signalled``: :meth:`terminate` sent it), then SIGKILL if it
        lingers."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not signalled or sig == signal.SIGKILL:
                try:
                    os.killpg(self.p.pid, sig)
                except ProcessLookupError:
                    break
            try:
                self.p.wait(timeout_s)
                break
            except subprocess.TimeoutExpired:
                continue
        self._log.close()

    def terminate(self) -> None:
        """SIGTERM to its group, without waiting (:meth:`stop` with ``signalled`` then waits)."""
        try:
            os.killpg(self.p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


# ---------------------------------------------------------------------------------------------- forked sites
SITE_PRELOAD = "silofl.deploy.site_preload"  # what every site worker imports, imported once per deployment


class ForkedProc(Proc):
    """``silofl ARGS`` (a site worker) forked from a fork server that imported torch, the run loop and Flower
    once (:mod:`silofl.core.forking`, :data:`SITE_PRELOAD`): the same command, log, session and signals as a
    :class:`Proc`, without each site's interpreter importing them again — seconds of CPU per site, which on a
    machine with fewer cores than sites is most of a deployment's set-up. With ``SILOFL_FORK_WORKERS=0`` it
    is a plain :class:`Proc` of the same command."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log_dir: Path):
        self.args = args
        super().__init__(name, [sys.executable, "-m", "silofl.cli.main", *args], env, log_dir)

    def _spawn(self):
        if not forking():
            return super()._spawn()
        return ForkedPopen(SITE_PRELOAD, run_cli, (self.args, self.env, str(self.log_path)), self.name)


def acquire_serverapp_task(address: str, secret: bytes, ca: Path | None, timeout_s: float) -> str:
    """The token of the ServerApp task the SuperLink at ``address`` holds for a submitted run, taken as
    Flower's SuperExec takes it (``AcquireTask``, signed with ``secret``; TLS with ``ca``)."""
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.constant import TaskType

    from silofl.deploy.executor import POLL_GAP_S, runtime_client

    client = runtime_client(address, secret=secret, root_certificates=ca.read_bytes() if ca else None)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                res = client.AcquireTask(AcquireTaskRequest(supported_task_types=[str(TaskType.SERVER_APP)]))
                if res.HasField("task") and res.token:
                    return str(res.token)
                wait = SERVERAPP_POLL_S
            except Exception as e:  # noqa: BLE001 - the SuperLink busy or restarting: ask again
                log.debug("AcquireTask (ServerApp) failed: %s", e)
                wait = POLL_GAP_S
            if time.monotonic() > deadline:
                raise SiloflError(
                    f"the SuperLink did not hand out the run's ServerApp task within {timeout_s:g} s of the "
                    "submission (its log says why)"
                )
            time.sleep(wait)
    finally:
        client.close()


def run_forked_serverapp(
    address: str, token: str, ca: str | None, env: dict[str, str], log_path: str
) -> None:
    """A forked ServerApp's body: Flower's own ``flwr-serverapp`` run (:func:`run_serverapp`: pull the task's
    input, install its FAB, load the ServerApp, heartbeat, push the task's output) with the task's token."""
    from queue import Queue

    detach(env, log_path)
    from flwr.superlink.runtime.run_serverapp import run_serverapp

    run_serverapp(
        runtime_api_address=address,
        log_queue=Queue(),
        token=token,
        insecure=ca is None,
        certificates=Path(ca).read_bytes() if ca else None,
        runtime_dependency_install=False,
    )


class ForkedServerApp(Proc):
    """The coordinator's ServerApp for the run just submitted to the SuperLink at ``address`` (which runs with
    Flower's process isolation, its SuperExec secret ``secret``): the task is taken as Flower's SuperExec
    takes it, and Flower's ``run_serverapp`` runs it with the task's token in a process forked from
    ``deploy local``'s fork server, which has imported Flower, torch and silofl's coordinator once
    (:data:`SITE_PRELOAD`) — instead of a ``flower-superexec`` process starting a ``flwr-serverapp`` process
    that imports them again (seconds of CPU per run). Its output goes to the SuperLink's log, as a
    ``flwr-serverapp``'s does."""

    def __init__(self, address: str, secret: bytes, ca: Path | None, env: dict[str, str], log_dir: Path):
        self.address, self.ca = address, ca
        self.token = acquire_serverapp_task(address, secret, ca, SERVERAPP_START_S)
        super().__init__("the coordinator's ServerApp", [], env, log_dir, log_name="superlink")

    def _spawn(self):
        ca = str(self.ca) if self.ca else None
        return ForkedPopen(
            SITE_PRELOAD,
            run_forked_serverapp,
            (self.address, self.token, ca, self.env, str(self.log_path)),
            "silofl-serverapp",
        )


SUPERNODE_MODULE = "flwr.supernode.cli.flower_supernode"  # imported by SITE_PRELOAD


def run_forked_supernode(args: list[str], env: dict[str, str], log_path: str) -> None:
    """A forked SuperNode's body: its own session, log and environment, ended with its site's worker, then
    the paced ``flower-supernode ARGS`` (:func:`silofl.deploy.flower_shim.main`)."""
    from silofl.deploy import flower_shim

    detach(env, log_path)
    _die_with_parent()
    for h in logging.root.handlers[:]:  # the worker's logging, not a SuperNode's: Flower logs on its own
        logging.root.removeHandler(h)
    logging.root.setLevel(logging.WARNING)
    flower_shim.main(args)


class ForkedNode(Proc):
    """A site's paced SuperNode forked from its worker (``args``: ``flower-supernode``'s arguments), when the
    worker was forked from ``deploy local``'s fork server, which imported Flower's SuperNode
    (:data:`SITE_PRELOAD`): the same code, arguments, log, session and environment as the process ``cmd``,
    without an interpreter importing Flower again (1.4 s of CPU per site, on cores every site's start-up
    shares). Forked while the worker is still single-threaded; a restart (the worker's threads running) starts
    the process ``cmd`` instead. The child holds a copy of the worker's memory (the site's loaded data and
    keys): nothing new, as a SuperNode process runs as the site's user and could read its folder anyway."""

    def __init__(self, args: list[str], cmd: list[str], env: dict[str, str], log_dir: Path):
        self.args, self.forked = args, False
        super().__init__("supernode", cmd, env, log_dir, die_with_parent=True)

    def _spawn(self):
        if self.forked or threading.active_count() != 1:
            return super()._spawn()
        self.forked = True
        return ForkedChild(run_forked_supernode, (self.args, self.env, str(self.log_path)), "supernode")


def stop_all(procs: list[Proc], timeout_s: float = 15.0) -> None:
    """Stop ``procs`` together: SIGTERM to all, then wait for each (SIGKILL what lingers) — their graceful
    exits (a SuperNode leaving the SuperLink, a worker closing its executor) overlap instead of adding up."""
    for p in procs:
        p.terminate()
    for p in procs:
        p.stop(timeout_s, signalled=True)


# ---------------------------------------------------------------------------------------------- a site
def run_site(
    folder: Path,
    superlink: str,
    ca: Path | None,
    insecure: bool = False,
    poll_s: float = 0.1,
    ready: threading.Event | None = None,
    stop: threading.Event | None = None,
    stock: bool = False,
    exit_now: bool = False,
) -> None:
    """``silofl site run``: the site's worker, and its SuperNode connecting out to ``superlink``, until
    stopped; with ``exit_now`` (the command) the process then ends at once (:func:`os._exit`, status 0).

    The SuperNode runs with Flower's process isolation, paced (:mod:`silofl.deploy.flower_shim`), and its
    tasks
    are taken by the warm executor in this process (:mod:`silofl.deploy.executor`). ``stock``: Flower as
    shipped
    instead — a ``flwr-clientapp`` process per message relaying to the worker's socket (for the benchmark)."""
    import secrets as _secrets

    require("flwr", "deploy")
    from silofl.deploy import flower_shim
    from silofl.deploy.executor import WarmExecutor
    from silofl.deploy.flower_shim import DOORBELL_ENV, fast_pulls
    from silofl.deploy.site import SiteWorker
    from silofl.site.folder import write_private

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per runtime-API request otherwise

    folder = Path(folder).resolve()
    worker = SiteWorker(folder)
    stock = stock or os.environ.get(STOCK_ENV) == "1"
    if not insecure and (ca is None or not Path(ca).is_file()):
        raise ConfigError(
            "the coordinator's CA certificate is needed (--ca), or --insecure for a test without TLS"
        )
    sock_dir = Path(
        tempfile.mkdtemp(prefix="silofl-site-")
    )  # 0700: only this user; short enough for a socket
    sock = sock_dir / "site.sock"
    stop = stop or threading.Event()
    server = threading.Thread(target=worker.serve, args=(sock, stop), daemon=True)
    port = free_port()
    env = flower_env(folder / "flwr", poll_s)
    threads = [server]
    if stock:
        cmd = [
            flower_bin("flower-supernode"),
            "--superlink",
            superlink,
            "--node-config",
            f'site-socket="{sock}"',
            "--isolation",
            "subprocess",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
    else:
        fast_pulls()
        secret = _secrets.token_bytes(32)  # guards the runtime API's AcquireTask: only this site's processes
        write_private(sock_dir / "runtime.secret", secret)
        bell = sock_dir / "bell"
        env[DOORBELL_ENV] = str(bell)
        cmd = [
            *flower_shim.command(),
            "--superlink",
            superlink,
            "--isolation",
            "process",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--superexec-auth-secret-file",
            str(sock_dir / "runtime.secret"),
        ]

        def handle(frame: bytes) -> bytes:
            with worker.lock:
                return worker.handle_frame(frame)

        executor = WarmExecutor(f"127.0.0.1:{port}", secret, handle, bell, FAB_DIR, worker.cfg.name, stop)
        threads.append(threading.Thread(target=executor.run, daemon=True, name="silofl-executor"))
    if insecure:
        cmd.append("--insecure")
    else:
        cmd += ["--root-certificates", str(ca), "--auth-supernode-private-key", str(folder / "keys" / "node")]
    # started before this process starts a thread: a worker forked from deploy local's fork server, which has
    # imported Flower's SuperNode, forks its SuperNode from itself (ForkedNode)
    if not stock and exit_now and forking() and SUPERNODE_MODULE in sys.modules:
        node: Proc = ForkedNode(cmd[len(flower_shim.command()) :], cmd, env, folder / "logs")
    else:
        node = Proc("supernode", cmd, env, folder / "logs", die_with_parent=True)
    for t in threads:
        t.start()
    threading.Thread(target=warm_up, daemon=True, name="silofl-warm-up").start()
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def on_signal(signum, frame):  # noqa: ARG001
        stop.set()

    if threading.current_thread() is threading.main_thread():
        for s in previous:
            signal.signal(s, on_signal)
    try:
        for attempt in range(
            1, 61
        ):  # the SuperLink refuses a node id it still holds for a dead process (≤ 60 s)
            try:
                node.wait_for("SuperNode ID", 120, stop)
                break
            except SiloflError as e:
                if stop.is_set():  # asked to stop (SIGTERM, Ctrl-C) while connecting
                    return
                if node.p.poll() is None or attempt == 60:
                    raise
                log.warning(
                    "site %s: the SuperNode could not connect yet (%s); retrying",
                    worker.cfg.name,
                    str(e).splitlines()[-1][:120],
                )
                stop.wait(3.0)
                node.restart()
        log.warning(
            "site %s connected to %s (SuperNode ID: %d)", worker.cfg.name, superlink, _node_id(node.text())
        )
        if ready is not None:
            ready.set()
        while not stop.is_set():
            if node.p.poll() is not None:
                raise SiloflError(f"the SuperNode of site {worker.cfg.name} exited: {node.text()[-800:]}")
            if not all(t.is_alive() for t in threads):
                raise SiloflError(
                    f"the worker of site {worker.cfg.name} stopped serving (its socket or executor)"
                )
            stop.wait(0.5)
    finally:
        stop.set()
        if not stock:
            flower_shim.ring(str(sock_dir / "bell"))  # the executor wakes to stop now, not at its next poll
        # the executor first: its connection closed, the SuperNode's runtime server stops at once
        for t in threads[1:]:
            t.join(5)
        node.stop()
        for t in threads[:1]:
            t.join(5)
        shutil.rmtree(sock_dir, ignore_errors=True)
        if threading.current_thread() is threading.main_thread():
            for s, h in previous.items():
                signal.signal(s, h)
    if exit_now:  # stopped as asked: everything the site keeps is on disk (ledger, checkpoints, logs written)
        worker.lock.acquire(timeout=60)  # never in the middle of a step (its ledger and state writes)
        log.info("site %s stopped", worker.cfg.name)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # skip the interpreter's teardown of torch and Flower (seconds, nothing to save)


def warm_up() -> None:
    """Import, while the site waits for its SuperNode and for a run, what a run's set-up step imports on first
    use: the run loop, Opacus' accountants and torch's dynamo (which torch.optim imports when the first
    optimizer is made) — seconds of CPU off the path of the run's set-up. A failure here is the set-up's to
    report, when it imports the same."""
    try:
        import opacus.accountants.analysis.rdp  # noqa: F401
        import torch._dynamo  # noqa: F401

        import silofl.runner.loop  # noqa: F401
    except Exception as e:  # noqa: BLE001 - see the doc
        log.debug("warm-up import failed: %s", e)


# ---------------------------------------------------------------------------------------------- the
# coordinator
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


# ---------------------------------------------------------------------------------------------- deploy local
LATENCY_ENV = (
    "SILOFL_BENCH_LATENCY_MS"  # bench/deployment.py: one-way delay between the sites and the SuperLink
)
STOCK_ENV = "SILOFL_FLOWER_STOCK"  # bench/deployment.py: sites run Flower as shipped (a process per message)


class DelayRelay:
    """A TCP relay on loopback that holds every chunk ``delay_s`` before passing it on, both ways: the
    wide-area
    stand-in of ``bench/deployment.py`` where the kernel has no ``netem``. Bytes pass unchanged (TLS end to
    end)."""

    def __init__(self, target: tuple[str, int], delay_s: float):
        import asyncio

        self.target, self.delay_s = target, delay_s
        self.loop = asyncio.new_event_loop()
        self.port = free_port()
        ready = threading.Event()

        async def pipe(reader, writer):
            q: asyncio.Queue = asyncio.Queue()

            async def send():
                while (item := await q.get()) is not None:
                    due, data = item
                    await asyncio.sleep(max(0.0, due - self.loop.time()))
                    writer.write(data)
                    await writer.drain()
                writer.close()

            sender = asyncio.ensure_future(send())
            try:
                while data := await reader.read(1 << 16):
                    q.put_nowait((self.loop.time() + self.delay_s, data))
            except OSError:
                pass
            q.put_nowait(None)
            await sender

        async def serve(reader, writer):
            try:
                r2, w2 = await asyncio.open_connection(*self.target)
            except OSError:
                writer.close()
                return
            await asyncio.gather(pipe(reader, w2), pipe(r2, writer), return_exceptions=True)

        async def main():
            self.server = await asyncio.start_server(serve, "127.0.0.1", self.port)
            ready.set()
            await self.server.serve_forever()

        self.thread = threading.Thread(target=lambda: self.loop.run_until_complete(main()), daemon=True)
        self.thread.start()
        ready.wait(10)

    def close(self) -> None:
        """Stop accepting connections."""
        self.loop.call_soon_threadsafe(self.server.close)


class LocalDeployment:
    """A CA, a SuperLink and one ``silofl site run`` process per partition of ``split`` under ``dep`` (TLS and
    node
    authentication unless ``insecure``), ready for runs (:meth:`run`) until :meth:`close`. The sites keep
    running
    between runs, as an institution's service does."""

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
        self.relay: DelayRelay | None = None
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
            if float(os.environ.get(LATENCY_ENV, "0") or 0) > 0:  # the benchmark's wide-area stand-in
                self.relay = DelayRelay(("127.0.0.1", port), float(os.environ[LATENCY_ENV]) / 1000)
                site_address = f"127.0.0.1:{self.relay.port}"
            args = ["site", "run", "--superlink", site_address, "--poll-s", str(poll_s)]
            args += ["--insecure"] if insecure else ["--ca", str(dep / "pki" / "ca.crt")]
            env = {**os.environ, "SILOFL_NO_PROGRESS": "1"}
            for k, folder in enumerate(folders):
                self.procs.append(
                    ForkedProc(f"site{k}", [*args, "--site-dir", str(folder)], env, dep / "logs")
                )
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
                node_ids = [_node_id(p.text()) for p in self.procs[1:]]
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
        coordinator's
        business (it retires it; with ``restart_sites`` its process is restarted and it may rejoin); a lost
        SuperLink ends the run."""
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
    public
    cards with their node ids), and wait for the coordinator's ServerApp to write the run folder ``out``; its
    summary (with a ``deployment`` section). ``procs``: local processes whose exit means the run failed.
    ``extra``:
    the coordinator's key folder (``coordinator_keys``) and state folder (``state_dir``: the sites' ledger
    heads). ``launch``: starts the run's ServerApp once it is submitted (else the SuperLink starts it)."""
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


def make_site_folders(cfg, split, root: Path) -> tuple[list[dict], list[Path]]:
    """One site folder per partition of ``split`` under ``root`` (its exported data, fresh keys, a budget that
    admits the run, reporting its test figures), with the federation's cards pinned in each; (cards,
    folders)."""
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
        cards.append(init_site(folder, sc))
        folders.append(folder)
    for folder in folders:
        pin_federation(folder, cards, coordinator)
    return cards, folders


def _node_id(text: str) -> int:
    import re

    m = re.search(r"SuperNode ID: (\d+)", text)
    if not m:
        raise SiloflError("a SuperNode did not report its id")
    return int(m.group(1))


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
