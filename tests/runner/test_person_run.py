"""A whole ProxyFL run on per-site tables with several rows per person: with --id-column the ε is per person
(q over persons, Opacus' RDP ε of what ran, the unit in summary.json and in every ledger entry); without it
the repeated id is flagged in the log and in summary.json."""

import json

import pytest
from opacus.accountants import RDPAccountant
from typer.testing import CliRunner

from silofl.cli.main import app
from tests.data.test_person_tables import person_frame
from tests.data.test_tables import write_csv, write_schema


def run(tmp_path, out, *extra):
    sites = [str(write_csv(tmp_path, person_frame(40, s), f"h{s}.csv")) for s in (0, 1)]
    args = [
        "run",
        "--method",
        "proxyfl",
        "--dataset",
        "table",
        "--schema",
        str(write_schema(tmp_path)),
        "--site-data",
        ",".join(sites),
        "--private-model",
        "logreg",
        "--proxy-model",
        "logreg",
        "--rounds",
        "2",
        "--batch-size",
        "8",
        "--delta",
        "1e-3",
        "--seed",
        "3",
        "--out",
        str(tmp_path / out),
        *extra,
    ]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    return r.output, json.loads((tmp_path / out / "summary.json").read_text())


@pytest.mark.slow
def test_proxyfl_with_an_id_column_spends_per_person_and_without_it_flags_the_repeated_id(tmp_path, caplog):
    _, s = run(tmp_path, "person", "--id-column", "patient_id")
    assert "privacy unit: person (column patient_id)" in s["privacy"]["unit"]
    assert "privacy_unit_warning" not in s and "looks like a person id" not in caplog.text
    for acc in s["accounting"]:
        persons = acc["persons"]
        assert persons == 32 and acc["n"] > persons  # 40 persons, 8 held out whole; several rows each
        assert acc["sample_rate"] == pytest.approx(8 / persons) and acc["steps"] == 2 * (persons // 8)
        opacus = RDPAccountant()
        opacus.history = [(acc["noise_multiplier"], acc["sample_rate"], acc["steps"])]
        assert acc["epsilon"] == pytest.approx(opacus.get_epsilon(1e-3), rel=1e-9)
        ledger = (tmp_path / "person" / "sites" / f"client{acc['client']}" / "ledger.jsonl").read_text()
        entries = [json.loads(line) for line in ledger.splitlines()]
        assert entries and all(e["unit"] == "person (column patient_id)" for e in entries)
    _, s = run(tmp_path, "rows", "--rounds", "1")
    w = s["privacy_unit_warning"]
    assert w["column"] == "patient_id" and w["max_rows_per_value"] == 4 and w["epsilon_unit"] == "row"
    assert "looks like a person id" in caplog.text and "one training example" in s["privacy"]["unit"]


def test_a_pooling_site_numbers_every_tables_persons_apart():
    import torch

    from silofl.data import SplitData
    from silofl.runner.loop import site_persons

    split = SplitData.__new__(SplitData)
    split.persons = [torch.tensor([0, 1, 0]), torch.tensor([1, 0])]
    assert [p.tolist() for p in site_persons(split, 2)] == [[0, 1, 0], [1, 0]]
    assert site_persons(split, 1)[0].tolist() == [0, 1, 0, 3, 2]  # Joint: the second table's persons 2, 3
    split.persons = None
    assert site_persons(split, 2) is None
