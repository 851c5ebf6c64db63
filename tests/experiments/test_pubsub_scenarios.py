"""The PubSub-ML scenarios (studies/pubsub_scenarios.py) in --quick form: every method's row, its table files
and its plot."""

import json

import pytest

from silofl.core.errors import ConfigError
from studies.pubsub_scenarios import main, run_scenario

ROWS = [
    "PubSub-ML",
    "Own",
    "PubSub-ML*",
    "FedAvg-V",
    "FedAvg-F",
    "FedProx-V",
    "FedProx-F",
    "FedAdam-V",
    "FedAdam-F",
]


@pytest.mark.slow
def test_distributed_features_quick(tmp_path):
    r = run_scenario("distributed-features", tmp_path, quick=True)
    for population in ("same", "different"):
        summary = r["populations"][population]["summary"]
        assert list(summary) == ROWS and all(0 <= v["mean"] <= 1 for v in summary.values())
        details = r["populations"][population]["per_seed"][0]["details"]
        assert details["fl_epsilon_target"] == 1.0 and all(
            details[f"{m}_epsilon"] <= 1.0 for m in ("FedAvg", "FedProx", "FedAdam")
        )
    table = (tmp_path / "table.md").read_text()
    assert all(f"| {m} |" in table for m in ROWS)
    assert (tmp_path / "plot.png").stat().st_size > 1000 and (tmp_path / "table.csv").is_file()


@pytest.mark.slow
def test_stream_quick_scores_every_ensemble_size(tmp_path):
    r = run_scenario("stream", tmp_path, quick=True)
    assert list(r["by_ensemble_size"]) == ["1", "2", "4"]
    assert "parallel composition" in r["setting"]["guarantee"]
    assert json.loads((tmp_path / "results.json").read_text())["scenario"] == "stream"


def test_the_study_command_and_a_bad_name(tmp_path, capsys):
    assert main(["noisy-sites", "--quick", "--out", str(tmp_path)]) == 0
    assert "PubSub-ML (top-4)" in capsys.readouterr().out
    assert "PubSub-ML (top-4)" in (tmp_path / "table.md").read_text()
    with pytest.raises(ConfigError, match="unknown scenario"):
        run_scenario("bogus", tmp_path)
