"""Person-level DP deployed (issue 41, "a label without its mechanism"): with ``--id-column`` the id column
travels into every deployed site folder (its data export and its site.json), the sites sample, clip and
account by person, and summary.json says "person" only because every site's ledger composed the run per
person. A site whose declared unit is the row refuses a person-level run, and a run's summary never says
"person" for a ledger that composed rows."""

import json
import os
import subprocess
import sys

import pytest

from silofl.privacy.person import not_per_person
from tests.data.test_person_tables import person_frame
from tests.data.test_tables import write_csv, write_schema

ENV = {**os.environ, "SILOFL_NO_PROGRESS": "1", "COLUMNS": "200"}


def person_args(tmp_path):
    sites = [str(write_csv(tmp_path, person_frame(24, s), f"h{s}.csv")) for s in (0, 1)]
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


@pytest.mark.slow
@pytest.mark.deploy
@pytest.mark.multiprocess
def test_a_deployed_person_level_run_is_sampled_and_accounted_by_person_at_every_site(tmp_path):
    out = tmp_path / "d"
    r = subprocess.run(
        [sys.executable, "-m", "silofl.cli.main", "deploy", "local", "--sites", "2"]
        + person_args(tmp_path)
        + ["--id-column", "patient_id", "--out", str(out), "--timeout", "300"],
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
    )
    assert r.returncode == 0, r.stderr[-3000:]
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
