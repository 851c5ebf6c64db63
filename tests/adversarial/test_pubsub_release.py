"""What a PubSub-ML site releases, and how much of its budget that takes (findings 2, 5 and the broker part of
7).

Before: a publishing site joined the broker with its rows' exact per-feature mean/min/max (and a failed
publish
joined all the same), its models clipped to and carried those values, a regression model held the exact target
min/max, diffprivlib's ``classes_`` told which declared class a site lacked; record ids were row positions in
memory, so two streams and a publish on the same 300 rows left each record in three live models while each run
printed "every record: ε = 1"; a published MLP with 1e308 weights was accepted and ``customize`` died on it.
"""

import json
import sqlite3

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import save
from typer.testing import CliRunner

from silofl.cli.main import app
from silofl.core.errors import ModelRejected
from silofl.privacy.ledger import Ledger
from silofl.pubsub.broker import Broker
from silofl.pubsub.model import PublishedModel, checksum
from tests.data.test_tables import SCHEMA, site_frame, write_schema

runner = CliRunner()


def publish(tmp_path, data, site="a", *extra, epsilon="1", lifetime="10", schema=None):
    return runner.invoke(
        app,
        [
            "pubsub",
            "publish",
            "--broker",
            str(tmp_path / "broker"),
            "--site",
            site,
            "--data",
            str(data),
            "--schema",
            str(schema or write_schema(tmp_path)),
            "--epsilon",
            epsilon,
            "--site-dir",
            str(tmp_path / "sites" / site),
            "--lifetime-epsilon",
            lifetime,
            *extra,
        ],
    )


def stream(tmp_path, data, site="a", *extra, epsilon="1", lifetime="10"):
    return runner.invoke(
        app,
        [
            "pubsub",
            "stream",
            "--broker",
            str(tmp_path / "broker"),
            "--site",
            site,
            "--data",
            str(data),
            "--schema",
            str(write_schema(tmp_path)),
            "--epsilon",
            epsilon,
            "--chunk-size",
            "100",
            "--site-dir",
            str(tmp_path / "sites" / site),
            "--lifetime-epsilon",
            lifetime,
            *extra,
        ],
    )


def said(res) -> str:
    """The command's output with the console's line wrapping undone."""
    return " ".join(res.output.split())


def released(tmp_path, site="a") -> tuple[float, float]:
    return Ledger(tmp_path / "sites" / site / "ledger").spent()


# ---------------------------------------------------------------------------------------------- finding 2
def test_a_publish_releases_the_schemas_metadata_and_no_statistic_of_its_rows(tmp_path):
    for site, shift in (("a", 0.0), ("b", 30.0)):  # two sites with very different data
        site_frame(120, seed=len(site), shift=shift).to_csv(tmp_path / f"{site}.csv", index=False)
        res = publish(tmp_path, tmp_path / f"{site}.csv", site)
        assert res.exit_code == 0, res.output
    b = Broker(tmp_path / "broker")
    declared = {
        "age": (0.0, 120.0),
        "dose": (0.0, 10.0),
        "ward=a": (0.0, 1.0),
        "ward=b": (0.0, 1.0),
        "ward=c": (0.0, 1.0),
    }
    assert b.public_bounds("a") == declared == b.public_bounds("b")
    assert b.public_defaults() == {"age": 60.0, "dose": 5.0, "ward=a": 0.0, "ward=b": 0.0, "ward=c": 0.0}
    for m in (b.fetch(1), b.fetch(2)):
        assert m.tensors["input_lo"].tolist() == [v[0] for v in declared.values()]
        assert m.tensors["input_hi"].tolist() == [v[1] for v in declared.values()]


