"""The entry point of a launched process of an audit (``silofl launch … audit``), called with data.

``silofl launch`` parses the audit's options once and starts every process with the :class:`Entry`
:func:`audit_entry` makes: the audited run as ``RunConfig.to_dict()``, the audit's settings as
:meth:`AuditSettings`'s fields, the output folder and the launch's options — plain JSON, no command line.
Process 0 holds the coordinator and the audited site (its canaries and observer) and writes the audit folder
(audit.json: the launcher prints it); every other process serves its sites of the audited run.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from silofl.auditing.settings import AuditSettings
from silofl.core.forking import Entry
from silofl.runner.config import RunConfig
from silofl.runner.entry import RankOptions


def audit_entry(
    cfg: RunConfig, settings: AuditSettings, out: str, opts: RankOptions, command: str | None = None
) -> Entry:
    """The entry of every process of a launched audit of ``cfg`` with ``settings`` into ``out``; ``command``:
    the launch's command line, recorded in the audit (not parsed)."""
    return Entry(
        f"{__name__}:audit_rank",
        {
            "config": cfg.to_dict(),
            "settings": settings_to_data(settings),
            "out": str(out),
            "engine": opts.to_dict(),
            "command": command,
        },
    )


def settings_to_data(settings: AuditSettings) -> dict[str, Any]:
    """An audit's settings as plain JSON (its tuple of attacks as a list)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(settings).items()}


def settings_from_data(data: dict[str, Any]) -> AuditSettings:
    """The settings :func:`settings_to_data` wrote."""
    fields: dict[str, Any] = dict(data)
    fields["attacks"] = tuple(fields.get("attacks", ()))
    return AuditSettings(**fields)


def audit_rank(
    config: dict[str, Any], settings: dict[str, Any], out: str, engine: dict[str, Any], command: str | None
) -> None:
    """One process of a launched audit (see the module doc): the audited run ``config``, the audit's
    ``settings`` (:class:`AuditSettings`' fields), its folder ``out``, the launch's options ``engine``
    (:class:`RankOptions`)."""
    import torch.distributed as dist
    from rich.console import Console

    from silofl.auditing import check_engine, run_audit
    from silofl.auditing.example import run_config
    from silofl.comm.torchdist import TorchDistEngine, init_from_env, shutdown
    from silofl.runner.entry import serve_if_worker

    cfg = RunConfig.from_dict(config)
    s = settings_from_data(settings)
    opts = RankOptions.from_dict(engine)
    init_from_env(timeout_s=opts.peer_timeout_s)
    try:
        check_engine(cfg, s, dist.get_world_size())
        if serve_if_worker(run_config(cfg, s, Path(out)).resolve()):
            return
        if cfg.threads is not None:
            import torch

            torch.set_num_threads(cfg.threads)
        run_audit(
            cfg,
            s,
            out,
            overwrite=opts.overwrite,
            progress=not opts.quiet,
            console=Console(),
            command=command,
            engine_factory=lambda make, n: TorchDistEngine(make, n, timeout_s=opts.peer_timeout_s),
        )
    finally:
        shutdown()
