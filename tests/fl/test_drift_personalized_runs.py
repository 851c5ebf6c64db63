"""FedProx, FedAdam/FedYogi, Ditto, MR-MTL, FedPer and SCAFFOLD end to end on digits: they learn (above
chance) and every ε they report
is the accountant's for the DP-SGD steps that ran (the same as FedAvg's: the extra terms are
post-processing)."""

import json

import pytest

from silofl.privacy import epsilon_of
from silofl.runner.config import RunConfig
from silofl.runner.loop import run as simulate

pytestmark = pytest.mark.slow

BASE = dict(
    dataset="digits",
    clients=3,
    rounds=3,
    samples_per_client=300,
    partition="p_major",
    p_major=0.3,
    batch_size=60,
    noise_multiplier=0.8,
    lr=0.02,
    delta=1e-3,
    proxy_model="mlp",
    test_limit=300,
    seed=0,
    threads=1,
)


@pytest.mark.parametrize(
    "method", ["fedprox", "fedavg-adam", "fedavg-yogi", "ditto", "mr-mtl", "fedper", "scaffold"]
)
def test_the_method_learns_on_digits_and_reports_the_accountants_epsilon(method, tmp_path):
    out = tmp_path / method
    s = simulate(RunConfig.from_dict({**BASE, "method": method, "out": str(out)}), progress=False)
    head = s["headline"]
    assert s["final"][head]["mean"] > 0.15, s["final"]  # 10 classes: chance is 0.1
    steps = 3 * (300 // 60)
    expect = epsilon_of("rdp", ((0.8, 60 / 300, steps),), 1e-3)
    for a in s["accounting"]:
        assert a["steps"] == steps and a["sample_rate"] == pytest.approx(0.2) and a["noise_multiplier"] == 0.8
        assert a["epsilon"] == pytest.approx(expect)
    last = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][-3:]
    assert [r["epsilon"] for r in last] == pytest.approx([expect] * 3)
    if method == "ditto":  # the personal models are saved at the sites, next to the DP global model
        assert s["final"]["global_acc"]["mean"] > 0.15
        assert all(
            (out / "models" / f"client{k}_{role}.safetensors").is_file()
            for k in range(3)
            for role in ("private", "global")
        )


def test_the_cli_flags_set_the_methods_options(tmp_path):
    import yaml
    from typer.testing import CliRunner

    from silofl.cli.main import app

    tiny = [
        "--dataset",
        "digits",
        "--clients",
        "2",
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
        "--quiet",
    ]
    for method, flag, key in (
        ("fedprox", "--mu", "mu"),
        ("ditto", "--ditto-lambda", "ditto_lambda"),
        ("mr-mtl", "--mrmtl-lambda", "mrmtl_lambda"),
    ):
        out = tmp_path / method
        r = CliRunner().invoke(app, ["run", "--method", method, flag, "0.25", *tiny, "--out", str(out)])
        assert r.exit_code == 0, r.output
        assert yaml.safe_load((out / "config.yaml").read_text())[method][key] == 0.25


@pytest.mark.parametrize("method", ["scaffold", "ditto", "mr-mtl", "fedavg-yogi"])
def test_a_resumed_run_continues_exactly_where_it_stopped(method, tmp_path):
    """The state these methods add (control variates, the personal model and its batches, the mean to pull
    towards, the server's Yogi moments) is checkpointed: 2 rounds + resume to 3 = 3 rounds straight."""
    cfg = RunConfig.from_dict(
        {
            **BASE,
            "method": method,
            "clients": 2,
            "samples_per_client": 120,
            "checkpoint_every": 1,
            "out": str(tmp_path / "resumed"),
            "rounds": 2,
        }
    )
    simulate(cfg, progress=False)
    resumed = simulate(cfg.replace(rounds=3), progress=False, resume=True)
    straight = simulate(cfg.replace(rounds=3, out=str(tmp_path / "straight")), progress=False)
    assert resumed["final"]["per_client"] == straight["final"]["per_client"]
    assert resumed["accounting"] == straight["accounting"]
