"""A gradient-canary audit over torch.distributed (used by test_gradient.py).

    python tests/audit/torchdist_audit.py CASE.json      # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set by
    the launcher

Rank 0 runs the audit (the coordinator, and the audited site 0 with its canaries and observer) on the
torch.distributed engine and writes OUT/audit.json and OUT/scores.json; every other rank serves its sites,
built
from the same audited configuration.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from silofl.audit import gradient
from silofl.audit.settings import AuditSettings
from silofl.comm.torchdist import TorchDistEngine, init_from_env, serve, shutdown
from silofl.run.config import RunConfig
from silofl.run.data import prepare_data
from silofl.run.folder import clean_json
from silofl.run.loop import ledger_root, releases_nonprivate, site_factory


def main(path: str) -> None:
    init_from_env(timeout_s=120)
    torch.set_num_threads(1)
    case = json.loads(Path(path).read_text())
    cfg = RunConfig.from_dict(case["run"])
    s = AuditSettings(**case["settings"])
    out = Path(case["out"])
    if dist.get_rank() == 0:
        a, extra = gradient.audit(
            cfg, s, out, engine_factory=lambda make, n: TorchDistEngine(make, n, timeout_s=120)
        )
        (out / "audit.json").write_text(json.dumps(clean_json(a)))
        (out / "scores.json").write_text(
            json.dumps({k: v.tolist() for k, v in extra["canary_scores"].items()})
        )
    else:
        rc, split = prepare_data(gradient.run_config(cfg, s, out).resolve(), torch.device("cpu"))
        make, n_sites = site_factory(rc.info.cls(rc), split, ledger_root(rc), releases_nonprivate(rc, False))
        serve(make, n_sites)
    shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