def test_a_regression_model_carries_the_declared_target_range_not_the_rows(tmp_path):
    schema = {
        **SCHEMA,
        "target": {"name": "dose", "bounds": [0, 50]},
        "features": {k: v for k, v in SCHEMA["features"].items() if k != "dose"},
        "ignore": ["patient_id", "outcome"],
    }
    df = site_frame(150, seed=4)
    df.to_csv(tmp_path / "r.csv", index=False)
    res = publish(
        tmp_path,
        tmp_path / "r.csv",
        "a",
        "--model",
        "dp-linreg",
        schema=write_schema(tmp_path, schema, "r.yaml"),
    )
    assert res.exit_code == 0, res.output
    m = Broker(tmp_path / "broker").fetch(1)
    assert m.task == "regression" and m.mechanism["bounds_y"] == [0.0, 50.0]
    assert df.dose.max() < 20  # the rows' own range appears nowhere


def test_a_class_the_rows_lack_does_not_show_in_the_published_model(tmp_path):
    schema = {**SCHEMA, "target": {"name": "outcome", "levels": ["no", "yes", "unknown"]}}
    site_frame(150, seed=5).to_csv(tmp_path / "a.csv", index=False)  # only "no" and "yes"
    res = publish(tmp_path, tmp_path / "a.csv", "a", schema=write_schema(tmp_path, schema, "s3.yaml"))
    assert res.exit_code == 0, res.output
    m = Broker(tmp_path / "broker").fetch(1)
    assert (
        m.classes == ["no", "yes", "unknown"] and m.tensors["coef"].shape[0] == 3
    )  # one row per declared class
    res = publish(
        tmp_path,
        tmp_path / "a.csv",
        "c",
        "--model",
        "dp-nb",
        schema=write_schema(tmp_path, schema, "s3.yaml"),
    )
    assert (
        res.exit_code == 2 and "declared class" in res.output
    )  # GaussianNB would publish an exact zero count


def test_a_failed_publish_neither_joins_nor_counts(tmp_path):
    df = site_frame(100, seed=6)
    df.assign(outcome="no").to_csv(tmp_path / "one.csv", index=False)
    res = publish(tmp_path, tmp_path / "one.csv", "a", "--model", "dp-nb")  # training refuses a lacking class
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "a" not in Broker(tmp_path / "broker").sites() and released(tmp_path) == (0.0, 0.0)
    # the broker refuses the model (the site joined earlier with other bounds): the recorded release is
    # cancelled
    meta = {
        "age": ("continuous", 60.0, 0.0, 99.0),
        "dose": ("continuous", 5.0, 0.0, 10.0),
        **{f"ward={w}": ("continuous", 0.0, 0.0, 1.0) for w in "abc"},
    }
    Broker(tmp_path / "broker").join("b", meta)
    df.to_csv(tmp_path / "b.csv", index=False)
    res = publish(tmp_path, tmp_path / "b.csv", "b")
    assert res.exit_code == 2 and "not the public bounds" in res.output
    assert released(tmp_path, "b") == (0.0, 0.0) and Broker(tmp_path / "broker").models() == []
    kinds = [
        e["kind"]
        for e in Ledger(tmp_path / "sites" / "b" / "ledger").entries
        if e["kind"] not in ("genesis", "budget")
    ]
    assert kinds == ["release", "cancel"]
    # a file that does not match the schema: nothing joins, nothing is recorded
    df.rename(columns={"dose": "dosage"}).to_csv(tmp_path / "wrong.csv", index=False)
    res = publish(tmp_path, tmp_path / "wrong.csv", "w")
    assert res.exit_code == 2 and "'dose' of the schema is missing" in res.output
    assert "w" not in Broker(tmp_path / "broker").sites()


