"""--vs-alone: the go-it-alone baseline is Regular without DP on the same split, rounds and architecture."""

import json

import pytest
from typer.testing import CliRunner

from silofl.cli.main import app
from silofl.run.alone import alone_config
from silofl.run.config import RunConfig


def test_alone_config_keeps_the_split_and_model(tmp_path):
    cfg = RunConfig.from_dict(dict(method="proxyfl", dataset="digits", clients=3, rounds=7, samples_per_client=100,
                                   batch_size=25, private_model="cnn1", target_epsilon=3.0, lr=0.003,
                                   out=str(tmp_path / "r"))).resolve()
    a = alone_config(cfg, 1234).resolve()
    assert (a.method, a.privacy, a.split_seed, a.rounds, a.options.private_model, a.options.lr) == \
        ("regular", "off", 1234, 7, "cnn1", 0.003)
    assert (a.clients, a.samples_per_client, a.batch_size, a.partition) == (3, 100, 25, "p_major")
    assert a.out == str(tmp_path / "r" / "alone")


@pytest.mark.slow
def test_cli_vs_alone_prints_and_records(tmp_path):
    out = tmp_path / "v"
    r = CliRunner().invoke(app, ["run", "--dataset", "digits", "--clients", "2", "--samples-per-client", "100",
                                 "--batch-size", "25", "--delta", "1e-3", "--private-model", "mlp", "--rounds", "2",
                                 "--target-epsilon", "8", "--vs-alone", "--quiet", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "vs training alone" in " ".join(r.output.split())
    s = json.loads((out / "summary.json").read_text())
    assert s["vs_alone"]["alone_private_acc"] == pytest.approx(
        json.loads((out / "alone" / "summary.json").read_text())["final"]["private_acc"]["mean"])
