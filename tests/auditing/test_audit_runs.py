"""Whole audits on scikit-learn's digits: no DP leaks measurably, very large σ does not, and a DP run's
empirical lower bound never exceeds its accountant's ε (a bound above it would mean a bug on one side)."""

import json

import pytest
import yaml
from typer.testing import CliRunner

from silofl.auditing import AuditSettings, run_audit
from silofl.auditing.report import FILES
from silofl.cli.main import app
from silofl.runner.config import RunConfig

DIGITS = dict(
    dataset="digits",
    clients=3,
    samples_per_client=150,
    batch_size=30,
    delta=1e-5,
    partition="iid",
    test_limit=200,
)
EXAMPLE = dict(
    DIGITS, method="proxyfl", private_model="cnn1", proxy_model="mlp", rounds=40, lr=0.01, eval_every=40
)
CLIENT = dict(DIGITS, method="dp-fedavg", proxy_model="mlp", rounds=10, eval_every=10, samples_per_client=120)


def audit(tmp_path, name, canaries=200, refs=2, seed=3, **kw):
    settings = {k: kw.pop(k) for k in ("pubsub_model", "epsilon") if k in kw}
    cfg = RunConfig.from_dict(kw)
    return run_audit(
        cfg, AuditSettings(canaries=canaries, seed=seed, reference_models=refs, **settings), tmp_path / name
    )


@pytest.mark.slow
def test_example_level_without_dp_leaks_measurably(tmp_path):
    a = audit(tmp_path, "off", **dict(EXAMPLE, privacy="off"))
    assert a["epsilon_accountant"] is None
    assert a["epsilon_lower_bound"] > 0.3, a["bound"]
    assert a["bound"]["canary_auc"]["final"] > 0.6
    assert a["canaries"]["releases_scored"] == 40  # every round's proxy left the site and was scored
    assert a["threat_model"].startswith("black-box per release")
    assert a["epsilon_lower_bound"] <= a["bound"]["max_auditable_epsilon"] <= a["certifiable_epsilon_max"]
    private = a["membership_inference"]["targets"]["private"]["attacks"]
    assert max(f["auc"] for f in private.values()) > 0.55  # the attack beats chance
    assert private["loss"]["members"] == 150 and private["loss"]["nonmembers"] == 150
    assert "note" in private["loss"]  # fewer than 1000 non-members: TPR at 0.1% FPR is flagged
    for f in FILES:
        assert (tmp_path / "off" / f).is_file()
    assert (tmp_path / "off" / "run" / "summary.json").is_file()
    split = json.loads((tmp_path / "off" / "split.json").read_text())
    assert len(split["members"]) == 150 and not set(split["members"]) & set(split["nonmembers"])


@pytest.mark.slow
@pytest.mark.parametrize("method", ["proxyfl", "fedavg"])
def test_example_level_dp(tmp_path, method):
    kw = dict(EXAMPLE, method=method, rounds=20, eval_every=20)
    if method == "fedavg":
        del kw["private_model"]
    big = audit(tmp_path, "big", **dict(kw, noise_multiplier=50.0))
    assert big["epsilon_lower_bound"] < 0.2 and big["epsilon_lower_bound"] <= big["epsilon_accountant"]
    dp = audit(tmp_path, "dp", **dict(kw, noise_multiplier=0.8))
    assert dp["formal_guarantee"] and dp["epsilon_accountant"] > 0
    assert dp["epsilon_lower_bound"] <= dp["epsilon_accountant"]


@pytest.mark.slow
def test_unseeded_audit_draws_secret_randomness(tmp_path):
    """Without a seed an audit runs the mechanism a deployment runs: noise and sampling from the secure
    source, canaries and coins from fresh secret seeds (two audits draw different coins), no seed written
    anywhere; a seeded audit is labelled as a research run while its mechanism's guarantee stays formal."""
    kw = dict(EXAMPLE, rounds=3, eval_every=3, noise_multiplier=1.0)
    a = audit(tmp_path, "a", refs=1, seed=None, **kw)
    b = audit(tmp_path, "b", refs=1, seed=None, **kw)
    for name, x in (("a", a), ("b", b)):
        assert x["seed"] is None and not x["seeded"] and "secret randomness" in x["research_note"]
        assert x["formal_guarantee"] and "seeded" not in x["guarantee_note"]
        assert 0 <= x["epsilon_lower_bound"] <= x["epsilon_accountant"]
        summary = json.loads((tmp_path / name / "run" / "summary.json").read_text())
        assert summary["randomness"]["seeded"] is False and "seed" not in summary["randomness"]
        config = yaml.safe_load((tmp_path / name / "run" / "config.yaml").read_text())
        assert config["seed"] is None
    assert set(a["accuracy"]) == {
        "private_acc",
        "proxy_acc",
    }  # in-process: the private figure, labelled, as in a run
    coins = [json.loads((tmp_path / n / "split.json").read_text())["included"] for n in ("a", "b")]
    assert coins[0] != coins[1]  # 200 fresh coins each: equal with probability 2^-200
    s = audit(tmp_path, "s", refs=1, seed=5, **kw)
    assert s["seeded"] and s["seed"] == 5 and "seeded research run" in s["research_note"]
    assert s["formal_guarantee"] and "seeded research run" in s["guarantee_note"]