# ---------------------------------------------------------------------------------------------- finding 5
def test_two_streams_and_a_publish_on_the_same_rows_compose_in_the_ledger(tmp_path):
    df = site_frame(300, seed=7)
    df.to_csv(tmp_path / "rows.csv", index=False)
    for _ in range(2):
        res = stream(tmp_path, tmp_path / "rows.csv", "a", "--id-column", "patient_id", lifetime="2.5")
        assert res.exit_code == 0, res.output
    assert "spent up to ε=2," in said(res) and released(tmp_path) == (2.0, 2e-5)
    before = Broker(tmp_path / "broker").models()
    res = publish(tmp_path, tmp_path / "rows.csv", "a", "--id-column", "patient_id", lifetime="2.5")
    assert res.exit_code == 2 and "lifetime budget ε=2.5" in said(res)  # a third release would reach ε = 3
    assert Broker(tmp_path / "broker").models() == before and released(tmp_path) == (2.0, 2e-5)
    # the same patients in another file and order are the same records; new patients are not
    df.iloc[::-1].iloc[:50].to_csv(tmp_path / "again.csv", index=False)
    res = publish(tmp_path, tmp_path / "again.csv", "a", "--id-column", "patient_id", epsilon="0.6")
    assert res.exit_code == 2 and "lifetime budget" in said(res)
    site_frame(80, seed=8).assign(patient_id=np.arange(1000, 1080)).to_csv(tmp_path / "new.csv", index=False)
    res = publish(tmp_path, tmp_path / "new.csv", "a", "--id-column", "patient_id", lifetime="2.5")
    assert res.exit_code == 0, res.output


def test_without_an_id_column_a_record_is_known_by_its_content(tmp_path):
    df = site_frame(120, seed=9).drop(columns="patient_id")
    df = pd.concat([df, df.iloc[:1]])  # two identical rows are two records
    df.to_csv(tmp_path / "a.csv", index=False)
    assert publish(tmp_path, tmp_path / "a.csv", "a", lifetime="1.5").exit_code == 0
    df.sample(frac=1, random_state=0).to_csv(tmp_path / "shuffled.csv", index=False)
    res = publish(tmp_path, tmp_path / "shuffled.csv", "a", lifetime="1.5")
    assert res.exit_code == 2 and "lifetime budget" in said(res)


def test_a_stream_chunk_past_the_budget_is_refused_and_the_earlier_chunks_stay(tmp_path):
    df = site_frame(300, seed=10)
    df.to_csv(tmp_path / "rows.csv", index=False)
    df.iloc[:100].to_csv(tmp_path / "head.csv", index=False)  # the first 100 rows again
    assert publish(tmp_path, tmp_path / "head.csv", "a", lifetime="1").exit_code == 0
    res = stream(tmp_path, tmp_path / "rows.csv", "a", lifetime="1")
    assert res.exit_code == 2 and "lifetime budget" in said(res)  # chunk 0 holds those 100 rows
    assert len(Broker(tmp_path / "broker").models()) == 1


def test_a_lifetime_budget_is_declared_once(tmp_path):
    site_frame(100, seed=11).to_csv(tmp_path / "a.csv", index=False)
    res = runner.invoke(
        app,
        [
            "pubsub",
            "publish",
            "--broker",
            str(tmp_path / "broker"),
            "--site",
            "a",
            "--data",
            str(tmp_path / "a.csv"),
            "--schema",
            str(write_schema(tmp_path)),
            "--epsilon",
            "1",
            "--site-dir",
            str(tmp_path / "sites" / "a"),
        ],
    )
    assert res.exit_code == 2 and "no lifetime privacy budget" in res.output
    assert publish(tmp_path, tmp_path / "a.csv", "a", lifetime="3").exit_code == 0
    res = publish(tmp_path, tmp_path / "a.csv", "a", lifetime="30")  # raising it later is refused
    assert res.exit_code == 2 and "set once" in res.output


def test_an_edited_ledger_stops_the_site(tmp_path):
    site_frame(100, seed=12).to_csv(tmp_path / "a.csv", index=False)
    assert publish(tmp_path, tmp_path / "a.csv", "a", lifetime="1").exit_code == 0
    path = tmp_path / "sites" / "a" / "ledger" / "ledger.jsonl"
    lines = path.read_text().splitlines()
    entry = json.loads(lines[-1])  # the release
    path.write_text(
        "\n".join([*lines[:-1], json.dumps({**entry, "epsilon": 0.0})]) + "\n"
    )  # "nothing was spent"
    res = publish(tmp_path, tmp_path / "a.csv", "a", lifetime="1")
    assert res.exit_code == 2 and "fails its MAC" in res.output
    path.write_text("")  # or roll it back entirely: the site no longer matches its ledger head
    assert Ledger(tmp_path / "sites" / "a" / "ledger").spent() == (0.0, 0.0)


