"""FedBN, FedRep and APFL end to end on digits: they learn (above chance), every ε they report is the
accountant's for the DP-SGD steps that ran (FedAvg's count: FedRep's head steps are among them, APFL's
local steps are not), APFL's mixture is saved as one loadable model, and a resumed APFL run equals a
straight one."""

import json

import pytest
import torch

from silofl.inference.pipeline import load_combined
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
    lr=0.05,
    delta=1e-3,
    proxy_model="mlp",
    test_limit=300,
    seed=0,
    threads=1,
)
OWN = {"fedbn": {"proxy_model": "cnn-gn", "lr": 0.02}, "fedrep": {"rounds": 4}, "apfl": {}}


@pytest.mark.parametrize("method", ["fedbn", "fedrep", "apfl"])
def test_the_method_learns_on_digits_and_reports_the_accountants_epsilon(method, tmp_path):
    out = tmp_path / method
    cfg = RunConfig.from_dict({**BASE, **OWN[method], "method": method, "out": str(out)})
    s = simulate(cfg, progress=False)
    head = s["headline"]
    assert s["final"][head]["mean"] > 0.15, s["final"]  # 10 classes: chance is 0.1
    steps = cfg.rounds * (300 // 60)
    expect = epsilon_of("rdp", ((0.8, 60 / 300, steps),), 1e-3)
    for a in s["accounting"]:
        assert a["steps"] == steps and a["sample_rate"] == pytest.approx(0.2) and a["noise_multiplier"] == 0.8
        assert a["epsilon"] == pytest.approx(expect)
    last = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][-3:]
    assert [r["epsilon"] for r in last] == pytest.approx([expect] * 3)
    if method == "apfl":  # judged by the mixture; α reported; the mixture saved as one model per site
        assert head == "combined_acc" and {"private_acc", "global_acc"} <= set(s["final"])
        assert all(0.0 <= r["apfl_alpha"] <= 1.0 for r in last)
        for k in range(3):
            model, spec = load_combined(out / "models", k)
            meta = json.loads((out / "models" / f"client{k}_combined.json").read_text())
            w = model.combiner.weight.detach()
            torch.testing.assert_close(w[:, :10], meta["alpha"] * torch.eye(10))
            torch.testing.assert_close(w[:, 10:], (1 - meta["alpha"]) * torch.eye(10))
        # `silofl evaluate` reloads the saved mixture and finds the accuracy the run recorded
        from silofl.experiments.evaluate import evaluate_run

        got = {r["model"]: r for r in evaluate_run(out)}
        for k in range(3):
            r = got[f"client{k}_combined"]
            assert r["recorded"] is not None and r["accuracy"] == pytest.approx(r["recorded"])


def test_a_resumed_apfl_run_continues_exactly_where_it_stopped(tmp_path):
    """α, the local model and its batches are checkpointed: 2 rounds + resume to 3 = 3 rounds straight."""
    cfg = RunConfig.from_dict(
        {
            **BASE,
            "method": "apfl",
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


def test_compare_runs_them_side_by_side_and_refuses_fedbn_without_norm_layers_before_running(tmp_path):
    from typer.testing import CliRunner

    from silofl.cli.main import app

    tiny = ["--dataset", "digits", "--seeds", "0", "--rounds", "1", "--clients", "2"]
    tiny += [
        "--samples-per-client",
        "100",
        "--batch-size",
        "25",
        "--set",
        "delta=0.001",
        "--test-limit",
        "100",
    ]
    out = tmp_path / "rep"
    r = CliRunner().invoke(
        app, ["compare", "--methods", "fedbn,fedrep,apfl", *tiny, "--out", str(out), "--quiet"]
    )
    assert r.exit_code == 0, r.output
    rows = {row["method"]: row for row in json.loads((out / "results.json").read_text())["rows"]}
    assert {m: rows[m]["headline"] for m in rows} == {
        "fedbn": "private_acc",
        "fedrep": "private_acc",
        "apfl": "combined_acc",
    }
    bad = tmp_path / "bad"
    r = CliRunner().invoke(
        app,
        ["compare", "--methods", "fedavg,fedbn", "--proxy-model", "mlp", *tiny, "--out", str(bad), "--quiet"],
    )
    assert r.exit_code == 2 and "'mlp' has none: use --proxy-model cnn-gn" in r.output, r.output
    assert not (bad / "runs").exists()
