"""The processes of a deployment on one machine: a child process in its own group with its output in a log
(:class:`Proc`), a site's worker started from its :class:`~silofl.core.forking.Entry` and forked from a fork
server that imported what it needs once (:class:`SiteProc`), the coordinator's ServerApp and a site's
SuperNode forked warm (:class:`ForkedServerApp`, :class:`ForkedNode`), and Flower's executables and
environment."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from silofl.core.errors import ConfigError, SiloflError
from silofl.core.extras import require
from silofl.core.forking import Entry, ForkedChild, ForkedPopen, detach, forking, run_entry

log = logging.getLogger("silofl")

FAB_DIR = Path(__file__).parent / "fab"
SERVERAPP_START_S = 180.0  # a submitted run whose ServerApp has not said a word by then is not coming
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
    its worker (it would hold the site's node id with nobody behind it)."""
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


SITE_PRELOAD = "silofl.deploy.site_preload"  # what every site process imports, once per deployment


class SiteProc(Proc):
    """A site's process running ``entry`` (:func:`silofl.deploy.site_run.serve_site` with the site's folder
    and the SuperLink's address as data), forked from a fork server that imported torch, the run loop and
    Flower once (:mod:`silofl.core.forking`, :data:`SITE_PRELOAD`): the log, session and signals of a
    :class:`Proc`, without each site's interpreter importing them again — seconds of CPU per site, which on
    a machine with fewer cores than sites is most of a deployment's set-up. With ``SILOFL_FORK_WORKERS=0``
    it is a plain :class:`Proc` of ``python -m silofl.core.forking ENTRY``."""

    def __init__(self, name: str, entry: Entry, env: dict[str, str], log_dir: Path):
        self.entry = entry
        super().__init__(name, entry.command(), env, log_dir)

    def _spawn(self):
        if not forking():
            return super()._spawn()
        return ForkedPopen(
            SITE_PRELOAD, run_entry, (self.entry.to_json(), self.env, str(self.log_path)), self.name
        )


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


def node_id_of(text: str) -> int:
    """The node id a SuperNode printed in its log ``text`` (SiloflError without)."""
    import re

    m = re.search(r"SuperNode ID: (\d+)", text)
    if not m:
        raise SiloflError("a SuperNode did not report its id")
    return int(m.group(1))
