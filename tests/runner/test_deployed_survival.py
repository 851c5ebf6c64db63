"""A deployed survival run (`silofl deploy start`: the coordinator reads no data and no schema): each site
loads its own survival table with its schema from its site.json and declares its task in its hello, so the
run's headline is the C-index (``global_c_index``), not an accuracy nobody can compute. Driven at the engine
seam — real site folders and workers, every frame packed, sealed and checked (the Loopback engine of
tests/deploy/test_worker.py), without Flower's processes."""

import json
import shutil

import pytest

from silofl.core.errors import ConfigError, SiloflError
from silofl.deploy.coordinator import join
from silofl.deploy.pki import make_coordinator_keys
from silofl.deploy.site import HELLO, SiteConfig, SiteWorker, init_site, pin_federation
from silofl.runner.config import RunConfig
from silofl.runner.loop import run as simulate
from silofl.training.tasks import agreed_task
from tests.deploy.test_worker import Loopback
from tests.helpers import write_survival_sites


def _sites(tmp_path, n_sites=2, rows=80):
    """Site folders each holding its own survival table and the schema, as `silofl site init` makes them."""
    schema, tables, _ = write_survival_sites(tmp_path / "data", sites=n_sites, rows=rows)
    coordinator = make_coordinator_keys(tmp_path / "coordinator-keys")
    cards, folders = [], []
    for k, table in enumerate(tables):
        folder = tmp_path / "sites" / f"site{k}"
        folder.mkdir(parents=True)
        shutil.copy(table, folder / "table.csv")
        shutil.copy(schema, folder / "schema.yaml")
        sc = SiteConfig(
            name=f"site{k}",
            data="table.csv",
            schema=str(folder / "schema.yaml"),
            lifetime_epsilon=20.0,
            lifetime_delta=1e-3,
            report_test_figures=True,
            allow_research_seed=True,
            allow_non_formal=True,  # a seeded research run (reproducible figures) is not a formal guarantee
        )
        cards.append(init_site(folder, sc))
        folders.append(folder)
    for folder in folders:
        pin_federation(folder, cards, coordinator)
    return cards, folders


def _spec(tmp_path, cards, **config):
    cfg = RunConfig.from_dict(
        {
            "method": "fedavg",
            "dataset": "table",
            "data_at_sites": True,  # what `silofl deploy start` sets: no --schema, no --site-data here
            "proxy_model": "logreg",
            "lr": 0.05,
            "batch_size": 16,
            "rounds": 2,
            "delta": 1e-3,
            "seed": 1,
            **config,
        }
    )
    return {
        "config": cfg.to_dict(),
        "sites": [{**c, "node_id": k} for k, c in enumerate(cards)],
        "coordinator_keys": str(tmp_path / "coordinator-keys"),
        "state_dir": str(tmp_path / "coordinator-state"),
    }


@pytest.mark.slow  # two sites × 80 rows, two DP rounds through packed, sealed frames: ~3 s
def test_a_deployed_survival_run_is_judged_by_the_c_index(tmp_path):
    cards, folders = _sites(tmp_path)
    engine = Loopback([SiteWorker(f) for f in folders])
    cfg, remote = join(engine, _spec(tmp_path, cards))
    assert cfg.sites_task == "survival" and cfg.metric == "c_index"  # from the sites' hellos, no data read
    s = simulate(
        cfg.replace(out=str(tmp_path / "run")),
        progress=False,
        engine_factory=lambda make, n: engine,
        remote=remote,
    )
    assert s["metric"] == "c_index" and s["headline"] == "global_c_index"
    assert s["metrics"]["computed"] == ["c_index"]
    # each site scores its own held-out rows (no shared test set at the sites): the C-index, no accuracy
    assert 0.0 < s["final"]["global_c_index_internal"]["mean"] < 1.0
    assert all(r["global_c_index_internal"] is not None for r in s["final"]["per_client"])
    assert all(r["global_acc_internal"] is None for r in s["final"]["per_client"])
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["headline"] == "global_c_index"


@pytest.mark.slow  # joins only (no round): < 1 s
def test_a_deployed_survival_run_refuses_what_the_task_cannot_do_and_a_false_task(tmp_path):
    cards, folders = _sites(tmp_path, rows=40)
    # a classification metric for the sites' survival target, and a method that does not train one
    for config, msg in (
        ({"metric": "auroc"}, "--metric auroc is not computed"),
        ({"method": "ditto"}, "ditto does not train a survival target"),
    ):
        engine = Loopback([SiteWorker(f) for f in folders])
        with pytest.raises(SiloflError, match=msg):
            join(engine, _spec(tmp_path, cards, **config))

    # a relay that changes a hello's task (or any fact it states): the site's signature no longer holds
    def tamper(task):
        def tap(step, k, frame, way):
            from silofl.comm.messages import pack, unpack

            if step == HELLO and way == "from" and k == 1:
                step_name, msgs = unpack(frame)
                m = msgs[next(iter(msgs))]
                m.meta["task"] = task
                return pack(step_name, msgs)
            return frame

        return tap

    for task in ("x" * 500, "classification"):
        engine = Loopback([SiteWorker(f) for f in folders], tamper(task))
        with pytest.raises(SiloflError, match="with a hello its pinned key did not sign"):
            join(engine, _spec(tmp_path, cards))
    # signed hellos naming an unknown task, or sites that disagree: refused before the run starts
    for declared, msg in (
        (["survival", "x" * 500], "a site's hello is malformed"),
        (["survival", 3], "a site's hello is malformed"),
        (["survival", None], "differ in task"),
    ):
        with pytest.raises(ConfigError, match=msg):
            agreed_task(declared)
    assert agreed_task(["survival", "survival"]) == "survival" and agreed_task([None, None]) is None
