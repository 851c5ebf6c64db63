"""An architecture is one module and one registration, from silofl or another package (``silofl.models``);
a saved model's spec names its registered architecture and loads back through the registry."""

from __future__ import annotations

import json

import pytest
import torch

from silofl.core.errors import ConfigError
from silofl.models import (
    MODEL_NAMES,
    MODELS,
    REGISTRY,
    ModelSpec,
    build_model,
    load_model,
    model_names,
    save_model,
)
from tests.core import plugins

WIDE = """
from torch import nn

from silofl.models import register_model


@register_model("widelogreg", inputs="rows", description="one Linear layer, bias off")
def build(input_shape, num_classes):
    import math

    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes, bias=False))
"""


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    plugins.install(
        tmp_path / "sp",
        monkeypatch,
        "silofl-widelogreg",
        {"silofl_widelogreg": WIDE},
        {"silofl.models": {"widelogreg": "silofl_widelogreg"}},
    )
    MODELS.rescan()
    yield
    plugins.forget(["silofl_widelogreg"], [(MODELS, "widelogreg")])


def test_builtins_in_their_order_with_metadata():
    assert model_names()[:4] == ("mlp", "mlp256", "tabmlp", "logreg") and MODEL_NAMES == model_names()
    assert MODELS.entry("lenet5").meta["inputs"] == "images"
    assert MODELS.entry("deepset").meta["inputs"] == "bags"
    assert {n for n in MODELS if MODELS.entry(n).meta["head"]} == {"linear", "scattercnn", "scattercnn-gn"}
    assert REGISTRY["linear"] is REGISTRY["logreg"]  # the linear head is logistic regression


def test_a_plugin_model_builds_saves_and_loads_back(plugin, tmp_path):
    import silofl.models

    assert "widelogreg" in model_names()
    assert "widelogreg" in silofl.models.MODEL_NAMES  # the old name reads the registry now
    torch.manual_seed(0)
    net = build_model("widelogreg", (4, 4), 3)
    spec = ModelSpec("widelogreg", (4, 4), 3)
    save_model(net, spec, tmp_path / "m" / "site0")
    assert json.loads((tmp_path / "m" / "site0.json").read_text())["name"] == "widelogreg"
    back, spec2 = load_model(tmp_path / "m" / "site0")
    x = torch.randn(2, 4, 4)
    assert spec2 == spec and torch.equal(back(x), net(x))


def test_unknown_model_is_one_line_naming_the_choices():
    with pytest.raises(ConfigError) as e:
        build_model("resnet999", (1, 28, 28), 10)
    assert str(e.value) == "unknown model 'resnet999'; choose one of: " + ", ".join(model_names())
    assert build_model("MLP", (1, 8, 8), 10).out.out_features == 10  # names stay case-insensitive
