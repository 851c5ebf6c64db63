"""Deployed sites compute their own features (in their worker, cached in their own folder): the same numbers
as the simulator on the same features."""

import pytest
import torch

from silofl.deploy.coordinator import join
from silofl.deploy.local import make_site_folders
from silofl.deploy.site import SiteWorker
from silofl.runner.data import prepare_data
from silofl.runner.loop import run as simulate
from tests.deploy.test_worker import Loopback


@pytest.mark.slow
@pytest.mark.deploy
def test_deployed_sites_featurize_their_own_data(tiny_cfg, tmp_path):
    cfg = tiny_cfg.replace(
        method="fedavg", clients=3, rounds=2, seed=0, proxy_model="linear", features="scatter", threads=1
    ).resolve()
    cfg, raw = prepare_data(
        cfg, torch.device("cpu"), features=False
    )  # what each institution holds: raw images
    assert raw.input_shape == (1, 16, 16)
    cards, folders = make_site_folders(cfg, raw, tmp_path / "sites")
    workers = [SiteWorker(f) for f in folders]
    engine = Loopback(workers)
    cfg2, remote = join(
        engine,
        {
            "config": cfg.to_dict(),
            "sites": [{**c, "node_id": k} for k, c in enumerate(cards)],
            "coordinator_keys": str(tmp_path / "coordinator-keys"),  # FedAvg's sealed server role
            "state_dir": str(tmp_path / "coordinator-state"),
        },
    )
    assert remote.input_shape == (81, 4, 4)  # the shape the sites' features have, reported at setup
    s = simulate(
        cfg2.replace(out=str(tmp_path / "deployed")),
        progress=False,
        engine_factory=lambda make, n: engine,
        remote=remote,
    )
    sim = simulate(cfg.replace(out=str(tmp_path / "sim")), progress=False)
    assert [(r["global_acc"], r["epsilon"]) for r in s["final"]["per_client"]] == [
        (r["global_acc"], r["epsilon"]) for r in sim["final"]["per_client"]
    ]
    for f in folders:  # each site's features are kept in its own folder, not in a shared cache
        assert list((f / "features").glob("*/*.npy"))
    assert all(not w.refused for w in workers)
