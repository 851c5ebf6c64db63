"""Bad feature settings: one-line errors (exit code 2 from the CLI), nothing written."""

import json

import pytest
import torch
from typer.testing import CliRunner

from silofl.cli.main import app
from silofl.core.errors import ConfigError
from silofl.features import make_stage
from silofl.models import ModelSpec, build_model, save_model
from silofl.runner.config import RunConfig

runner = CliRunner()
TINY = [
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
    "--quiet",
]


def _cfg(**kw):
    return RunConfig.from_dict({"method": "fedavg", "dataset": "digits", "out": "unused", **kw}).resolve()


def make_backbone(folder, shape=(1, 16, 16), card=True):
    spec = ModelSpec("mlp", shape, 10)
    save_model(build_model("mlp", shape, 10), spec, folder / "backbone")
    if card:
        (folder / "card.json").write_text(
            json.dumps(
                {
                    "format": "silofl.backbone/1",
                    "public_data": {
                        "declared_public": True,
                        "kind": "dataset",
                        "dataset": "mnist",
                        "description": "test rows",
                    },
                }
            )
        )
    return folder


def test_unknown_features():
    with pytest.raises(
        ConfigError, match="unknown features 'bogus'; choose one of: none, scatter, backbone:DIR"
    ):
        _cfg(features="bogus")
    with pytest.raises(ConfigError, match="needs an argument"):
        _cfg(features="backbone")
    with pytest.raises(ConfigError, match="takes no argument"):
        _cfg(features="scatter:3")
    with pytest.raises(ConfigError, match="scatter_j must be at least 1"):
        _cfg(features="scatter", scatter_j=0)


def test_features_on_tables_or_bags():
    with pytest.raises(ConfigError, match="apply to images; dataset 'bags'"):
        _cfg(dataset="bags", features="scatter")


def test_backbone_missing_corrupt_or_wrong_shape(tmp_path):
    with pytest.raises(ConfigError, match="backbone folder .* not found"):
        _cfg(features=f"backbone:{tmp_path / 'nowhere'}")
    nocard = make_backbone(tmp_path / "nocard", card=False)
    with pytest.raises(ConfigError, match="has no card.json"):
        _cfg(features=f"backbone:{nocard}")
    bad = make_backbone(tmp_path / "bad")
    (bad / "backbone.safetensors").write_bytes(b"\x00" * 20)
    with pytest.raises(ConfigError, match="cannot load"):
        make_stage(f"backbone:{bad}")
    (bad / "card.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        _cfg(features=f"backbone:{bad}")
    wrong = make_backbone(tmp_path / "wrong", shape=(1, 28, 28))
    with pytest.raises(ConfigError, match=r"takes inputs of shape \(1, 28, 28\), the data has \(1, 16, 16\)"):
        make_stage(f"backbone:{wrong}").output_shape((1, 16, 16))
    good = make_stage(f"backbone:{make_backbone(tmp_path / 'good')}")
    assert good.output_shape((1, 16, 16)) == (200,)
    assert good.transform(torch.rand(2, 1, 16, 16)).shape == (2, 200)


def test_cli_unknown_features_writes_nothing(tmp_path):
    out = tmp_path / "run"
    r = runner.invoke(app, ["run", "--method", "fedavg", *TINY, "--features", "bogus", "--out", str(out)])
    assert r.exit_code == 2
    assert "unknown features 'bogus'" in r.output and "Traceback" not in r.output
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "args,msg",
    [
        (["--set", "scatter_j=5"], "scattering J = 5 needs images of at least 32×32 pixels, got 16×16"),
        (["--dataset", "bags"], "apply to images; dataset 'bags'"),
    ],
)
def test_cli_bad_scatter_writes_nothing(tmp_path, args, msg):
    out = tmp_path / "run"
    r = runner.invoke(
        app, ["run", "--method", "fedavg", *TINY, "--features", "scatter", *args, "--out", str(out)]
    )
    assert r.exit_code == 2, r.output
    assert msg in " ".join(r.output.split()) and "Traceback" not in r.output
    assert not out.exists()
