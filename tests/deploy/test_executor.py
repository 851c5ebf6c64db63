"""The site's warm executor (silofl.deploy.executor): it runs only its own silofl's FAB, checked by hash."""

import hashlib
import io
import shutil
import zipfile

import pytest
import torch

from silofl.deploy.executor import fab_refusal, own_fab_hash
from silofl.deploy.procs import FAB_DIR


@pytest.mark.slow  # imports Flower's build (seconds): the fast tier stays under a minute
@pytest.mark.deploy
def test_the_sites_fab_hash_is_the_hash_of_flowers_deterministic_build():
    from flwr.cli.build import build_fab_from_disk

    fab = build_fab_from_disk(FAB_DIR)
    assert own_fab_hash(FAB_DIR) == hashlib.sha256(fab).hexdigest() == own_fab_hash(FAB_DIR)
    names = zipfile.ZipFile(io.BytesIO(fab)).namelist()
    assert "silofl_fab/client_app.py" in names and "silofl_fab/server_app.py" in names


@pytest.mark.slow  # imports Flower's build
@pytest.mark.deploy
def test_a_fab_other_than_the_sites_own_is_refused(tmp_path):
    from flwr.cli.build import build_fab_from_disk

    mine = own_fab_hash(FAB_DIR)
    fab = build_fab_from_disk(FAB_DIR)
    assert fab_refusal(fab, hashlib.sha256(fab).hexdigest(), mine) is None
    other = tmp_path / "fab"
    shutil.copytree(FAB_DIR, other, ignore=shutil.ignore_patterns("__pycache__"))
    app = other / "silofl_fab" / "client_app.py"
    app.write_text(app.read_text() + "\nimport os  # the coordinator's own code\n")
    theirs = build_fab_from_disk(other)
    why = fab_refusal(theirs, hashlib.sha256(theirs).hexdigest(), mine)
    assert why and "is not the FAB of this site's silofl" in why
    assert "not the" in fab_refusal(fab, "0" * 64, mine)  # content that does not match the hash it claims


@pytest.mark.slow
@pytest.mark.deploy
def test_a_site_refuses_a_run_whose_fab_is_not_its_own(tmp_path, monkeypatch):
    """A real deployment (SuperLink and two `silofl site run` processes): the coordinator submits a FAB whose
    ClientApp differs from the sites' silofl; every site answers the first message with an error and the run
    ends with that reason — the coordinator's code never runs at a site."""
    from silofl.core.errors import SiloflError
    from silofl.deploy import local, superlink
    from silofl.runner.config import RunConfig
    from silofl.runner.data import prepare_data

    other = tmp_path / "fab"
    shutil.copytree(FAB_DIR, other, ignore=shutil.ignore_patterns("__pycache__"))
    app = other / "silofl_fab" / "client_app.py"
    app.write_text(app.read_text() + "\nimport os  # the coordinator's own code\n")
    cfg = RunConfig.from_dict(
        dict(
            method="fedavg",
            dataset="digits",
            clients=2,
            rounds=1,
            samples_per_client=60,
            batch_size=30,
            delta=1e-3,
            proxy_model="mlp",
            test_limit=50,
            threads=1,
        )
    ).resolve()
    cfg, split = prepare_data(cfg, torch.device("cpu"), features=False)
    dep = local.LocalDeployment(cfg, split, tmp_path / "dep", insecure=True)
    try:
        monkeypatch.setattr(
            superlink, "FAB_DIR", other
        )  # only the coordinator's submission: the sites run already
        with pytest.raises(SiloflError, match="refuses the run's FAB"):
            dep.run(cfg, tmp_path / "run", timeout_s=120, progress=False, call_timeout_s=60)
    finally:
        dep.close()
    logs = "".join(p.read_text() for p in (tmp_path / "dep" / "logs").glob("site*.log"))
    assert "refuses the FAB" in logs
