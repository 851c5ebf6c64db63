"""`silofl tune`: trials are scored on the validation split (training data no client holds), never the test set;
the best config and the tuning-inclusive spend are written."""

import json

import pytest
import torch
import yaml
from typer.testing import CliRunner

import silofl.run.data as run_data
from silofl.cli.main import app
from silofl.data.types import Dataset
from silofl.experiments.tune import parse_grid, tune, tuning_cost
from silofl.privacy import epsilon_of
from silofl.run.config import RunConfig


@pytest.fixture
def poisoned_test_split(monkeypatch):
    """Any read of the test split fails; its tensors are garbage (NaN inputs, impossible labels)."""
    real = run_data.load_dataset

    def load(*a, **kw):
        d = real(*a, **kw)
        d.x_test = torch.full_like(d.x_test, float("nan"))
        d.y_test = torch.full_like(d.y_test, -1)
        return d

    def refuse(self, limit=None):
        raise AssertionError("the test split was read")

    monkeypatch.setattr(run_data, "load_dataset", load)
    monkeypatch.setattr(Dataset, "test_split", refuse)


def _base(tmp_path):
    return RunConfig.from_dict(dict(method="proxyfl", dataset="digits", clients=3, rounds=2, samples_per_client=100,
                                    batch_size=25, delta=1e-3, private_model="mlp", proxy_model="mlp",
                                    target_epsilon=4.0, eval_split="validation", validation_size=300, seed=1,
                                    out=str(tmp_path / "unused")))


def test_tune_never_touches_the_test_set(tmp_path, poisoned_test_split):
    res = tune(_base(tmp_path), parse_grid(["lr=0.001,0.01"]), tmp_path / "t")
    assert len(res["trials"]) == 2
    for r in res["trials"]:
        assert r["test_set"].startswith("validation: 300 digits training examples held by no client")
        assert 0.0 < r["validation"] <= 1.0  # a NaN test set would give 0
        assert r["epsilon"] <= 4.0
    best = yaml.safe_load((tmp_path / "t" / "best.yaml").read_text())
    assert best["eval_split"] == "test" and best["proxyfl"]["lr"] == res["best"]["settings"]["lr"]
    assert best["target_epsilon"] == 4.0
    # the tuning-inclusive spend: two runs composed per client — more than one run's budget
    c = res["tuning_cost"]
    assert c["trials"] == 2 and 4.0 < c["max"]
    one = json.loads((tmp_path / "t/trials/trial0/summary.json").read_text())["accounting"][0]["history"]
    assert c["per_party"]["client0"] <= epsilon_of("rdp", tuple(tuple(h) for h in one * 2), 1e-3) + 1e-9
    assert "Tuning-inclusive" in (tmp_path / "t" / "tune.md").read_text()
    assert len((tmp_path / "t" / "tune.csv").read_text().splitlines()) == 3


def test_validation_is_disjoint_from_every_client(tmp_path):
    from silofl.run.data import prepare_data

    cfg = _base(tmp_path).resolve()
    cfg, split = prepare_data(cfg, torch.device("cpu"))
    train = {tuple(x.flatten().tolist()) for x, _ in split.parts for x in x}
    assert not any(tuple(x.flatten().tolist()) in train for x in split.test[0])
    assert len(split.test[1]) == 300 and split.test_set.startswith("validation")


def test_cli_bad_grid_is_one_line(tmp_path):
    r = CliRunner().invoke(app, ["tune", "--target-epsilon", "5", "--grid", "lr", "--out", str(tmp_path / "b")])
    assert r.exit_code == 2 and "KEY=V1,V2" in r.output and "Traceback" not in r.output


@pytest.mark.slow
def test_cli_tune(tmp_path):
    runner = CliRunner()
    args = ["tune", "--method", "fedavg", "--target-epsilon", "5", "--set", "dataset=digits", "--set", "clients=2",
            "--set", "rounds=1", "--set", "samples_per_client=100", "--set", "batch_size=25", "--set", "delta=0.001",
            "--set", "validation_size=100"]
    r = runner.invoke(app, [*args, "--grid", "lr=0.001,0.01", "--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    assert "tuning-inclusive" in " ".join(r.output.split())


def test_tuning_cost_composes_histories():
    s = {"accounting": [{"client": 0, "history": [[1.0, 0.25, 8]], "delta": 1e-5, "accountant": "opacus.rdp"}]}
    c = tuning_cost([s, s])
    assert c["per_party"]["client0"] == pytest.approx(epsilon_of("rdp", ((1.0, 0.25, 16),), 1e-5))
