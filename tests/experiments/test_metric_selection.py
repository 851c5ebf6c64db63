"""`--metric` in `silofl tune` (the selection field; ECE: the lowest wins) and in `silofl compare`'s table."""

from types import SimpleNamespace

import pytest

from silofl.experiments.tune import parse_grid, tune
from silofl.privacy.analysis import rdp_curve
from silofl.report.comparison import markdown_table, summarize
from silofl.runner.config import RunConfig


def _base(tmp_path, **kw):
    return RunConfig.from_dict(
        dict(
            method="proxyfl",
            dataset="digits",
            clients=2,
            rounds=2,
            samples_per_client=100,
            batch_size=25,
            delta=1e-3,
            private_model="mlp",
            proxy_model="mlp",
            target_epsilon=4.0,
            eval_split="validation",
            validation_size=300,
            seed=1,
            out=str(tmp_path / "unused"),
            **kw,
        )
    )


def _fake_trials(monkeypatch, scores):
    """Trials that train nothing: trial i scores ``scores[lr]``; the field each was asked to be scored on
    is kept."""
    import silofl.experiments.tune as tune_mod

    fields = []

    def fake(cfg, i, combo, score_field, progress, console):
        fields.append(score_field)
        acc = [
            {"client": k, "history": [[0.8, 0.25, 4]], "delta": cfg.delta, "accountant": "opacus.rdp"}
            for k in (0, 1)
        ]
        return (
            {
                "trial": i,
                "settings": combo,
                "validation": scores[combo["lr"]],
                "epsilon": 3.9,
                "noise_multiplier": 0.8,
                "seconds": 0.0,
                "test_set": "validation: fake",
            },
            {"accounting": acc},
        )

    monkeypatch.setattr(tune_mod, "_run_trial", fake)
    monkeypatch.setattr(
        tune_mod,
        "planned_curves",
        lambda base, combos: {
            "client0": rdp_curve(((0.8, 0.25, 4),)),
            "client1": rdp_curve(((0.8, 0.25, 4),)),
        },
    )
    return fields


@pytest.mark.parametrize(
    "metric,field,best_lr",
    [("accuracy", "private_acc", 0.001), ("auroc", "private_auroc", 0.001), ("ece", "private_ece", 0.01)],
)
def test_tune_selects_on_the_metric(tmp_path, monkeypatch, metric, field, best_lr):
    fields = _fake_trials(monkeypatch, {0.001: 0.2, 0.01: 0.05})
    res = tune(_base(tmp_path, metric=metric), parse_grid(["lr=0.001,0.01"]), tmp_path / metric)
    assert res["selection"] == field and set(fields) == {field} and res["metric"] == metric
    assert res["best"]["settings"]["lr"] == best_lr  # ECE: the lowest; every other metric: the highest
    assert ("lowest wins" in (tmp_path / metric / "tune.md").read_text()) == (metric == "ece")


def test_random_trials_with_mutual_learning_still_select_on_the_dp_proxy(tmp_path, monkeypatch):
    fields = _fake_trials(monkeypatch, {0.001: 0.2, 0.01: 0.05})
    res = tune(
        _base(tmp_path, metric="f1"),
        parse_grid(["lr=0.001,0.01"]),
        tmp_path / "r",
        random_trials="geometric:0.5",
    )
    assert res["selection"] == "proxy_f1" and set(fields) <= {"proxy_f1"}


def _summary(acc, auroc):
    per = [
        {
            "client": 0,
            "private_acc": acc,
            "private_auroc": auroc,
            "proxy_acc": acc / 2,
            "proxy_auroc": auroc / 2,
            "epsilon": 2.0,
        }
    ]
    return {
        "headline": "private_acc",
        "final": {"per_client": per},
        "rounds_run": 2,
        "wall_time_s": 1.0,
        "privacy": {"delta": 1e-5, "mode": "strict", "formal_guarantee": True},
        "randomness": {"seeded": True},
        "bytes": {"per_client_mean": 10.0, "total_sent": 30.0},
    }


@pytest.mark.parametrize("metric", ["accuracy", "auroc"])
def test_compare_rows_and_table_use_the_metric(metric):
    """A run written with accuracy as its headline (or an older one) is judged by the comparison's
    --metric."""
    runs = [
        SimpleNamespace(
            rid=f"r{i}",
            variant="base",
            label="proxyfl",
            seed=i,
            cfg=SimpleNamespace(metric=metric, out="unused"),
        )
        for i in range(2)
    ]
    results = {"r0": {"summary": _summary(0.8, 0.6)}, "r1": {"summary": _summary(0.9, 0.7)}}
    rows, failed = summarize(runs, results)
    assert not failed and len(rows) == 1
    row = rows[0]
    want = {"accuracy": 0.85, "auroc": 0.65}[metric]
    assert row["headline"] == ("private_acc" if metric == "accuracy" else "private_auroc")
    assert row["headline_acc"]["mean"] == pytest.approx(want) and row["private_auroc"][
        "mean"
    ] == pytest.approx(0.65)
    table = markdown_table(rows)
    assert ("private AUROC" in table) == (metric == "auroc") and ("private acc" in table) == (
        metric == "accuracy"
    )
    assert f"{want:.4f} ± 0.0500" in table


@pytest.mark.parametrize(
    "command",
    [["run", "--dataset", "digits"], ["tune", "--target-epsilon", "3"], ["compare", "--methods", "fedavg"]],
)
def test_an_unknown_metric_is_one_line(tmp_path, command):
    from typer.testing import CliRunner

    from silofl.cli.main import app

    r = CliRunner().invoke(app, [*command, "--metric", "logloss", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "unknown metric 'logloss'" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "o").exists()
