"""One budget per institution across protocols: what a site published with PubSub-ML is what its deployed runs
and simulations have less to train with (the same ledger, the same lifetime budget), and the other way
round."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from silofl.cli.main import app
from silofl.core.errors import SiloflError
from silofl.deploy.coordinator import join
from silofl.deploy.site import SiteWorker
from silofl.site.folder import SiteFolder
from tests.cli.test_readme_commands import _breast_cancer_files
from tests.deploy.test_worker import Loopback, deployment


def publish(tmp_path, folder, epsilon: str):
    """`silofl pubsub publish` into the deployed site's own folder (no second folder, no second budget)."""
    return CliRunner().invoke(
        app,
        [
            "pubsub",
            "publish",
            "--broker",
            str(tmp_path / "broker"),
            "--site",
            SiteFolder.load(folder).name,
            "--data",
            str(tmp_path / "a.csv"),
            "--schema",
            str(tmp_path / "a.yaml"),
            "--epsilon",
            epsilon,
            "--site-dir",
            str(folder),
        ],
    )


@pytest.mark.slow
def test_a_site_that_published_with_pubsub_has_that_much_less_for_a_deployed_run(tiny_cfg, tmp_path):
    _breast_cancer_files(tmp_path)
    cfg = tiny_cfg.replace(method="proxyfl", clients=2, rounds=2, seed=0, noise_multiplier=1.0)
    _, workers, spec, folders = deployment(cfg, tmp_path)
    spec = {**spec, "config": {**spec["config"], "seed": None}}
    for f in folders:
        SiteFolder.load(f).set_lifetime(0.5, 2e-3, "find the run's planned ε")
    with pytest.raises(SiloflError) as e:
        join(Loopback([SiteWorker(f) for f in folders]), spec)
    planned = float(re.search(r"to ε ([0-9.]+)", str(e.value)).group(1))
    lifetime = planned + 2.5  # enough for this run on its own
    for f in folders:
        SiteFolder.load(f).set_lifetime(lifetime, 2e-3, "the board's budget")
    res = publish(tmp_path, folders[0], "3")
    assert res.exit_code == 0, res.output
    worker = SiteWorker(folders[0])
    assert worker.lifetime[0] == pytest.approx(lifetime - 3.0)  # one ledger: PubSub-ML's ε 3 counts here
    assert SiteWorker(folders[1]).lifetime[0] == pytest.approx(lifetime)
    with pytest.raises(SiloflError) as e:
        join(Loopback([worker, SiteWorker(folders[1])]), spec)
    said = str(e.value)
    assert f"above its lifetime budget ε {lifetime:g}" in said and "release ×1" in said, said
    assert "\n" not in said


@pytest.mark.slow
def test_a_simulated_run_given_site_folders_charges_the_same_ledger_pubsub_does(tiny_cfg, tmp_path):
    from silofl.runner.loop import RunHooks, run
    from silofl.site.folder import with_site_folders

    _breast_cancer_files(tmp_path)
    cfg = tiny_cfg.replace(method="fedavg", clients=2, rounds=3, noise_multiplier=1.0)
    folders = {k: SiteFolder.open(tmp_path / f"site{k}", f"site{k}", (7.0, 2e-3)) for k in range(2)}
    assert publish(tmp_path, folders[0].path, "3").exit_code == 0
    s = run(
        cfg.replace(out=str(tmp_path / "sim")),
        progress=False,
        hooks=RunHooks(sites=with_site_folders(folders)),
    )
    eps = {r["client"]: r["epsilon"] for r in s["final"]["per_client"]}
    assert 0 < eps[0] <= 4.0 < eps[1] <= 7.0, eps  # site 0 had ε 4 left after publishing; site 1 had 7
    whole = s["accounting"][0]["site_ledger"]  # its one accountant: the run and the publication composed
    assert whole["epsilon"]["server"] > eps[0] + 3.0 and set(whole["mechanisms"]) == {"dp-sgd", "release"}
    for f in folders.values():  # the rounds it ran are in its one ledger
        assert SiteFolder.load(f.path).ledger.history()
    # and the ledger's DP-SGD rounds count against a release: ε 3 + 1.5 alone would fit in 7
    res = publish(tmp_path, folders[0].path, "1.5")
    assert res.exit_code == 2 and "lifetime budget" in res.output, res.output
    _, before = SiteFolder.load(folders[0].path).require_release(["never released"], 1.5, 1e-6)
    assert before[0] > 2.0  # a record never released still carries what training spent
