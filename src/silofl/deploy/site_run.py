"""``silofl site run``: a site's worker and its SuperNode connecting out to the coordinator's SuperLink, until
stopped (:func:`run_site`) — and :func:`serve_site`, the entry a deployment's site process is started with
(data, not a command line: :class:`~silofl.core.forking.Entry`)."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from silofl.core.errors import ConfigError, SiloflError
from silofl.core.extras import require
from silofl.core.forking import Entry, forking
from silofl.deploy.procs import (
    FAB_DIR,
    SUPERNODE_MODULE,
    ForkedNode,
    Proc,
    flower_bin,
    flower_env,
    free_port,
    node_id_of,
)

log = logging.getLogger("silofl")

STOCK_ENV = "SILOFL_FLOWER_STOCK"  # bench/deployment.py: sites run Flower as shipped (a process per message)


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
    tasks are taken by the warm executor in this process (:mod:`silofl.deploy.executor`). ``stock``: Flower as
    shipped instead — a ``flwr-clientapp`` process per message relaying to the worker's socket (for the
    benchmark)."""
    require("flwr", "deploy")
    from silofl.deploy import flower_shim
    from silofl.deploy.site import SiteWorker

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
    stop = stop or threading.Event()
    env = flower_env(folder / "flwr", poll_s)
    threads = [threading.Thread(target=worker.serve, args=(sock_dir / "site.sock", stop), daemon=True)]
    cmd = _supernode(worker, superlink, sock_dir, env, stock, stop, threads)
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
    if threading.current_thread() is threading.main_thread():
        for s in previous:
            signal.signal(s, lambda signum, frame: stop.set())
    try:
        if _connect(node, worker.cfg.name, superlink, stop):
            if ready is not None:
                ready.set()
            _serve(node, threads, worker.cfg.name, stop)
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
    if exit_now:
        _exit(worker)


def _supernode(
    worker: Any,
    superlink: str,
    sock_dir: Path,
    env: dict[str, str],
    stock: bool,
    stop: threading.Event,
    threads: list[threading.Thread],
) -> list[str]:
    """The command of the site's SuperNode (TLS options apart); unless ``stock``, the warm executor that
    takes its tasks is added to ``threads`` and the runtime API's secret and doorbell are set up in
    ``sock_dir`` and ``env``."""
    import secrets as _secrets

    from silofl.deploy import flower_shim
    from silofl.deploy.executor import WarmExecutor
    from silofl.deploy.flower_shim import DOORBELL_ENV, fast_pulls
    from silofl.site.folder import write_private

    port = free_port()
    where = ["--host", "127.0.0.1", "--port", str(port)]
    if stock:
        node_config = f'site-socket="{sock_dir / "site.sock"}"'
        return [
            flower_bin("flower-supernode"),
            *("--superlink", superlink, "--node-config", node_config, "--isolation", "subprocess"),
            *where,
        ]
    fast_pulls()
    secret = _secrets.token_bytes(32)  # guards the runtime API's AcquireTask: only this site's processes
    write_private(sock_dir / "runtime.secret", secret)
    bell = sock_dir / "bell"
    env[DOORBELL_ENV] = str(bell)

    def handle(frame: bytes) -> bytes:
        with worker.lock:
            return worker.handle_frame(frame)

    executor = WarmExecutor(f"127.0.0.1:{port}", secret, handle, bell, FAB_DIR, worker.cfg.name, stop)
    threads.append(threading.Thread(target=executor.run, daemon=True, name="silofl-executor"))
    return [
        *flower_shim.command(),
        *("--superlink", superlink, "--isolation", "process", *where),
        *("--superexec-auth-secret-file", str(sock_dir / "runtime.secret")),
    ]


def _connect(node: Proc, name: str, superlink: str, stop: threading.Event) -> bool:
    """Wait for the SuperNode to connect, restarting it while the SuperLink refuses a node id it still holds
    for a dead process (≤ 60 s); False when asked to stop (SIGTERM, Ctrl-C) meanwhile."""
    for attempt in range(1, 61):
        try:
            node.wait_for("SuperNode ID", 120, stop)
            break
        except SiloflError as e:
            if stop.is_set():
                return False
            if node.p.poll() is None or attempt == 60:
                raise
            log.warning(
                "site %s: the SuperNode could not connect yet (%s); retrying",
                name,
                str(e).splitlines()[-1][:120],
            )
            stop.wait(3.0)
            node.restart()
    log.warning("site %s connected to %s (SuperNode ID: %d)", name, superlink, node_id_of(node.text()))
    return True


def _serve(node: Proc, threads: list[threading.Thread], name: str, stop: threading.Event) -> None:
    """Until ``stop``: SiloflError when the SuperNode exits or the worker's socket or executor stops."""
    while not stop.is_set():
        if node.p.poll() is not None:
            raise SiloflError(f"the SuperNode of site {name} exited: {node.text()[-800:]}")
        if not all(t.is_alive() for t in threads):
            raise SiloflError(f"the worker of site {name} stopped serving (its socket or executor)")
        stop.wait(0.5)


def _exit(worker: Any) -> None:
    """End the process at once, stopped as asked: everything the site keeps is on disk (ledger, checkpoints,
    logs written) — but never in the middle of a step (its ledger and state writes). The interpreter's
    teardown of torch and Flower is skipped (seconds, nothing to save)."""
    worker.lock.acquire(timeout=60)
    log.info("site %s stopped", worker.cfg.name)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


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


def site_entry(
    folder: Path, superlink: str, ca: Path | None, insecure: bool = False, poll_s: float = 0.1
) -> Entry:
    """The entry of a site's process serving ``folder`` to the SuperLink at ``superlink``
    (:func:`serve_site`)."""
    return Entry(
        f"{__name__}:serve_site",
        {
            "folder": str(folder),
            "superlink": superlink,
            "ca": None if ca is None else str(ca),
            "insecure": insecure,
            "poll_s": poll_s,
        },
    )


def serve_site(
    folder: str, superlink: str, ca: str | None, insecure: bool = False, poll_s: float = 0.1
) -> None:
    """A site's process (``silofl site run``, a site of ``deploy local``): log at INFO, then :func:`run_site`
    until stopped, the process ending at once afterwards."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", force=True)
    ca_path = Path(ca).resolve() if ca is not None else None  # Flower reads certificate paths as absolute
    run_site(Path(folder), superlink, ca_path, insecure=insecure, poll_s=poll_s, exit_now=True)
