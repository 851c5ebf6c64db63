"""The gradient-canary audit of a run on a local Flower deployment (``silofl audit --engine flower-local``):
every site its own process, the audited site arming itself from the spec put in its folder
(:class:`silofl.auditing.gradient.SiteAudit`). Apart from :mod:`silofl.auditing.gradient`, which the deployed
site's worker uses, so that what the site imports does not import the deployment back."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from silofl.auditing.example import run_config
from silofl.auditing.gradient import (
    AUDIT_DIR,
    Evidence,
    audited_site,
    coins_for,
    public_rows,
    read_json,
    report,
)
from silofl.auditing.settings import AuditSettings
from silofl.core.errors import ConfigError
from silofl.deploy.local import deploy_local
from silofl.runner.config import RunConfig


def audit_deployed(
    cfg: RunConfig,
    s: AuditSettings,
    out: Path,
    progress: bool = False,
    console=None,
    timeout_s: float = 900.0,
    call_timeout_s: float = 300.0,
) -> tuple[dict, dict]:
    """:func:`audit` on a local Flower deployment (``silofl deploy local``): every site its own process,
    payloads sealed between sites; the audited site arms itself from the spec put in its folder
    (:class:`SiteAudit`) and the bounds are computed here from the evidence it wrote."""

    rc = run_config(cfg, s, out)
    audited = audited_site(cfg, s)
    coins = coins_for(s)
    held: dict = {}

    def prepare(split: Any, folders: list[Path]) -> None:
        public = public_rows(split, s.derived(3)) if s.canary_placement == "quiet" else None
        d = folders[audited] / AUDIT_DIR
        d.mkdir()
        spec = {
            "m": s.canaries,
            "kind": s.canary_kind,
            "seed": s.derived(2),
            "method": cfg.method,
            "included": coins.tolist(),
        }
        (d / "spec.json").write_text(json.dumps(spec))
        if public is not None:
            np.savez(d / "public.npz", x=public[0].numpy(), y=public[1].numpy())
        held.update(public=public, folder=folders[audited])

    t0 = time.perf_counter()
    summary = deploy_local(
        rc,
        Path(str(rc.out)),
        timeout_s=timeout_s,
        progress=progress,
        call_timeout_s=call_timeout_s,
        prepare_sites=prepare,
    )
    run_s = time.perf_counter() - t0
    path = held["folder"] / AUDIT_DIR / "evidence.json"
    if not path.is_file():
        raise ConfigError("the audited site never trained: nothing to audit (raise --rounds or the budget)")
    ev = Evidence.from_json(read_json(path, "the site's evidence"))
    return report(rc, s, ev, coins, summary, held["public"], run_s)
