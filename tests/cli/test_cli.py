"""The CLI end to end on digits, and clear one-line errors (exit code 2, no traceback) on bad input."""

import json

import pytest
import yaml
from typer.testing import CliRunner

from silofl.cli.main import app

runner = CliRunner()
TINY = [
    "--dataset",
    "digits",
    "--clients",
    "3",
    "--rounds",
    "2",
    "--samples-per-client",
    "100",
    "--batch-size",
    "25",
    "--delta",
    "1e-3",
    "--test-limit",
    "150",
    "--quiet",
]


@pytest.mark.slow
def test_run_then_evaluate(tmp_path):
    out = tmp_path / "run"
    r = runner.invoke(
        app,
        ["run", "--method", "proxyfl", *TINY, "--private-model", "cnn1", "--seed", "3", "--out", str(out)],
    )
    assert r.exit_code == 0, r.output
    assert "mean±std" in r.output and "strict" in r.output
    s = json.loads((out / "summary.json").read_text())
    assert s["rounds_run"] == 2 and len(s["final"]["per_client"]) == 3
    r = runner.invoke(app, ["evaluate", str(out)])
    assert r.exit_code == 0, r.output
    ev = json.loads((out / "evaluation.json").read_text())
    assert len(ev) == 6
    for row in ev:
        assert row["accuracy"] == pytest.approx(row["recorded"])


def test_config_file_and_flag_override(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "dataset: digits\nclients: 2\nrounds: 5\nsamples_per_client: 100\nbatch_size: 25\ndelta: 0.001\n"
        "test_limit: 100\nprivate_model: mlp\n"
    )
    r = runner.invoke(
        app, ["run", "--config", str(cfg), "--rounds", "1", "--quiet", "--out", str(tmp_path / "o")]
    )
    assert r.exit_code == 0, r.output
    assert "rounds: 1" in (tmp_path / "o" / "config.yaml").read_text()


@pytest.mark.parametrize(
    "args,message",
    [
        (["--private-model", "resnet999"], "unknown model 'resnet999'"),
        (["--dataset", "imagenet"], "unknown dataset 'imagenet'"),
        (["--p-major", "1.5"], "p_major must lie in [0, 1]"),
        (["--clients", "40"], "exceeds the 1348 training examples"),
        (["--delta", "0.05"], "must be below 1/n"),
        (["--privacy", "loose"], "unknown privacy 'loose'"),
        (["--privacy", "strict", "--dml-beta", "0.5"], "privacy 'strict' needs dml_beta = 0"),
        (["--noise-multiplier", "0"], "noise_multiplier must be positive"),
        (["--noise-multiplier", "1", "--target-epsilon", "0.01"], "is below the ε of a single round"),
        (["--target-epsilon", "0.01"], "is unreachable for 8 steps"),
    ],
)
def test_bad_input_gives_a_clear_error(tmp_path, args, message):
    r = runner.invoke(app, ["run", *TINY, "--out", str(tmp_path / "x"), *args])
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.split())
    assert "Traceback" not in r.output


