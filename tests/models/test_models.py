import pytest
import torch

from silofl.errors import ConfigError
from silofl.models import MODEL_NAMES, ModelSpec, build_model, load_model, save_model


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32), (1, 16, 16)])
def test_models_build_and_run(name, shape):
    m = build_model(name, shape, 10)
    assert m(torch.zeros(2, *shape)).shape == (2, 10)
    assert not any(isinstance(x, torch.nn.modules.batchnorm._BatchNorm) for x in m.modules())


def test_paper_sizes():
    assert build_model("lenet5", (1, 28, 28), 10).fcs[0].in_features == 16 * 4 * 4
    assert build_model("cnn1", (3, 32, 32), 10).fcs[0].in_features == 16 * 6 * 6
    mlp = build_model("mlp", (1, 28, 28), 10)
    assert [layer.out_features for layer in mlp.hidden] == [200, 200]


def test_unknown_and_too_small():
    with pytest.raises(ConfigError, match="available models"):
        build_model("resnet999", (1, 28, 28), 10)
    with pytest.raises(ConfigError, match="larger inputs"):
        build_model("lenet5", (1, 8, 8), 10)


def test_save_load_roundtrip(tmp_path):
    spec = ModelSpec("lenet5", (1, 28, 28), 10)
    m = spec.build()
    save_model(m, spec, tmp_path / "m")
    m2, spec2 = load_model(tmp_path / "m")
    assert spec2 == spec
    x = torch.randn(3, 1, 28, 28)
    assert torch.equal(m(x), m2(x))
