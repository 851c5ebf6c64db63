"""Run several configs one after another in one torch.distributed group (used by test_torchdist.py).

    python tests/comm/multi_run.py CASES.json      # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set by the
    launcher

Rank 0 runs each config's coordinator on the torch.distributed engine and writes its run folder; every other
rank serves its sites. CASES.json is a list of run options (each with its own ``out``).
"""

import json
import sys

import torch
import torch.distributed as dist

from silofl.comm.torchdist import TorchDistEngine, init_from_env, serve, shutdown
from silofl.runner.config import RunConfig
from silofl.runner.data import prepare_data
from silofl.runner.loop import ledger_root, releases_nonprivate, run, site_factory


def main(path: str) -> None:
    init_from_env(timeout_s=120)
    for case in json.loads(open(path).read()):
        cfg = RunConfig.from_dict(case).resolve()
        torch.set_num_threads(cfg.threads or 1)
        if dist.get_rank() == 0:
            run(cfg, progress=False, engine_factory=lambda make, n: TorchDistEngine(make, n, timeout_s=120))
        else:
            cfg, split = prepare_data(cfg, torch.device("cpu"))
            make, n_sites = site_factory(
                cfg.info.cls(cfg), split, ledger_root(cfg), releases_nonprivate(cfg, False)
            )
            serve(make, n_sites)
    shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
