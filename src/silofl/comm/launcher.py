"""``silofl launch --survive-faults``: start the processes of a run without torchrun's agent.

torchrun's elastic agent is fail-stop: when one worker fails it stops every worker on its machine
(and restarts them all with ``--max-restarts``). Sites that must outlive each other's crash are
started here instead, each as a plain child process that joins torch.distributed's ``env://``
rendezvous (a TCP store on the machine of rank 0; RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in its
environment), so a crash or a hang only removes that process: the others drop it after their
timeout (:mod:`silofl.runtime.distributed`) and finish. Once the reporting process (rank 0) has
exited, the others get a grace period and a process still running then (a hung one) is killed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid

from silofl.core.errors import ConfigError
from silofl.core.forking import Entry, ForkedPopen, fork_server, forking, run_entry

GRACE_S = 30.0  # how long the other processes may take to exit after rank 0 (or the first one here)


def ensure_run_key(nnodes: int, key_file: str | None = None) -> None:
    """Put the run's shared key in the environment the processes inherit (``SILOFL_RUN_KEY``): from
    ``key_file``, or the environment, or — on one machine — a fresh one. Several machines must share one:
    ConfigError without."""
    from silofl.comm.torchdist import KEY_ENV

    if key_file:
        try:
            text = open(key_file).read().strip()
            bytes.fromhex(text)
        except (OSError, ValueError) as e:
            raise ConfigError(f"--auth-key-file {key_file}: not a hex key file ({e})") from None
        os.environ[KEY_ENV] = text
    elif not os.environ.get(KEY_ENV):
        if nnodes > 1:
            raise ConfigError(
                "several machines need the same run key: pass --auth-key-file FILE (e.g. made with "
                "`python -c 'import os; print(os.urandom(32).hex())' > FILE`, copied to every machine)"
            )
        os.environ[KEY_ENV] = os.urandom(32).hex()


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command(target: Entry | list[str]) -> list[str]:
    """The command of a process that runs ``target`` as its own interpreter (an entry, or ``python ARGS``)."""
    return target.command() if isinstance(target, Entry) else [sys.executable, *target]


def launch_processes(
    target: Entry | list[str],
    nproc: int,
    nnodes: int = 1,
    node_rank: int = 0,
    endpoint: str | None = None,
    console=None,
    grace_s: float = GRACE_S,
    preload: str | None = None,
) -> int:
    """Start ``nproc`` processes of a ``nproc × nnodes`` group, each running ``target``: an :class:`Entry` (a
    function and its JSON arguments; forked from a fork server that imported ``preload`` once, unless
    ``SILOFL_FORK_WORKERS=0`` or no ``preload``) or ``python ARGS`` (a list). The exit code is the reporting
    process's (rank 0's; on other machines: 0 if every process here finished cleanly)."""
    if nproc < 1 or nnodes < 1 or not 0 <= node_rank < nnodes:
        raise ConfigError(
            f"--nproc-per-node {nproc}, --nnodes {nnodes}, --node-rank {node_rank}: need "
            "nproc ≥ 1, nnodes ≥ 1 and 0 ≤ node-rank < nnodes"
        )
    if endpoint:
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"--rdzv-endpoint takes host:port, got {endpoint!r}")
    else:
        host, port = "127.0.0.1", str(free_port())
    world = nproc * nnodes
    ensure_run_key(nnodes)
    procs: dict[int, subprocess.Popen] = {}
    for local in range(nproc):
        rank = node_rank * nproc + local
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(local),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(nproc),
            "MASTER_ADDR": host,
            "MASTER_PORT": port,
        }
        procs[rank] = (
            ForkedPopen(preload, run_entry, (target.to_json(), env), f"rank{rank}")  # type: ignore[assignment]
            if isinstance(target, Entry) and preload and forking()
            else subprocess.Popen(_command(target), env=env)
        )
    codes: dict[int, int | None] = {}
    deadline = None
    try:
        while len(codes) < len(procs):
            for rank, p in procs.items():
                if rank not in codes and p.poll() is not None:
                    codes[rank] = p.returncode
            if deadline is None and (0 in codes or (0 not in procs and codes)):
                deadline = time.monotonic() + grace_s
            if deadline is not None and time.monotonic() > deadline:
                for rank, p in procs.items():
                    if rank not in codes:
                        p.kill()
                        p.wait()
                        codes[rank] = None  # did not exit: hung
                break
            time.sleep(0.2)
    except KeyboardInterrupt:
        for p in procs.values():
            p.send_signal(signal.SIGINT)
        raise
    for rank in sorted(procs):
        code = codes.get(rank)
        if code and console is not None:
            how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
            console.print(f"[yellow]process {rank} {how}[/]")
        elif code is None and console is not None:
            console.print(
                f"[yellow]process {rank} still ran {grace_s:g} s after the run ended (hung) and was killed[/]"
            )
    if 0 in procs:
        return 0 if codes.get(0) == 0 else 1
    return 0 if all(c == 0 for c in codes.values()) else 1


def torchrun(torchrun_args: list[str], entry: Entry, preload: str | None = None) -> None:
    """torchrun (``torch.distributed.run``) with ``torchrun_args``, each of its processes running ``entry`` —
    forked from a fork server that imported ``preload`` once (:mod:`silofl.core.forking`), unless
    ``SILOFL_FORK_WORKERS=0`` or no ``preload`` (then each runs ``python -m silofl.core.forking ENTRY``). The
    agent, its rendezvous, restarts and failure reports are torchrun's own; only how a worker starts
    differs."""
    from torch.distributed import run as tr

    script = entry.command()[1:]  # -m silofl.core.forking ENTRY_JSON
    if not (preload and forking()):
        tr.main([*torchrun_args, *script])
        return
    from torch.distributed.launcher.api import elastic_launch

    args = tr.parse_args([*torchrun_args, *script])
    if args.standalone:  # as tr.run does
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    if args.master_port is None:
        args.master_port = 29500
    config, _, _ = tr.config_from_args(args)  # sets OMP_NUM_THREADS=1 for several processes, as torchrun does
    config.start_method = "forkserver"
    fork_server(preload)  # after the environment is final: the workers inherit the server's
    elastic_launch(config=config, entrypoint=run_entry)(entry.to_json())