def test_bad_config_file(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("clients: 3\nbogus_option: 1\n")
    r = runner.invoke(app, ["run", "--config", str(cfg)])
    assert r.exit_code == 2 and "unknown config option(s): bogus_option" in " ".join(r.output.split())
    r = runner.invoke(app, ["run", "--config", str(tmp_path / "missing.yaml")])
    assert r.exit_code == 2 and "not found" in r.output
    r = runner.invoke(app, ["evaluate", str(tmp_path)])
    assert r.exit_code == 2 and "not a run folder" in r.output


@pytest.mark.slow  # a whole run (fast tier ≤ 60 s)
def test_per_client_budgets_one_client_leaves_the_others_finish(tmp_path):
    from silofl.privacy import epsilon_of

    tight = 1.0001 * epsilon_of("rdp", ((1.0, 0.25, 8),), 1e-3)  # room for exactly two rounds of 4 steps
    out = tmp_path / "b"
    args = [a if a != "2" else "5" for a in TINY]  # 5 rounds
    r = runner.invoke(
        app,
        [
            "run",
            *args,
            "--target-epsilons",
            f"1000,{tight},1000",
            "--set",
            "calibrate_noise=false",
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    s = json.loads((out / "summary.json").read_text())
    assert s["rounds_run"] == 5 and s["left"] == [{"client": 1, "round": 3, "reason": "budget spent"}]
    steps = [a["steps"] for a in s["accounting"]]
    assert steps == [20, 8, 20]
    assert s["accounting"][1]["epsilon"] <= tight == s["accounting"][1]["target_epsilon"]
    assert s["accounting"][1]["rounds_within_budget"] == 2 and s["accounting"][0]["rounds_within_budget"] > 5
    r = runner.invoke(app, ["run", *TINY, "--target-epsilons", "1,x", "--out", str(out)])
    assert r.exit_code == 2 and "comma-separated numbers" in r.output
    r = runner.invoke(app, ["run", *TINY, "--target-epsilons", "5,5", "--out", str(out)])
    assert r.exit_code == 2 and "2 budgets for 3 clients" in r.output


@pytest.mark.parametrize(
    "args,message",
    [
        (["--noise-multiplier", "inf"], "noise_multiplier must be positive and finite"),
        (["--noise-multiplier", "nan"], "must be a number, got nan"),
        (["--target-epsilon", "nan"], "must be a number, got nan"),
        (["--lr", "inf"], "lr must be a finite positive number"),
        (["--clip", "adaptive"], "option adaptive_clip does not apply to method 'proxyfl'"),
        (["--method", "fedavg", "--dml-alpha", "0.3"], "option dml_alpha does not apply to method 'fedavg'"),
    ],
)
def test_numbers_and_options_that_cannot_work_are_refused_before_anything_is_written(tmp_path, args, message):
    r = runner.invoke(app, ["run", *TINY, "--out", str(tmp_path / "x"), *args])
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.split()) and "Traceback" not in r.output
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_client_level_adaptive_clip_in_the_readme_form(tmp_path):
    out = tmp_path / "a"
    r = runner.invoke(
        app,
        [
            "run",
            *TINY,
            "--method",
            "dp-fedavg",
            "--partition",
            "iid",
            "--clip",
            "adaptive:0.5",
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    assert "clip adaptive from 0.5" in " ".join(r.output.split())
    s = json.loads((out / "summary.json").read_text())
    assert s["server_rounds"][0]["clip"] == 0.5 and "unclipped_fraction_noisy" in s["server_rounds"][0]


@pytest.mark.slow  # whole runs (fast tier ≤ 60 s)
def test_an_existing_run_folder_or_a_file_is_never_overwritten_silently(tmp_path):
    out = tmp_path / "run"
    assert runner.invoke(app, ["run", *TINY, "--out", str(out)]).exit_code == 0
    before = (out / "summary.json").read_bytes()
    r = runner.invoke(app, ["run", *TINY, "--seed", "5", "--out", str(out)])
    assert r.exit_code == 2 and "already holds a run" in " ".join(r.output.split())
    assert (out / "summary.json").read_bytes() == before
    r = runner.invoke(app, ["run", *TINY, "--seed", "5", "--out", str(out), "--overwrite"])
    assert r.exit_code == 0 and (out / "summary.json").read_bytes() != before
    f = tmp_path / "afile"
    f.write_text("keep me")
    r = runner.invoke(app, ["run", *TINY, "--out", str(f)])
    assert r.exit_code == 2 and "is a file" in r.output and f.read_text() == "keep me"


@pytest.mark.slow
def test_digits_runs_with_the_default_split_and_batch(tmp_path):
    """No --samples-per-client or --batch-size: the defaults fit the bundled data set (as many examples per
    client as the p_major split can serve from the smallest class's 122 training images: 112; batch 28)."""
    r = runner.invoke(
        app,
        [
            "run",
            "--dataset",
            "digits",
            "--rounds",
            "1",
            "--delta",
            "1e-3",
            "--test-limit",
            "100",
            "--quiet",
            "--out",
            str(tmp_path / "d"),
        ],
    )
    assert r.exit_code == 0, r.output
    cfg = yaml.safe_load((tmp_path / "d/config.yaml").read_text())  # as asked: sizes left to auto
    plan = json.loads((tmp_path / "d/plan.json").read_text())  # as planned from the data
    assert (cfg["samples_per_client"], cfg["batch_size"], cfg["clients"]) == (None, None, 8)
    assert (plan["samples_per_client"], plan["batch_size"]) == (112, 28)
    r = runner.invoke(
        app,
        [
            "compare",
            "--dataset",
            "digits",
            "--methods",
            "regular,fedavg",
            "--seeds",
            "0",
            "--rounds",
            "1",
            "--set",
            "delta=0.001",
            "--test-limit",
            "100",
            "--quiet",
            "--out",
            str(tmp_path / "c"),
        ],
    )
    assert r.exit_code == 0, r.output
