"""`silofl predict` and `silofl export` on tables and images: the preprocessing is applied exactly as in
training, the ONNX graph gives the PyTorch outputs, and the model card states what the privacy covers."""

import csv
import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from silofl.cli.main import app
from silofl.core.errors import ConfigError
from silofl.data.schema import Schema, read_table
from silofl.inference import load_pipeline, predict
from silofl.inference.export import export
from silofl.runner.config import RunConfig
from silofl.runner.data import prepare_data
from silofl.runner.loop import run as simulate
from tests.data.test_formats import _write_images
from tests.data.test_tables import SCHEMA, site_frame, write_csv, write_schema

runner = CliRunner()


@pytest.fixture(scope="module")
def table_run(tmp_path_factory):
    """A tiny ProxyFL run on three hospitals' CSV/Parquet files (private tabmlp, DP logreg proxy)."""
    d = tmp_path_factory.mktemp("tables")
    schema = dict(SCHEMA, scaling="site")  # site statistics: the model card must say they are not DP
    paths = [str(write_csv(d, site_frame(48, seed=k, shift=8 * k), f"hospital{k}.csv")) for k in range(2)]
    site_frame(48, seed=2, shift=16).to_parquet(d / "hospital2.parquet", index=False)
    paths.append(str(d / "hospital2.parquet"))
    cfg = RunConfig.from_dict(
        dict(
            method="proxyfl",
            dataset="table",
            schema=str(write_schema(d, schema)),
            site_data=paths,
            rounds=2,
            private_model="tabmlp",
            proxy_model="logreg",
            delta=1e-3,
            out=str(d / "run"),
            threads=1,
            seed=0,
        )
    )
    simulate(cfg, progress=False)
    return d, cfg


