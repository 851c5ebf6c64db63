"""A data set is one module and one registration: here a new data set and a new model come from ANOTHER
package, through the ``silofl.datasets`` and ``silofl.models`` entry-point groups, and a real ``silofl run``
trains on them; unknown names are one-line errors naming the choices."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from silofl.core.errors import ConfigError
from silofl.data.datasets import DATASETS, dataset_meta, load_dataset
from silofl.models import MODELS, build_model, load_model
from tests.core import plugins

DATASET = '''
"""digits as rows: scikit-learn's 8×8 digits, 64 pixel values in [0, 1] (scaled by the public range 0..16)."""
import numpy as np
import torch

from silofl.data.datasets import register_dataset
from silofl.data.types import Dataset


@register_dataset("digit-rows", images=False, description="8×8 digits as 64-value rows")
def load(data_dir=None, *, seed=0, **_):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.from_numpy(d.data.astype(np.float32) / 16.0)
    y = torch.from_numpy(d.target.astype(np.int64))
    perm = torch.from_numpy(np.random.default_rng(0).permutation(len(y)))
    te, tr = perm[:400], perm[400:]
    return Dataset("digit-rows", x[tr], y[tr], x[te], y[te], num_classes=10, source="sklearn digits as rows")
'''

MODEL = '''
"""A small two-layer network for rows (every layer Linear: DP-SGD's fast per-example norms apply)."""
import math

from torch import nn

from silofl.models import register_model


@register_model("plugnet", inputs="rows", description="D-32-C")
class PlugNet(nn.Module):
    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 32), nn.ReLU(),
                                  nn.Linear(32, num_classes))

    def forward(self, x):
        return self.body(x)
'''

MODULES = {"silofl_digitrows": DATASET, "silofl_plugnet": MODEL}
GROUPS = {
    "silofl.datasets": {"digit-rows": "silofl_digitrows"},
    "silofl.models": {"plugnet": "silofl_plugnet"},
}


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """An installed third-party package holding a data set and a model, each in its entry-point group."""
    root = plugins.install(tmp_path / "site-packages", monkeypatch, "silofl-digitrows", MODULES, GROUPS)
    DATASETS.rescan()
    MODELS.rescan()
    yield root
    plugins.forget(MODULES, [(DATASETS, "digit-rows"), (MODELS, "plugnet")])


def test_a_dataset_and_a_model_from_another_package_register(plugin):
    builtin = ("fashion-mnist", "mnist", "cifar10", "digits", "npz", "folder", "bags", "table")
    assert DATASETS.names()[:8] == builtin
    assert "digit-rows" in DATASETS and "plugnet" in MODELS
    meta = dataset_meta("digit-rows")
    assert meta["images"] is False and meta["pooled"] is True and meta["site_data"] is False
    net = build_model("plugnet", (64,), 10)
    assert type(net).__module__ == "silofl_plugnet" and net(torch.zeros(5, 64)).shape == (5, 10)


@pytest.mark.slow
def test_a_real_run_trains_on_a_plugin_dataset_and_model(plugin, tmp_path):
    """The configuration takes the plug-in's names and asks its metadata; then ``silofl run`` as a user types
    it, in a fresh process that finds the package by its entry points, trains on them and saves the model."""
    from silofl.runner.config import RunConfig

    ds = load_dataset("digit-rows")
    assert ds.x_train.shape == (1397, 64) and ds.num_classes == 10
    asked = {"method": "fedavg", "dataset": "digit-rows", "proxy_model": "plugnet"}
    cfg = RunConfig.from_dict(asked).resolve()
    assert cfg.dataset == "digit-rows" and cfg.options.proxy_model == "plugnet"
    with pytest.raises(ConfigError, match="apply to images; dataset 'digit-rows'"):  # its metadata is asked
        RunConfig.from_dict({"method": "fedavg", "dataset": "digit-rows", "features": "scatter"}).resolve()
    out = tmp_path / "run"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(plugin), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "SILOFL_NO_PROGRESS": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "silofl.cli.main",
        "run",
        "--method",
        "fedavg",
        "--dataset",
        "digit-rows",
        "--proxy-model",
        "plugnet",
        "--clients",
        "3",
        "--rounds",
        "3",
        "--partition",
        "iid",
        "--privacy",
        "off",
        "--samples-per-client",
        "200",
        "--batch-size",
        "50",
        "--set",
        "lr=0.01",
        "--seed",
        "7",
        "--quiet",
        "--out",
        str(out),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset"] == "digit-rows" and summary["final"]["global_acc"]["mean"] > 0.3  # chance: 0.1
    specs = sorted((out / "models").glob("*.json"))
    assert specs and all(json.loads(p.read_text())["name"] == "plugnet" for p in specs)
    model, spec = load_model(specs[0].with_suffix(""))  # the saved spec names the registered architecture
    assert spec.name == "plugnet" and type(model).__name__ == "PlugNet"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(r["round"] for r in rows) == 3 and {r["client"] for r in rows} == {0, 1, 2}


def test_unknown_dataset_is_one_line_naming_the_choices():
    with pytest.raises(ConfigError) as e:
        load_dataset("imagenet")
    assert str(e.value) == ("unknown dataset 'imagenet'; choose one of: " + ", ".join(DATASETS.names()))
    with pytest.raises(ConfigError, match="'table' is read per site"):
        load_dataset("table")


def test_registry_loaders_build_what_the_loaders_build():
    """The registry hands back the same loader calls as before: digits through it equals digits direct."""
    from silofl.data.datasets import load_digits_dataset

    a, b = load_dataset("digits"), load_digits_dataset()
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
    assert [n for n in DATASETS.names() if dataset_meta(n)["site_data"]] == [
        "folder",
        "table",
        "segmentation",
    ]
    assert [n for n in DATASETS.names() if not dataset_meta(n)["images"]] == ["bags", "table"]
