"""Noise and sampling are secret by default (finding 1: with the default seed 0, written to config.yaml and
shared by every process, anyone reproduced a client's round-1 proxy bit for bit and decided membership with
certainty; a published dp-logreg's hash told whether a row was in the data)."""

import json

import numpy as np
import pytest
import torch
import yaml
from scipy import stats

from silofl.core.randomness import SecureRandom
from silofl.privacy.sampling import poisson_batch
from tests.helpers import build_run


def test_the_secure_generator_is_uniform_and_gaussian_against_scipy():
    rng = SecureRandom()
    assert stats.kstest(rng.uniform(200_000).numpy(), "uniform").pvalue > 1e-4
    z = rng.normal(200_000).numpy()
    assert stats.kstest(z, "norm").pvalue > 1e-4
    assert not torch.equal(
        SecureRandom().uniform(8), SecureRandom().uniform(8)
    )  # no two parties share a stream
    sizes = [len(poisson_batch(1000, 0.25, rng)) for _ in range(300)]
    assert np.mean(sizes) == pytest.approx(250, rel=0.02) and np.std(sizes) == pytest.approx(13.7, rel=0.2)


def test_without_a_seed_every_sites_noise_and_sampling_are_secure_and_a_round_cannot_be_replayed(tiny_cfg):
    a, b = build_run(tiny_cfg), build_run(tiny_cfg)
    for site in a.sites:
        assert isinstance(site.sampler, SecureRandom) and site.dp.noise.secure
    a.coordinator.run_round(1)
    b.coordinator.run_round(1)
    pa, pb = a.sites[1].shared.state_dict(), b.sites[1].shared.state_dict()
    assert not torch.equal(pa["out.weight"], pb["out.weight"])  # the same config does not reproduce a proxy


@pytest.mark.slow  # whole runs (fast tier ≤ 60 s)
def test_a_seeded_run_reproduces_and_says_its_guarantee_holds_only_while_the_seed_is_secret(
    tiny_cfg, tmp_path
):
    from silofl.runner.loop import run

    s = run(tiny_cfg.replace(seed=7, rounds=1, out=str(tmp_path / "s")), progress=False)
    assert (
        s["randomness"]["seeded"]
        and not s["privacy"]["formal_guarantee"]
        and s["privacy"]["formal_if_seed_secret"]
    )
    assert "only while the seed stays secret" in s["privacy"]["note"]
    u = run(tiny_cfg.replace(rounds=1, out=str(tmp_path / "u")), progress=False)
    assert (
        u["randomness"] == {"seeded": False, "source": u["randomness"]["source"]}
        and "AES" in u["randomness"]["source"]
    )
    assert u["privacy"]["formal_guarantee"]
    cfg = yaml.safe_load((tmp_path / "u/config.yaml").read_text())
    plan = json.loads((tmp_path / "u/plan.json").read_text())
    assert cfg["seed"] is None and isinstance(
        plan["split_seed"], int
    )  # the split is public; no secret is written
    assert "seed" not in json.dumps(u["accounting"])


def test_the_cli_labels_a_seeded_run(tmp_path):
    from typer.testing import CliRunner

    from silofl.cli.main import app

    r = CliRunner().invoke(
        app,
        [
            "run",
            "--dataset",
            "digits",
            "--clients",
            "3",
            "--rounds",
            "1",
            "--samples-per-client",
            "100",
            "--batch-size",
            "25",
            "--delta",
            "1e-3",
            "--test-limit",
            "100",
            "--seed",
            "3",
            "--quiet",
            "--out",
            str(tmp_path / "x"),
        ],
    )
    text = " ".join(r.output.split())
    assert (
        r.exit_code == 0
        and "seeded research run" in text
        and "holds only while the seed stays secret" in text
    )


@pytest.mark.slow  # whole runs (fast tier ≤ 60 s)
def test_a_published_dp_model_without_a_seed_does_not_fingerprint_its_data():
    from sklearn.datasets import load_breast_cancer

    from silofl.pubsub.dp_models import Bounds, train

    d = load_breast_cancer()
    x, y = d.data[:200], d.target[:200]
    kw = dict(
        publisher="a",
        features=[f"f{i}" for i in range(30)],
        task="classification",
        bounds=Bounds(d.data.min(0), d.data.max(0)),
        epsilon=1.0,
        delta=1e-5,
        classes=["0", "1"],
    )
    m1, m2 = train("dp-logreg", x, y, **kw), train("dp-logreg", x, y, **kw)
    assert not torch.equal(m1.tensors["coef"], m2.tensors["coef"])  # no two trainings on the same rows agree
    s1, s2 = train("dp-logreg", x, y, seed=0, **kw), train("dp-logreg", x, y, seed=0, **kw)
    assert torch.equal(s1.tensors["coef"], s2.tensors["coef"])  # a research seed still reproduces
    n1, n2 = (train("dp-nn", x, y, epochs=1, **kw) for _ in range(2))
    assert n1.mechanism["noise_multiplier"] == n2.mechanism["noise_multiplier"]
    assert not torch.equal(n1.tensors["out.weight"], n2.tensors["out.weight"])
