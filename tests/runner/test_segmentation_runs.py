"""Segmentation runs end to end on generated sites with known masks (silofl.data.segmentation): example-level
DP-SGD (FedAvg), client-level DP with intermediaries (DP-FedAvg), ProxyFL's per-pixel distillation, and the
CLI's refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from silofl.cli.main import app
from silofl.data.segmentation import generate_sites, read_site


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    return generate_sites(tmp_path_factory.mktemp("seg") / "sites", sites=3, per_site=40, size=32, seed=0)


def _run(args: list[str]) -> dict:
    res = CliRunner().invoke(app, ["run", *args])
    assert res.exit_code == 0, (res.output[-3000:], res.exception)
    out = args[args.index("--out") + 1]
    return json.loads((__import__("pathlib").Path(out) / "summary.json").read_text())


def _all_background_dice(paths: list[str]) -> float:
    """The Dice of predicting no foreground anywhere: 1 on the images with an empty mask, else 0."""
    return float(np.mean([(read_site(p)[1].reshape(40, -1).sum(1) == 0).mean() for p in paths]))


def _common(sites, out) -> list[str]:
    return [
        "--dataset",
        "segmentation",
        "--site-data",
        ",".join(sites),
        "--proxy-model",
        "unet",
        "--batch-size",
        "8",
        "--metric",
        "dice",
        "--seed",
        "0",
        "--threads",
        "1",  # one thread: the suite's 2 threads spin-wait badly on a busy machine (PERF_NOTES)
        "--out",
        str(out),
    ]


@pytest.mark.slow  # ~15 s: FedAvg with DP-SGD (3 rounds) and DP-FedAvg with 2 intermediaries (5 rounds)
def test_dp_fedavg_and_client_level_dp_with_intermediaries_segment(sites, tmp_path):
    trivial = _all_background_dice(sites)
    assert trivial < 0.2
    s = _run(
        ["--method", "fedavg", "--rounds", "3", "--lr", "0.01", "--target-epsilon", "8"]
        + _common(sites, tmp_path / "a")
    )
    assert s["headline"] == "global_dice" and s["metric"] == "dice"
    assert s["metrics"]["computed"] == ["accuracy", "dice", "iou"]
    assert s["final"]["global_dice"]["mean"] > trivial + 0.4, s["final"]["global_dice"]
    assert 0 < s["final"]["global_iou"]["mean"] < s["final"]["global_dice"]["mean"]
    assert all(a["epsilon"] is not None and 0 < a["epsilon"] <= 8.0 + 1e-6 for a in s["accounting"])
    assert s["accounting"][0]["dp_backend"] == "ghost"  # the UNet takes the per-layer norm path
    recs = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert all({"global_acc", "global_dice", "global_iou", "global_dice_internal"} <= set(r) for r in recs)
    assert not any("global_auroc" in r for r in recs)  # classification metrics are not computed on masks

    c = _run(
        [
            "--method",
            "dp-fedavg",
            "--rounds",
            "5",
            "--noise-multiplier",
            "0.3",
            "--intermediaries",
            "2",
            "--local-lr",
            "0.3",
        ]
        + _common(sites, tmp_path / "b")
    )
    assert c["final"]["global_dice"]["mean"] > trivial + 0.4, c["final"]["global_dice"]
    assert c["privacy"]["unit"] and c["final"]["epsilon"]["mean"] is not None


@pytest.mark.slow  # ~8 s: 2 rounds, private and proxy UNets learning from each other per pixel
def test_proxyfl_distils_per_pixel(sites, tmp_path):
    s = _run(
        [
            "--method",
            "proxyfl",
            "--private-model",
            "unet",
            "--rounds",
            "2",
            "--lr",
            "0.01",
            "--privacy",
            "off",
        ]
        + _common(sites, tmp_path / "p")
    )
    assert s["headline"] == "private_dice"
    for role in ("private", "proxy"):
        for m in ("acc", "dice", "iou"):
            assert 0.0 <= s["final"][f"{role}_{m}"]["mean"] <= 1.0
    assert s["final"]["private_dice"]["mean"] > _all_background_dice(sites) + 0.2
    # predict writes one mask per input image, scored against the site's masks; export describes the output
    from PIL import Image

    res = CliRunner().invoke(
        app,
        ["predict", str(tmp_path / "p"), "--client", "0", "--model", "shared"]
        + ["--data", sites[1], "--out", str(tmp_path / "masks")],
    )
    assert res.exit_code == 0, (res.output, res.exception)
    assert "Dice" in res.output
    written = sorted((tmp_path / "masks").iterdir())
    assert len(written) == 40 and written[0].name == "0000.png"
    m = np.asarray(Image.open(written[0]))
    assert m.shape == (32, 32) and set(np.unique(m).tolist()) <= {0, 255}
    res = CliRunner().invoke(
        app, ["export", str(tmp_path / "p"), "--client", "0", "--out", str(tmp_path / "x")]
    )
    assert res.exit_code == 0, (res.output, res.exception)
    card = json.loads((tmp_path / "x" / "model_card.json").read_text())
    assert card["model"]["onnx"]["output"].startswith("per-pixel probabilities")


@pytest.mark.slow  # ~2 s: each refusal is one in-process CLI call
def test_cli_refusals_exit_2_and_write_nothing(sites, tmp_path):
    bad = tmp_path / "bad"
    (bad / "images").mkdir(parents=True)
    (bad / "masks").mkdir()
    np.save(bad / "images" / "a.npy", np.zeros((32, 32), np.uint8))
    np.save(bad / "masks" / "a.npy", np.full((32, 32), 200, np.uint8))  # labels stop at 63
    cases = [
        (["--method", "fedavg", "--metric", "auroc"], "--metric auroc scores classification runs"),
        (["--method", "fedavg", "--site-data", f"{sites[0]},{sites[1]},{bad}"], "the mask is not binary"),
    ]
    for extra, message in cases:
        args = _common(sites, tmp_path / "out") + extra
        res = CliRunner().invoke(app, ["run", *args])
        assert res.exit_code == 2, (res.output[-2000:], res.exception)
        assert message in res.stderr and "Traceback" not in res.output
        assert not (tmp_path / "out").exists()
    res = CliRunner().invoke(
        app, ["run", "--dataset", "digits", "--metric", "dice", "--out", str(tmp_path / "out2")]
    )
    assert res.exit_code == 2 and "dataset 'digits' is a classification task" in res.stderr


@pytest.mark.slow  # ~5 s: Regular without DP on 3-class label masks, 3 rounds, then predict
def test_label_masks_train_a_multiclass_unet_and_predict_writes_label_masks(tmp_path):
    from PIL import Image

    sites = generate_sites(tmp_path / "sites", sites=2, per_site=24, size=32, seed=1, classes=3)
    out = tmp_path / "mc"
    args = _common(sites, out)
    args[args.index("--proxy-model")] = "--private-model"
    args[args.index("--batch-size") + 1] = "4"
    s = _run(
        args
        + ["--method", "regular", "--rounds", "20", "--eval-every", "20", "--lr", "0.03", "--privacy", "off"]
    )
    spec = json.loads((out / "models" / "client0_private.json").read_text())
    assert spec["num_classes"] == 3  # background and two labels: a 3-channel softmax head
    assert 0.0 <= s["final"]["private_dice"]["mean"] <= 1.0 and s["metric"] == "dice"
    res = CliRunner().invoke(
        app,
        ["predict", str(out), "--client", "0", "--data", sites[0], "--out", str(tmp_path / "masks")],
    )
    assert res.exit_code == 0, (res.output, res.exception)
    values = set()
    for f in sorted((tmp_path / "masks").iterdir()):
        values |= set(np.unique(np.asarray(Image.open(f))).tolist())
    assert values <= {0, 1, 2} and len(values) >= 2  # label values, not 0/255
