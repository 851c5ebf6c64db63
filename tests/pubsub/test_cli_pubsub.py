"""silofl pubsub publish / subscribe / list / customize on CSV files, end to end."""

import csv
import json

import numpy as np
from sklearn.datasets import load_breast_cancer
from typer.testing import CliRunner

from silofl.cli.main import app


def _csv(path, x, y, names, cols):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([names[c] for c in cols] + ["diagnosis"])
        for row, label in zip(x[:, cols], y, strict=True):
            w.writerow([*row, ["malignant", "benign"][label]])


def _schema(path, names, cols) -> str:
    """The collaboration's schema: breast-cancer features with bounds declared as public knowledge (here: the
    public data set's range, widened), the diagnosis labels."""
    d = load_breast_cancer()
    feats = {
        names[c]: {"type": "numeric", "bounds": [0.0, float(np.ceil(d.data[:, c].max() * 1.5))]} for c in cols
    }
    path.write_text(
        json.dumps({"target": {"name": "diagnosis", "levels": ["benign", "malignant"]}, "features": feats})
    )
    return str(path)


def test_publish_subscribe_customize(tmp_path):
    d = load_breast_cancer()
    names = [n.replace(" ", "_") for n in d.feature_names]
    p = np.array_split(np.random.default_rng(0).permutation(len(d.data)), 3)
    _csv(tmp_path / "a.csv", d.data[p[0]], d.target[p[0]], names, range(0, 15))
    _csv(tmp_path / "b.csv", d.data[p[1]], d.target[p[1]], names, range(10, 30))
    _csv(tmp_path / "s.csv", d.data[p[2]], d.target[p[2]], names, [*range(0, 5), *range(20, 25)])
    schemas = {
        "a": _schema(tmp_path / "a.json", names, range(0, 15)),
        "b": _schema(tmp_path / "b.json", names, range(10, 30)),
    }
    r = CliRunner()
    broker = str(tmp_path / "broker")
    for site, model in (("a", "dp-logreg"), ("b", "dp-forest")):
        res = r.invoke(
            app,
            [
                "pubsub",
                "publish",
                "--broker",
                broker,
                "--site",
                site,
                "--data",
                str(tmp_path / f"{site}.csv"),
                "--schema",
                schemas[site],
                "--model",
                model,
                "--epsilon",
                "2",
                "--site-dir",
                str(tmp_path / "sites" / site),
                "--lifetime-epsilon",
                "4",
            ],
        )
        assert res.exit_code == 0, res.output
        assert "published model" in res.output and "spent up to ε=2" in res.output
    res = r.invoke(
        app,
        [
            "pubsub",
            "subscribe",
            "--broker",
            broker,
            "--site",
            "s",
            "--channel",
            "mean_radius|worst_radius,worst_texture",
        ],
    )
    assert res.exit_code == 0 and "2 models match" in res.output, res.output
    res = r.invoke(app, ["pubsub", "list", "--broker", broker])
    assert res.exit_code == 0 and "dp" not in res.output.split("sites:")[0]
    out = tmp_path / "out"
    res = r.invoke(
        app,
        [
            "pubsub",
            "customize",
            "--broker",
            broker,
            "--site",
            "s",
            "--data",
            str(tmp_path / "s.csv"),
            "--target",
            "diagnosis",
            "--top-m",
            "2",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    rep = json.loads((out / "customization.json").read_text())
    assert rep["models_fetched"] == [1, 2] and len(rep["selected"]) == 2 and rep["models_skipped"] == []
    assert set(rep["seconds"]) == {"load", "own", "select", "fuse"}
    res = r.invoke(
        app,
        [
            "pubsub",
            "publish",
            "--broker",
            broker,
            "--site",
            "a",
            "--data",
            str(tmp_path / "b.csv"),
            "--schema",
            schemas["a"],
            "--epsilon",
            "1",
            "--site-dir",
            str(tmp_path / "sites" / "a"),
        ],
    )
    assert (
        res.exit_code == 2 and "of the schema is missing" in res.output
    )  # one line, whatever the terminal width
    res = r.invoke(
        app,
        [
            "pubsub",
            "publish",
            "--broker",
            broker,
            "--site",
            "a",
            "--data",
            str(tmp_path / "a.csv"),
            "--epsilon",
            "1",
        ],
    )
    assert res.exit_code == 2 and "--schema" in res.output  # the public metadata comes from a declared schema
    res = r.invoke(
        app,
        [
            "pubsub",
            "customize",
            "--broker",
            broker,
            "--site",
            "s",
            "--data",
            str(tmp_path / "s.csv"),
            "--target",
            "diagnosis",
            "--top-m",
            "abc",
            "--out",
            str(tmp_path / "o2"),
        ],
    )
    assert (
        res.exit_code == 2
        and "--top-m takes a positive number" in res.output
        and "Traceback" not in res.output
    )


def test_leave(tmp_path):
    from silofl.pubsub.broker import Broker

    b = Broker(tmp_path / "broker")
    b.join("a", {"x": ("continuous", 0.0, -1.0, 1.0)})
    r = CliRunner()
    res = r.invoke(app, ["pubsub", "leave", "--broker", str(tmp_path / "broker"), "--site", "a"])
    assert res.exit_code == 0 and "0 published model(s) withdrawn" in res.output
    res = r.invoke(app, ["pubsub", "leave", "--broker", str(tmp_path / "broker"), "--site", "a"])
    assert res.exit_code == 2 and "unknown site" in res.output


def test_schema_tables_publish_with_the_schemas_public_bounds(tmp_path):
    """With --schema a site's CSV or Parquet is checked, categories become 0/1 columns, and the site joins the
    broker with the schema's declared bounds (not its data's min/max)."""
    from silofl.pubsub.broker import Broker
    from tests.data.test_tables import site_frame, write_schema

    schema = str(write_schema(tmp_path))
    site_frame(80, seed=0).to_csv(tmp_path / "a.csv", index=False)
    site_frame(80, seed=1).to_parquet(tmp_path / "b.parquet", index=False)
    site_frame(60, seed=2).to_csv(tmp_path / "s.csv", index=False)
    r = CliRunner()
    broker = str(tmp_path / "broker")
    for site, data in (("a", "a.csv"), ("b", "b.parquet")):
        res = r.invoke(
            app,
            [
                "pubsub",
                "publish",
                "--broker",
                broker,
                "--site",
                site,
                "--data",
                str(tmp_path / data),
                "--schema",
                schema,
                "--model",
                "dp-logreg",
                "--epsilon",
                "1",
                "--site-dir",
                str(tmp_path / site),
                "--lifetime-epsilon",
                "1",
            ],
        )
        assert res.exit_code == 0, res.output
        assert "5 features" in res.output  # age, dose, ward=a, ward=b, ward=c
    bounds = Broker(broker).public_bounds("a")
    assert bounds["age"] == (0.0, 120.0) and bounds["ward=b"] == (0.0, 1.0)
    assert (
        r.invoke(
            app, ["pubsub", "subscribe", "--broker", broker, "--site", "s", "--channel", "age"]
        ).exit_code
        == 0
    )
    res = r.invoke(
        app,
        [
            "pubsub",
            "customize",
            "--broker",
            broker,
            "--site",
            "s",
            "--data",
            str(tmp_path / "s.csv"),
            "--schema",
            schema,
            "--out",
            str(tmp_path / "cust"),
        ],
    )
    assert res.exit_code == 0, res.output
    site_frame(30, seed=3).assign(outcome="no").to_csv(tmp_path / "one.csv", index=False)
    res = r.invoke(
        app,
        [
            "pubsub",
            "publish",
            "--broker",
            broker,
            "--site",
            "c",
            "--data",
            str(tmp_path / "one.csv"),
            "--schema",
            schema,
            "--model",
            "dp-nb",
            "--epsilon",
            "1",
            "--site-dir",
            str(tmp_path / "c"),
            "--lifetime-epsilon",
            "1",
        ],
    )
    assert res.exit_code == 2 and "declared class" in res.output and "Traceback" not in res.output
    assert "c" not in Broker(broker).sites()  # a failed publish does not join