@pytest.mark.slow
def test_client_level_canary_clients(tmp_path):
    off = audit(tmp_path, "off", **dict(CLIENT, privacy="off"))
    assert off["epsilon_lower_bound"] > 1.0, off["bound"]  # an un-noised sum shows every canary client
    big = audit(tmp_path, "big", **dict(CLIENT, noise_multiplier=50.0))
    assert big["epsilon_lower_bound"] < 0.2
    dp = audit(tmp_path, "dp", **dict(CLIENT, noise_multiplier=2.0, intermediaries="adaptive"))
    assert 0 < dp["epsilon_lower_bound"] <= dp["epsilon_accountant"], (dp["bound"], dp["epsilon_accountant"])
    run = json.loads((tmp_path / "dp" / "run" / "summary.json").read_text())
    assert run["sites_trained"] == 3 + dp["canaries"]["included"]  # canary clients joined as hospitals


@pytest.mark.slow
def test_published_models(tmp_path):
    base = dict(dataset="digits", samples_per_client=400)
    off = audit(tmp_path, "off", **dict(base, privacy="off"), pubsub_model="dp-nn")
    assert off["epsilon_lower_bound"] > 0.3 and off["epsilon_accountant"] is None
    dp = audit(tmp_path, "nn", **base, pubsub_model="dp-nn", epsilon=2.0)
    assert dp["epsilon_lower_bound"] <= dp["epsilon_accountant"] <= 2.0 + 1e-6
    lr = audit(tmp_path, "lr", **base, pubsub_model="dp-logreg", epsilon=1.0)
    assert lr["delta"] == 0.0 and lr["epsilon_lower_bound"] <= 1.0


@pytest.mark.slow
def test_cli_audit(tmp_path):
    runner = CliRunner()
    args = [
        "audit",
        "--pubsub-model",
        "dp-logreg",
        "--epsilon",
        "1",
        "--dataset",
        "digits",
        "--samples-per-client",
        "300",
        "--canaries",
        "100",
        "--reference-models",
        "1",
        "--seed",
        "2",
        "--quiet",
        "--out",
        str(tmp_path / "a"),
    ]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "empirical ε lower bound" in r.output and "accountant ε 1.000" in r.output
    a = json.loads((tmp_path / "a" / "audit.json").read_text())
    assert a["seed"] == 2 and "seeded research run" in a["research_note"]
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and "already holds an audit" in r.output


def test_cli_audit_errors_are_one_line(tmp_path):
    runner = CliRunner()
    r = runner.invoke(
        app,
        [
            "audit",
            "--pubsub-model",
            "dp-linreg",
            "--epsilon",
            "1",
            "--dataset",
            "digits",
            "--out",
            str(tmp_path / "x"),
        ],
    )
    assert r.exit_code == 2 and "must be a classifier" in r.output
    r = runner.invoke(app, ["audit", "--canaries", "1", "--dataset", "digits", "--out", str(tmp_path / "y")])
    assert r.exit_code == 2 and "--canaries must be at least 2" in r.output
    r = runner.invoke(
        app,
        [
            "audit",
            "--method",
            "proxyfl",
            "--dataset",
            "digits",
            "--clients",
            "3",
            "--audited-site",
            "5",
            "--out",
            str(tmp_path / "z"),
        ],
    )
    assert r.exit_code == 2 and "not one of the 3 clients" in r.output
    r = runner.invoke(
        app,
        [
            "audit",
            "--canary-kind",
            "dirac",
            "--pubsub-model",
            "dp-nb",
            "--epsilon",
            "1",
            "--dataset",
            "digits",
            "--out",
            str(tmp_path / "w"),
        ],
    )
    assert r.exit_code == 2 and "not a published dp-nb" in r.output and "Traceback" not in r.output
    r = runner.invoke(
        app, ["audit", "--canary-kind", "diract", "--dataset", "digits", "--out", str(tmp_path / "v")]
    )
    assert r.exit_code == 2 and "dirac, random" in r.output
    r = runner.invoke(
        app,
        [
            "audit",
            "--canary-kind",
            "dirac",
            "--canary-placement",
            "loud",
            "--dataset",
            "digits",
            "--out",
            str(tmp_path / "u"),
        ],
    )
    assert r.exit_code == 2 and "quiet, random" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "w").exists() and not (tmp_path / "v").exists() and not (tmp_path / "u").exists()
