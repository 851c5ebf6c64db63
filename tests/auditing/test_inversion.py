"""Gradient inversion (silofl.auditing.inversion): SSIM and PSNR against scikit-image, the attack on a tiny
model's update of one digit with and without noise, and `silofl audit --attack inversion`."""

import json

import numpy as np
import pytest
import torch
from skimage.metrics import peak_signal_noise_ratio, structural_similarity
from torch import nn
from typer.testing import CliRunner

from silofl.auditing import AuditSettings, inversion, run_audit
from silofl.cli.main import app
from silofl.core.errors import ConfigError
from silofl.data.datasets import load_digits_dataset
from silofl.runner.config import RunConfig
from tests import readme


def reference_ssim(a, b, data_range):
    """scikit-image's SSIM with Wang et al.'s settings (Gaussian window σ 1.5 → 11 taps, population
    covariances)."""
    kw = dict(data_range=data_range, gaussian_weights=True, sigma=1.5, use_sample_covariance=False)
    if a.ndim == 3:
        kw["channel_axis"] = 0
    return structural_similarity(a, b, **kw)


@pytest.mark.parametrize("shape", [(16, 16), (28, 28), (3, 20, 24), (1, 16, 16)])
def test_ssim_and_psnr_equal_scikit_image(shape):
    rng = np.random.default_rng(sum(shape))
    for data_range, noise in ((1.0, 0.05), (1.0, 0.4), (4.0, 1.0)):
        a = rng.uniform(0, data_range, size=shape)
        b = np.clip(a + rng.normal(0, noise, size=shape), 0, data_range)
        ref_a, ref_b = (a[0], b[0]) if shape[0] == 1 else (a, b)  # skimage: one channel as a 2-D image
        assert inversion.ssim(a, b, data_range) == pytest.approx(
            reference_ssim(ref_a, ref_b, data_range), abs=1e-9
        )
        assert inversion.psnr(a, b, data_range) == pytest.approx(
            peak_signal_noise_ratio(a, b, data_range=data_range), abs=1e-9
        )
    assert inversion.ssim(a, a, data_range) == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="at least 11"):
        inversion.ssim(np.zeros((8, 8)), np.zeros((8, 8)), 1.0)


def test_match_pairs_every_image_with_its_reconstruction():
    digits = np.random.default_rng(0).uniform(0, 0.9, size=(4, 1, 16, 16))
    rec = digits[[2, 0, 3, 1]] + 0.01
    m = inversion.match(digits, rec, 1.0)
    assert m["order"] == [1, 3, 0, 2]
    assert min(m["ssim"]) > 0.99 and min(m["psnr"]) > 39
    assert inversion.match(digits, digits, 1.0)["psnr"] == [inversion.PSNR_CAP] * 4


def tiny_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(256, 32), nn.Sigmoid(), nn.Linear(32, 10))


def test_labels_from_the_output_bias():
    model = tiny_model()
    x, y = torch.rand(1, 1, 16, 16), torch.tensor([7])
    delta = inversion.local_update(model, inversion.params_of(model), x, y, lr=0.1, steps=1)
    labels, how = inversion.infer_labels(model, delta, 10, 1)
    assert labels.tolist() == y.tolist() and "iDLG" in how
    no_bias = nn.Sequential(nn.Flatten(), nn.Linear(256, 10, bias=False))
    d2 = inversion.local_update(no_bias, inversion.params_of(no_bias), x, y, lr=0.1, steps=1)
    labels, how = inversion.infer_labels(no_bias, d2, 10, 1)
    assert labels is None and "assumed known" in how