def read_preds(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_table_run_writes_each_sites_preprocessing_and_per_site_figures(table_run):
    d, cfg = table_run
    s = json.loads((d / "run" / "summary.json").read_text())
    assert s["sites"] == ["hospital0", "hospital1", "hospital2"] and s["clients"] == 3
    assert all(r["private_acc_internal"] is not None for r in s["final"]["per_client"])
    preps = [
        json.loads((d / "run" / "models" / f"client{k}_preprocessing.json").read_text()) for k in range(3)
    ]
    assert [p["site"] for p in preps] == s["sites"]
    assert {a["dp_backend"] for a in s["accounting"]} == {"ghost"}  # logreg on the fast per-example norm path
    assert preps[0]["center"][0] != preps[1]["center"][0]  # each site's own statistics, not pooled


def test_predict_applies_the_training_preprocessing_exactly(table_run):
    d, cfg = table_run
    _, split = prepare_data(cfg.resolve(), torch.device("cpu"))
    loaded = load_pipeline(d / "run", 1, "private")
    raw, _, _ = Schema.load(cfg.schema).check(read_table(cfg.site_data[1]), "")
    keep = np.sort(np.random.default_rng([cfg.seed, 1]).permutation(len(raw))[int(round(len(raw) * 0.2)) :])
    with torch.no_grad():
        via_predict = loaded.pipeline(torch.as_tensor(raw[keep], dtype=torch.float32))
        in_training = torch.softmax(loaded.pipeline.model(split.parts[1][0]), 1)
    assert torch.allclose(via_predict, in_training, atol=1e-6)


def test_predict_on_a_csv_with_and_without_labels(table_run, tmp_path):
    d, cfg = table_run
    new = site_frame(20, seed=7)
    res = predict(d / "run", 0, write_csv(tmp_path, new, "new.csv"), tmp_path / "p.csv")
    rows = read_preds(tmp_path / "p.csv")
    assert (
        res["rows"] == 20
        and len(rows) == 20
        and set(rows[0]) == {"id", "prediction", "p_no", "p_yes", "label"}
    )
    assert res["accuracy"] == pytest.approx(np.mean([r["prediction"] == r["label"] for r in rows]))
    assert all(abs(float(r["p_no"]) + float(r["p_yes"]) - 1) < 1e-5 for r in rows)
    unlabelled = new.drop(columns="outcome")
    unlabelled.loc[3, "dose"] = np.nan  # imputed as in training
    res = predict(
        d / "run", 2, write_csv(tmp_path, unlabelled, "u.csv"), tmp_path / "u_preds.csv", model="shared"
    )
    rows = read_preds(tmp_path / "u_preds.csv")
    assert res["accuracy"] is None and "label" not in rows[0] and res["model"] == "client2_proxy"
    assert res["nan_rows"] == 0
    with pytest.raises(ConfigError, match="exists"):
        predict(d / "run", 0, tmp_path / "new.csv", tmp_path / "p.csv")


@pytest.mark.slow  # whole runs (fast tier ≤ 60 s)
def test_predict_from_a_sites_own_folder(table_run, tmp_path):
    """A site keeps only its own files (models and preprocessing), not the run folder."""
    import shutil

    d, _ = table_run
    site = tmp_path / "hospital0"
    site.mkdir()
    for f in (d / "run" / "models").glob("client0_*"):
        shutil.copy(f, site)
    new = write_csv(tmp_path, site_frame(6, seed=3), "new.csv")
    a = predict(site, 0, new, tmp_path / "a.csv")
    predict(d / "run", 0, new, tmp_path / "b.csv")
    assert read_preds(tmp_path / "a.csv") == read_preds(tmp_path / "b.csv") and a["rows"] == 6
    card = export(
        site, 0, tmp_path / "card"
    )  # no summary.json beside the models: the card says the privacy is unknown
    assert card["privacy"]["differentially_private"] is None and card["evaluation"] == {}


def test_predict_and_export_errors_are_one_line(table_run, tmp_path):
    d, _ = table_run
    r = runner.invoke(
        app, ["predict", str(d / "run"), "--client", "7", "--data", "x.csv", "--out", str(tmp_path / "o")]
    )
    assert r.exit_code == 2 and "no model of client 7" in r.output
    bad = site_frame(5).assign(ward="icu")
    r = runner.invoke(
        app,
        [
            "predict",
            str(d / "run"),
            "--client",
            "0",
            "--data",
            str(write_csv(tmp_path, bad, "b.csv")),
            "--out",
            str(tmp_path / "o.csv"),
        ],
    )
    assert r.exit_code == 2 and "column 'ward' has value 'icu'" in r.output and "Traceback" not in r.output
    r = runner.invoke(
        app, ["export", str(d / "run"), "--client", "0", "--format", "pmml", "--out", str(tmp_path / "e")]
    )
    assert r.exit_code == 2 and "--format takes onnx" in r.output


@pytest.mark.slow  # whole runs (fast tier ≤ 60 s)
@pytest.mark.multiprocess
def test_onnx_export_equals_pytorch_and_the_card_says_what_is_dp(table_run, tmp_path):
    import onnxruntime as ort

    d, _ = table_run
    r = runner.invoke(
        app, ["export", str(d / "run"), "--client", "1", "--model", "private", "--out", str(tmp_path / "p")]
    )
    assert r.exit_code == 0, r.output
    card = json.loads((tmp_path / "p" / "model_card.json").read_text())
    assert (
        card["privacy"]["differentially_private"] is False
        and "NOT differentially private" in card["privacy"]["statement"]
    )
    assert "NOT differentially private" in card["training_data"]["preprocessing_statistics"]  # scaling: site
    assert card["training_data"]["source"].endswith("hospital1.csv")
    assert "NOT differentially private" in (tmp_path / "p" / "model_card.md").read_text()

    loaded = load_pipeline(d / "run", 1, "private")
    rng = np.random.default_rng(0)
    x = np.stack([rng.uniform(0, 120, 64), rng.uniform(0, 10, 64), rng.integers(0, 3, 64)], 1).astype(
        np.float32
    )
    x[5, 1] = np.nan  # dose: imputed inside the graph
    x[6, 2] = np.nan  # ward: a missing category is all zeros
    sess = ort.InferenceSession(str(tmp_path / "p" / "model.onnx"))
    got = sess.run(["probabilities"], {"x": x})[0]
    with torch.no_grad():
        want = loaded.pipeline(torch.from_numpy(x)).numpy()
    assert got.shape == (64, 2) and np.isfinite(got).all()
    assert np.abs(got - want).max() < 1e-5
    # the exported graph runs where silofl (and torch) cannot be imported: a fresh interpreter that blocks
    # them
    np.save(tmp_path / "x.npy", x)
    code = (
        "import sys; sys.modules['silofl'] = None; sys.modules['torch'] = None\n"
        "import numpy as np, onnxruntime as ort\n"
        f"s = ort.InferenceSession({str(tmp_path / 'p' / 'model.onnx')!r})\n"
        f"np.save({str(tmp_path / 'y.npy')!r}, s.run(['probabilities'], {{'x': "
        f"np.load({str(tmp_path / 'x.npy')!r})}})[0])"
    )
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert np.array_equal(np.load(tmp_path / "y.npy"), got)

    export(d / "run", 1, tmp_path / "s", model="shared")
    card = json.loads((tmp_path / "s" / "model_card.json").read_text())
    summary = json.loads((d / "run" / "summary.json").read_text())
    assert card["model"]["role"] == "proxy" and card["privacy"]["differentially_private"] is True
    assert card["privacy"]["epsilon"] == pytest.approx(summary["accounting"][1]["epsilon"])
    assert card["privacy"]["delta"] == 1e-3 and "example" in card["privacy"]["unit"]
    assert card["evaluation"]["accuracy_external"] == pytest.approx(
        summary["final"]["per_client"][1]["proxy_acc"]
    )
    with pytest.raises(ConfigError, match="not empty"):
        export(d / "run", 1, tmp_path / "s", model="shared")


def test_a_run_without_recorded_preprocessing_is_refused(tmp_path):
    cfg = RunConfig.from_dict(
        dict(
            method="fedavg",
            dataset="digits",
            clients=2,
            rounds=1,
            samples_per_client=60,
            batch_size=20,
            delta=1e-3,
            test_limit=50,
            proxy_model="mlp",
            out=str(tmp_path / "r"),
            threads=1,
        )
    )
    simulate(cfg, progress=False)
    with pytest.raises(ConfigError, match="no recorded preprocessing"):
        load_pipeline(tmp_path / "r", 0, "shared")
    with pytest.raises(ConfigError, match="no private model"):
        load_pipeline(tmp_path / "r", 0, "private")


@pytest.mark.slow
def test_image_sites_predict_and_onnx(tmp_path):
    """Two hospitals' image folders (one grey, standardised per site), FedAvg, predict on a folder, ONNX
    equal."""
    import onnxruntime as ort

    _write_images(tmp_path / "a", n=8)
    _write_images(tmp_path / "b", classes=("benign", "normal"), n=8)
    _write_images(tmp_path / "new", n=3)
    r = runner.invoke(
        app,
        [
            "run",
            "--method",
            "fedavg",
            "--dataset",
            "folder",
            "--site-data",
            f"{tmp_path / 'a'},{tmp_path / 'b'}",
            "--set",
            "image_size=16",
            "--proxy-model",
            "cnn1",
            "--rounds",
            "2",
            "--delta",
            "1e-3",
            "--threads",
            "1",
            "--quiet",
            "--out",
            str(tmp_path / "run"),
        ],
    )
    assert r.exit_code == 0, r.output
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["sites"] == ["a", "b"] and s["final"]["per_client"][1]["global_acc_internal"] is not None
    preps = [
        json.loads((tmp_path / "run" / "models" / f"client{k}_preprocessing.json").read_text())
        for k in range(2)
    ]
    assert preps[0]["classes"] == ["benign", "malignant", "normal"] == preps[1]["classes"]
    assert preps[0]["mean"] != preps[1]["mean"]  # each site's own statistics
    r = runner.invoke(
        app,
        [
            "predict",
            str(tmp_path / "run"),
            "--client",
            "1",
            "--model",
            "shared",
            "--data",
            str(tmp_path / "new"),
            "--out",
            str(tmp_path / "preds.csv"),
        ],
    )
    assert r.exit_code == 0, r.output
    rows = read_preds(tmp_path / "preds.csv")
    assert len(rows) == 9 and rows[0]["id"] == "benign/img0.png" and rows[0]["label"] == "benign"
    r = runner.invoke(app, ["evaluate", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    for row in json.loads((tmp_path / "run" / "evaluation.json").read_text()):
        assert row["accuracy"] == pytest.approx(
            row["recorded"]
        )  # each site scored through its own preprocessing
    card = export(tmp_path / "run", 0, tmp_path / "onnx", model="shared")
    assert card["privacy"]["differentially_private"] is True
    loaded = load_pipeline(tmp_path / "run", 0, "shared")
    x = np.random.default_rng(1).uniform(0, 1, (5, 1, 16, 16)).astype(np.float32)
    got = ort.InferenceSession(str(tmp_path / "onnx" / "model.onnx")).run(None, {"x": x})[0]
    with torch.no_grad():
        want = loaded.pipeline(torch.from_numpy(x)).numpy()
    assert np.abs(got - want).max() < 1e-5


@pytest.mark.slow
def test_a_combined_table_run_compares_with_going_alone_and_predicts_and_exports(tmp_path):
    """`--dataset table --site-data … --schema … --combine stack --vs-alone` runs through; the combined model
    (own private + DP proxy, fused on held-out rows) is reported, saved, predicted with and exported as
    non-private."""
    paths = [str(write_csv(tmp_path, site_frame(60, seed=k, shift=6 * k), f"h{k}.csv")) for k in range(2)]
    out = tmp_path / "run"
    r = runner.invoke(
        app,
        [
            "run",
            "--dataset",
            "table",
            "--site-data",
            ",".join(paths),
            "--schema",
            str(write_schema(tmp_path)),
            "--private-model",
            "tabmlp",
            "--proxy-model",
            "logreg",
            "--rounds",
            "2",
            "--delta",
            "1e-3",
            "--threads",
            "1",
            "--seed",
            "0",
            "--combine",
            "stack",
            "--vs-alone",
            "--quiet",
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "vs training alone" in text and "combined" in text.split("vs training alone")[1]
    s = json.loads((out / "summary.json").read_text())
    # going alone on tables: tuned per site on its validation rows (OUT/alone/alone.json), its Regular runs
    # retrained on all training rows in OUT/alone/final
    record = json.loads((out / "alone" / "alone.json").read_text())
    alone = json.loads(next((out / "alone" / "final").glob("lr*/summary.json")).read_text())
    assert alone["sites"] == s["sites"] and alone["dataset"] == "table"  # the same per-site sources
    assert [site["site"] for site in record["sites"]] == s["sites"]
    assert s["vs_alone"]["difference"]["combined_acc"] == pytest.approx(
        s["final"]["combined_acc"]["mean"] - s["vs_alone"]["alone_private_acc"]
    )
    # 48 training rows a site (60 less the internal test share), 10 of them held out for the combiner; no
    # sampling option given: the table recipe's q = 0.5 (defaults per kind of data, runner.recipe)
    assert s["accounting"][0]["sample_rate"] == pytest.approx(0.5)
    assert [a["n"] for a in s["accounting"]] == [38, 38]
    meta = json.loads((out / "models" / "client1_combined.json").read_text())
    assert (
        meta["parts"] == ["private", "proxy"]
        and meta["privacy"] == "non-private"
        and meta["held_out_rows"] == 10
    )
    res = predict(out, 1, paths[1], tmp_path / "p.csv", model="combined")
    loaded = load_pipeline(out, 1, "combined")
    raw, _, _ = Schema.load(str(tmp_path / "schema.yaml")).check(read_table(paths[1]), "")
    x = loaded.preprocessing.module()(torch.as_tensor(raw, dtype=torch.float32))
    with torch.no_grad():
        parts = [load_pipeline(out, 1, m).pipeline.model for m in ("private", "shared")]
        feats = torch.cat([torch.log_softmax(m(x), 1) for m in parts], 1)
    from safetensors.torch import load_file

    comb = load_file(str(out / "models" / "client1_combined.safetensors"))
    expect = (feats @ comb["weight"].T + comb["bias"]).argmax(1).numpy()
    got = [r["prediction"] for r in read_preds(tmp_path / "p.csv")]
    assert res["model"] == "client1_combined" and got == [loaded.preprocessing.classes[i] for i in expect]
    card = export(out, 1, tmp_path / "onnx", model="combined")
    assert card["privacy"]["differentially_private"] is False and card["privacy"]["label"] == "non-private"
    assert card["model"]["parts"] == ["private", "proxy"]
    assert card["evaluation"]["accuracy_external"] == s["final"]["per_client"][1]["combined_acc"]
    import onnxruntime as ort

    onnx_out = ort.InferenceSession(str(tmp_path / "onnx" / "model.onnx")).run(
        None, {"x": raw[:5].astype(np.float32)}
    )[0]
    assert np.allclose(
        onnx_out, loaded.pipeline(torch.as_tensor(raw[:5], dtype=torch.float32)).detach().numpy(), atol=1e-5
    )
    with pytest.raises(ConfigError, match="no combined model"):
        load_pipeline(out / "alone", 0, "combined")