# ---------------------------------------------------------------------------------------------- finding 7
# (broker)
def mlp(weight: float) -> PublishedModel:
    g = torch.Generator().manual_seed(0)
    t = {
        "hidden.0.weight": torch.rand(8, 2, generator=g, dtype=torch.float64) * weight,
        "hidden.0.bias": torch.zeros(8, dtype=torch.float64),
        "out.weight": torch.rand(2, 8, generator=g, dtype=torch.float64) * weight - weight / 2,
        "out.bias": torch.zeros(2, dtype=torch.float64),
        "input_lo": torch.zeros(2, dtype=torch.float64),
        "input_hi": torch.ones(2, dtype=torch.float64),
    }
    return PublishedModel(
        publisher="p",
        kind="mlp",
        features=["x0", "x1"],
        task="classification",
        tensors=t,
        epsilon=1.0,
        delta=1e-5,
        mechanism={"name": "dp-sgd"},
        classes=["0", "1"],
    )


def unchecked_bytes(m: PublishedModel) -> bytes:
    """The model's bytes as a hostile publisher writes them (``to_bytes`` would refuse them)."""
    return save(m.tensors, metadata={"silofl.pubsub": json.dumps(m.meta())})


def test_the_broker_refuses_a_model_whose_outputs_overflow(tmp_path):
    b = Broker(tmp_path / "broker")
    b.join("p", {"x0": ("continuous", 0.5, 0.0, 1.0), "x1": ("continuous", 0.5, 0.0, 1.0)})
    with pytest.raises(ModelRejected, match="not finite on probe inputs"):
        b.publish(unchecked_bytes(mlp(1e308)))
    assert b.models() == [] and list(b.models_dir.iterdir()) == []
    assert b.publish(mlp(1.0).to_bytes()) == 1


def test_customize_skips_a_stored_model_that_fails_its_checks(tmp_path):
    b = Broker(tmp_path / "broker")
    feats = {"x0": ("continuous", 0.5, 0.0, 1.0), "x1": ("continuous", 0.5, 0.0, 1.0)}
    b.join("p", feats)
    b.publish(mlp(1.0).to_bytes())
    bad = unchecked_bytes(mlp(1e308))  # stored behind the broker's back (or before it probed models)
    (b.models_dir / f"{checksum(bad)}.safetensors").write_bytes(bad)
    with sqlite3.connect(b.db_path) as db:
        db.execute(
            "INSERT INTO models (publisher, kind, task, features, classes, epsilon, delta, chunk, "
            "created_at, "
            "checksum, size, file) VALUES ('p', 'mlp', 'classification', '[\"x0\", \"x1\"]', '[\"0\", "
            '"1"]\', 1, '
            "1e-5, NULL, 'now', ?, ?, ?)",
            (checksum(bad), len(bad), f"{checksum(bad)}.safetensors"),
        )
    b.join("s")
    b.subscribe("s", [["x0"]])
    rng = np.random.default_rng(0)
    x = rng.random((200, 2))
    pd.DataFrame({"x0": x[:, 0], "x1": x[:, 1], "y": (x.sum(1) > 1).astype(int)}).to_csv(
        tmp_path / "s.csv", index=False
    )
    res = runner.invoke(
        app,
        [
            "pubsub",
            "customize",
            "--broker",
            str(tmp_path / "broker"),
            "--site",
            "s",
            "--data",
            str(tmp_path / "s.csv"),
            "--target",
            "y",
            "--out",
            str(tmp_path / "out"),
        ],
    )
    assert res.exit_code == 0, res.output
    rep = json.loads((tmp_path / "out" / "customization.json").read_text())
    assert rep["models_fetched"] == [1] and rep["models_skipped"] == [2] and "skipped model 2" in res.output
