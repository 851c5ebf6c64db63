"""predict, evaluate and export apply the run's feature stage; a backbone trained on declared-public rows."""

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from silofl.cli.main import app
from silofl.core.errors import ConfigError
from silofl.inference import load_pipeline
from silofl.inference.export import export
from tests.data.test_formats import _write_images

runner = CliRunner()


@pytest.mark.slow
def test_scatter_sites_predict_evaluate_and_two_stage_export(tmp_path):
    import onnxruntime as ort

    _write_images(tmp_path / "a", n=8)
    _write_images(tmp_path / "b", n=8)
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
            "--features",
            "scatter",
            "--proxy-model",
            "linear",
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
    loaded = load_pipeline(tmp_path / "run", 0, "shared")
    assert loaded.features is not None and tuple(loaded.spec.input_shape) == (81, 4, 4)
    r = runner.invoke(
        app,
        [
            "predict",
            str(tmp_path / "run"),
            "--client",
            "0",
            "--model",
            "shared",
            "--data",
            str(tmp_path / "new"),
            "--out",
            str(tmp_path / "preds.csv"),
        ],
    )
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["evaluate", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    for row in json.loads((tmp_path / "run" / "evaluation.json").read_text()):
        assert row["accuracy"] == pytest.approx(row["recorded"])  # scored on the same features as in the run
    card = export(tmp_path / "run", 0, tmp_path / "onnx", model="shared")
    assert card["features"]["graph"] == "two-stage" and "no budget" in card["features"]["privacy"]
    assert "ScatterNet" in (tmp_path / "onnx" / "model_card.md").read_text()
    # the second stage (ONNX) on silofl's features equals the PyTorch pipeline on the raw images
    from silofl.features import stage_from_record

    stage = stage_from_record(json.loads((tmp_path / "onnx" / "features.json").read_text()))
    x = torch.from_numpy(np.random.default_rng(1).uniform(0, 1, (5, 1, 16, 16)).astype(np.float32))
    f = stage.transform(loaded.pipeline.preprocess(x))
    got = ort.InferenceSession(str(tmp_path / "onnx" / "model.onnx")).run(None, {"features": f.numpy()})[0]
    with torch.no_grad():
        want = loaded.pipeline(x).numpy()
    assert np.abs(got - want).max() < 1e-5


@pytest.mark.slow
def test_backbone_trained_on_declared_public_rows(tmp_path):
    bb = tmp_path / "bb"
    split = ["--clients", "3", "--samples-per-client", "100", "--split-seed", "5", "--validation-size", "300"]
    r = runner.invoke(
        app,
        [
            "backbone",
            "train",
            "--dataset",
            "digits",
            "--public",
            "validation",
            *split,
            "--model",
            "mlp",
            "--epochs",
            "2",
            "--threads",
            "1",
            "--out",
            str(bb),
        ],
    )
    assert r.exit_code == 0, r.output
    card = json.loads((bb / "card.json").read_text())
    assert card["public_data"]["declared_public"] and card["public_data"]["kind"] == "validation"
    assert card["public_data"]["rows"] == 300 and card["feature_shape"] == [200]
    base = [
        "run",
        "--method",
        "fedavg",
        "--dataset",
        "digits",
        "--rounds",
        "1",
        "--batch-size",
        "25",
        "--delta",
        "1e-3",
        "--test-limit",
        "100",
        "--proxy-model",
        "linear",
        "--features",
        f"backbone:{bb}",
        "--threads",
        "1",
        "--quiet",
    ]
    run_split = [
        "--clients",
        "3",
        "--samples-per-client",
        "100",
        "--set",
        "split_seed=5",
        "--set",
        "validation_size=300",
    ]
    r = runner.invoke(app, [*base, *run_split, "--out", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (
        s["features"]["feature_shape"] == [200]
        and s["features"]["features"]["public_data"]["kind"] == "validation"
    )
    # another split may hand the backbone's rows to a client: refused, nothing written
    other = [a if a != "split_seed=5" else "split_seed=6" for a in run_split]
    r = runner.invoke(app, [*base, *other, "--out", str(tmp_path / "run2")])
    assert r.exit_code == 2 and "trained on the validation rows of another split" in " ".join(
        r.output.split()
    )
    assert not (tmp_path / "run2").exists()
    # --public validation without the split seed, and a non-empty --out: refused
    r = runner.invoke(
        app,
        [
            "backbone",
            "train",
            "--dataset",
            "digits",
            "--public",
            "validation",
            "--out",
            str(tmp_path / "bb2"),
        ],
    )
    assert r.exit_code == 2 and "needs --split-seed" in r.output and not (tmp_path / "bb2").exists()
    with pytest.raises(ConfigError, match="not empty"):
        from silofl.experiments.backbone import train_backbone

        train_backbone("digits", "validation", bb, split={"split_seed": 5})
