"""The entry point of a launched process of a run (``silofl launch``), called with data, not a command line.

``silofl launch`` parses its options once, in its own process, and starts every process of the group with
:func:`silofl.core.forking.Entry` ``("silofl.runner.entry:run_rank", {"config": RunConfig.to_dict(), "engine":
RankOptions.to_dict()})``: each process of the torch.distributed group calls :func:`run_rank` with the run as
data — rank 0 runs the coordinator and its sites and writes the run folder, every other rank serves its sites.
No process re-parses a ``silofl`` command line, so a renamed flag cannot break a launched worker.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from silofl.core.errors import ConfigError
from silofl.core.forking import Entry
from silofl.runner.config import RunConfig

PRELOAD = "silofl.runner.preload"  # what a launched process imports, imported once by the fork server


@dataclass(frozen=True)
class RankOptions:
    """How a launched process runs (the engine options of a torch.distributed run), plain JSON between
    processes."""

    peer_timeout_s: float = 300.0  # seconds to wait for a peer's message
    resume: bool = False  # continue OUT from its latest checkpoint
    overwrite: bool = False  # replace the run already in OUT
    quiet: bool = False  # no progress bar on rank 0

    def to_dict(self) -> dict[str, Any]:
        """The options as a plain dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RankOptions:
        """The options :meth:`to_dict` wrote (an unknown key is refused)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ConfigError(f"unknown launched-process options: {', '.join(sorted(unknown))}")
        return cls(**d)


def rank_entry(cfg: RunConfig, opts: RankOptions) -> Entry:
    """The entry of every process of a launched run of ``cfg``."""
    return Entry(f"{__name__}:run_rank", {"config": cfg.to_dict(), "engine": opts.to_dict()})


def check_launched_processes(processes: int, clients: int) -> None:
    """Refuse more launched processes than clients (a process serves at least one client)."""
    if processes > clients:
        raise ConfigError(f"{processes} processes for {clients} clients: use at most one process per client")


def serve_if_worker(cfg: RunConfig) -> bool:
    """On a rank other than 0 of a launched group (the process group is up): build this rank's sites of the
    resolved ``cfg`` and serve their steps; True when this process was such a worker."""
    import torch.distributed as dist

    from silofl.comm.torchdist import serve, shutdown
    from silofl.runner.data import prepare_run
    from silofl.runner.loop import ledger_root, releases_nonprivate, resolve_device, site_factory

    if dist.get_rank() == 0:
        check_launched_processes(dist.get_world_size(), cfg.clients)
        return False
    from silofl.core.threads import apply as apply_threads

    apply_threads(cfg.threads)  # one per process unless the run asks (silofl.core.threads)
    plan, split = prepare_run(cfg.resolve(), resolve_device(cfg.device))
    make, n_sites = site_factory(
        cfg.info.cls(plan), split, ledger_root(cfg), releases_nonprivate(cfg, in_process=False)
    )
    try:
        serve(make, n_sites)
    finally:
        shutdown()
    return True


def run_rank(config: dict[str, Any], engine: dict[str, Any]) -> None:
    """One process of a launched run: ``config`` (``RunConfig.to_dict()``) over torch.distributed with the
    options ``engine`` (:class:`RankOptions`). Rank 0 writes the run folder (its summary.json: the launcher
    prints it); the other ranks serve their sites. After a torchrun restart (``TORCHELASTIC_RESTART_COUNT``)
    a run with checkpoints resumes, every process together."""
    from rich.console import Console

    from silofl.comm.torchdist import TorchDistEngine, init_from_env, shutdown
    from silofl.runner.folder import OutLock
    from silofl.runner.loop import run as run_loop

    opts = RankOptions.from_dict(engine)
    resolved = RunConfig.from_dict(config).resolve()
    init_from_env(timeout_s=opts.peer_timeout_s)
    resume = opts.resume
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0" and resolved.checkpoint_every:
        resume = True  # torchrun restarted the group after a failure: every process resumes together
    if serve_if_worker(resolved):
        return

    def factory(make_site, n_sites):
        return TorchDistEngine(make_site, n_sites, timeout_s=opts.peer_timeout_s)

    try:  # rank 0: the coordinator and its sites
        with OutLock(resolved.out):
            run_loop(
                resolved,
                progress=not opts.quiet,
                console=Console(),
                resume=resume,
                overwrite=opts.overwrite,
                engine_factory=factory,
            )
    finally:
        shutdown()