@pytest.mark.slow
def test_inversion_reconstructs_a_digit_and_noise_stops_it():
    """An unnoised, un-clipped one-step update of one 16×16 digit gives it back (SSIM far above random
    images'); with large noise the reconstruction falls to the random floor."""
    model = tiny_model()
    ds = load_digits_dataset()
    x, y = ds.x_train[3:4], ds.y_train[3:4]
    start = inversion.params_of(model)
    settings = inversion.InversionSettings(iterations=150, restarts=1, seed=1)
    common = dict(lr=0.1, steps=1, subclient_clip=None, box=(0.0, 1.0), settings=settings)
    clean = inversion.attack_update(model, start, x, y, noise_std=0.0, noise_seed=0, **common)
    floor = inversion.baseline(x.numpy(), 0.0, 1.0, seed=0)
    assert clean["labels_correct"] == 1
    assert clean["ssim"] > 0.8 and clean["ssim"] > floor["ssim"] + 0.6, (clean["ssim"], floor)
    assert clean["psnr"] > 20
    norm = clean["update_norm_before_clip"]
    noisy = inversion.attack_update(model, start, x, y, noise_std=10 * norm, noise_seed=2, **common)
    assert noisy["ssim"] < floor["ssim"] + 0.25, (noisy["ssim"], floor)
    assert noisy["ssim"] < clean["ssim"] - 0.5


CLIENT = dict(
    dataset="digits",
    method="dp-fedavg",
    clients=3,
    samples_per_client=120,
    batch_size=30,
    partition="iid",
    test_limit=200,
    rounds=2,
    delta=1e-5,
)


def test_inversion_is_refused_where_it_does_not_apply(tmp_path):
    inv = AuditSettings(canaries=10, attacks=("inversion",), seed=0)
    cfg = RunConfig.from_dict(dict(CLIENT, method="proxyfl"))
    with pytest.raises(ConfigError, match="client-level method.*proxyfl is example-level"):
        run_audit(cfg, inv, tmp_path / "a")
    cfg = RunConfig.from_dict(dict(CLIENT, dataset="bags"))
    with pytest.raises(ConfigError, match="reconstructs images; dataset 'bags'"):
        run_audit(cfg, inv, tmp_path / "b")
    with pytest.raises(ConfigError, match="after the run's last round"):
        run_audit(
            RunConfig.from_dict(CLIENT), AuditSettings(attacks=("inversion",), inversion_round=3), tmp_path
        )
    with pytest.raises(ConfigError, match="unknown audit attack 'dlg'; choose one of: inversion"):
        run_audit(RunConfig.from_dict(CLIENT), AuditSettings(attacks=("dlg",)), tmp_path / "c")
    with pytest.raises(ConfigError, match="--inversion-images must be at least 1"):
        run_audit(
            RunConfig.from_dict(CLIENT), AuditSettings(attacks=("inversion",), inversion_images=0), tmp_path
        )
    assert not any(tmp_path.iterdir())  # nothing written
    r = CliRunner().invoke(
        app,
        [
            "audit",
            "--method",
            "proxyfl",
            "--dataset",
            "digits",
            "--attack",
            "inversion",
            "--out",
            str(tmp_path / "d"),
        ],
    )
    assert r.exit_code == 2 and "client-level method" in r.output and "Traceback" not in r.output


@pytest.mark.slow
def test_the_documented_inversion_audit_as_written(tmp_path, monkeypatch):
    """docs/howto/audit.md's command: the clipped update gives the digit back to the server, σ = 1 leaves
    nothing; audit.json, audit.md, the printed line and inversion.png carry it."""
    (cmd,) = readme.commands(readme.INVERSION)
    args = readme.argv(cmd)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SILOFL_NO_PROGRESS", "1")
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "gradient inversion by the server" in " ".join(r.output.split())
    out = tmp_path / args[args.index("--out") + 1]
    a = json.loads((out / "audit.json").read_text())
    inv = a["inversion"]
    assert a["attacks_run"] == ["inversion"] and "inversion.png" in a["files"]
    assert (out / "inversion.png").stat().st_size > 1000
    assert inv["attacker"].startswith("the server") and "un-noised" in inv["server_sees"]
    assert inv["epsilon_accountant"] == a["epsilon_accountant"] and inv["noise_multiplier"] == 1.0
    assert inv["noise_std"] == pytest.approx(inv["update_noise_multiplier"] * inv["subclient_clip"])
    assert inv["without_noise"]["ssim"] > 0.9 and inv["without_noise"]["labels_correct"] == 1
    assert inv["with_noise"]["ssim"] < inv["random_baseline"]["ssim"] + 0.3  # σ = 1 leaves nothing
    md = (out / "audit.md").read_text()
    assert "Gradient inversion" in md and "random images (the floor)" in md
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2 and "already holds an audit" in r.output
