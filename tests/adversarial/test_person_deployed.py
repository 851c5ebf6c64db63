"""Person-level DP deployed (issue 41, "a label without its mechanism"): with ``--id-column`` the id column
travels into every deployed site folder (its data export and its site.json), the sites sample, clip and
account by person, and summary.json says "person" only because every site's ledger composed the run per
person. A site whose declared unit is the row refuses a person-level run, and a run's summary never says
"person" for a ledger that composed rows."""

import json
import os
import stat
import subprocess
import sys

import pytest

from silofl.privacy.person import not_per_person
from tests.data.test_person_tables import person_frame
from tests.data.test_tables import write_csv, write_schema

ENV = {**os.environ, "SILOFL_NO_PROGRESS": "1", "COLUMNS": "200"}


def person_args(tmp_path, sites=None):
    """A FedAvg run's arguments on per-site tables with several rows per person (``sites``: their paths)."""
    sites = sites or [str(write_csv(tmp_path, person_frame(24, s), f"h{s}.csv")) for s in (0, 1)]
    return [
        "--method",
        "fedavg",
        "--dataset",
        "table",
        "--schema",
        str(write_schema(tmp_path)),
        "--site-data",
        ",".join(sites),
        "--proxy-model",
        "logreg",
        "--rounds",
        "1",
        "--batch-size",
        "8",
        "--delta",
        "1e-3",
        "--threads",
        "1",
    ]


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """One ``silofl deploy local`` person-level run (real SuperLink, SuperNodes and site workers), its
    ``--out`` folder."""
    tmp_path = tmp_path_factory.mktemp("person")
    out = tmp_path / "d"
    r = subprocess.run(
        [sys.executable, "-m", "silofl.cli.main", "deploy", "local", "--sites", "2"]
        + person_args(tmp_path)
        + ["--id-column", "patient_id", "--checkpoint-every", "1", "--out", str(out), "--timeout", "300"],
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.deploy
@pytest.mark.multiprocess
def test_a_deployed_person_level_run_is_sampled_and_accounted_by_person_at_every_site(deployed):
    out = deployed
    s = json.loads((out / "summary.json").read_text())
    assert "privacy unit: person (column patient_id)" in s["privacy"]["unit"]
    assert not not_per_person(s["accounting"]) and "person_level_missing" not in s["privacy"]
    folders = sorted(p for p in out.rglob("site.json"))
    assert len(folders) == 2
    for f in folders:
        assert json.loads(f.read_text())["id_column"] == "patient_id"  # the site's own data declaration
        entries = [
            json.loads(line) for line in (f.parent / "ledger" / "ledger.jsonl").read_text().splitlines()
        ]
        steps = [e for e in entries if e["kind"] == "dp-sgd"]
        assert steps and all(e["unit"] == "person (column patient_id)" for e in steps)
    for acc in s["accounting"]:
        assert acc["persons"] < acc["n"] and acc["sample_rate"] == pytest.approx(8 / acc["persons"])


def test_a_summary_says_person_only_when_every_ledger_composed_per_person():
    person = {"client": 0, "privacy_unit": "person (column pid)", "run_units": ["person (column pid)"]}
    assert not_per_person([person, {**person, "client": 1}]) == []
    assert not_per_person([person, {**person, "client": 1, "run_units": ["person (column pid)", "row"]}]) == [
        1
    ]
    assert not_per_person([person, {"client": 2, "run_units": ["row"]}]) == [2]
    assert not_per_person([{"client": 3}]) == [3]  # a site that reports no unit is not counted as a person


@pytest.mark.slow
@pytest.mark.deploy
@pytest.mark.multiprocess
def test_every_file_a_deployed_site_or_coordinator_writes_is_0600_in_a_0700_folder(deployed):
    """Checkpoints (``node*.json``: un-noised mean_grad_norm / clipped_fraction), ledgers, keys, models,
    metrics, the coordinator's spec, state and run folder: nothing readable by anyone but their owner."""
    loose = []
    for p in [deployed, *deployed.rglob("*")]:
        st = p.lstat()
        if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
            if stat.S_IMODE(st.st_mode) & 0o077:
                loose.append(f"{oct(stat.S_IMODE(st.st_mode))} {p.relative_to(deployed)}")
    checkpoints = list(deployed.rglob("node*.json"))
    assert checkpoints and any("sites" in str(c) for c in checkpoints)  # the sites' own checkpoints are there
    assert not loose, loose[:20]


def test_a_checkpoint_is_0600_in_0700_folders_whatever_the_umask(tmp_path):
    import os

    import torch

    from silofl.core.checkpoint import save_node

    old = os.umask(0o022)
    try:
        path = save_node(tmp_path / "a" / "round1", 0, {"w": torch.ones(2), "mean_grad_norm": 0.5})
    finally:
        os.umask(old)
    for p in (path, path.with_suffix(".safetensors")):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600
    for d in (tmp_path / "a", tmp_path / "a" / "round1"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700


def own_table_site(tmp_path, id_column=None):
    from silofl.deploy.site import SiteConfig

    data = write_csv(tmp_path, person_frame(20, 0), "own.csv")
    return SiteConfig(
        name="h0",
        data=str(data),
        schema=str(write_schema(tmp_path)),
        lifetime_epsilon=10.0,
        lifetime_delta=1e-3,
        id_column=id_column,
    )


def test_a_site_table_with_a_repeated_id_column_and_no_id_column_is_warned_about(tmp_path, caplog):
    from silofl.deploy.site import load_local, unit_facts

    d = load_local(tmp_path, own_table_site(tmp_path))
    assert d.persons is None and d.unit_warning["column"] == "patient_id"
    facts = unit_facts(d)  # what the site's signed hello declares, into the coordinator's summary
    assert facts["unit"] == "row" and facts["unit_warning"]["epsilon_unit"] == "row"
    assert (
        "patient_id" in caplog.text and "looks like a person id" in caplog.text and "per row" in caplog.text
    )
    d = load_local(tmp_path, own_table_site(tmp_path, "patient_id"))
    assert d.persons is not None and unit_facts(d)["unit"] == "person (column patient_id)"
    assert unit_facts(d)["units"] < len(d.y)


def test_a_site_without_an_id_column_refuses_a_person_level_run(tmp_path, tiny_cfg):
    from silofl.core.errors import ConfigError
    from silofl.deploy.site import SiteWorker, load_local

    w = SiteWorker.__new__(SiteWorker)
    w.cfg = own_table_site(tmp_path)
    w.data = load_local(tmp_path, w.cfg)
    with pytest.raises(ConfigError, match="person-level DP.*declares no id column"):
        w._inputs(tiny_cfg.replace(id_column="patient_id"))
