import pytest
import torch

from silofl.core.errors import ConfigError
from silofl.models import MODEL_NAMES, ModelSpec, build_model, load_model, save_model

IMAGE_MODELS = [n for n in MODEL_NAMES if n not in ("deepset", "unet")]  # unet: per-pixel logits


@pytest.mark.parametrize("name", IMAGE_MODELS)
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
    with pytest.raises(ConfigError, match="unknown model .*; choose one of: mlp, "):
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


def test_resnet18_has_the_resnet18_layout_with_groupnorm():
    m = build_model("resnet18", (3, 64, 64), 2)
    convs = [x for x in m.modules() if isinstance(x, torch.nn.Conv2d)]
    assert len(convs) == 1 + 16 + 3  # stem, 8 blocks x 2 convs, 3 projection shortcuts
    assert sum(isinstance(x, torch.nn.GroupNorm) for x in m.modules()) == 1 + 16 + 3
    assert (
        11.0e6 < sum(p.numel() for p in m.parameters()) < 11.3e6
    )  # torchvision's resnet18 has 11.2 M (2 classes)
    assert m(torch.zeros(2, 3, 64, 64)).shape == (2, 2)


def test_deepset_is_invariant_to_instance_order_and_ignores_padding():
    torch.manual_seed(0)
    m = build_model("deepset", (5, 4), 3)
    x = torch.randn(2, 5, 4)
    x[..., -1] = 1.0
    x[1, 3:, -1] = 0.0  # bag 1 has 3 real instances
    perm = x[:, [2, 0, 1, 4, 3]]
    perm[1] = x[1, [2, 0, 1, 3, 4]]
    torch.testing.assert_close(m(x), m(perm))
    changed = x.clone()
    changed[1, 3:, :-1] = 99.0  # padding content must not matter
    torch.testing.assert_close(m(x), m(changed))
    with pytest.raises(ConfigError, match="bag inputs"):
        build_model("deepset", (1, 28, 28), 10)
    with pytest.raises(ConfigError, match="image inputs"):
        build_model("vgg", (5, 4), 10)


def test_tabular_models_take_the_dp_sgd_fast_path():
    from silofl.models import build_model
    from silofl.privacy.grad_sample import ghost_support

    for name in ("tabmlp", "logreg"):
        model = build_model(name, (7,), 3)
        assert ghost_support(model) is None, name
        assert model(torch.zeros(4, 7)).shape == (4, 3)
    with pytest.raises(ConfigError, match="convolutional model for images"):
        build_model("lenet5", (7,), 3)


def test_scattercnn_gn_adds_groupnorm_after_each_conv_which_fedbn_keeps():
    """scattercnn-gn: scattercnn's layers plus GroupNorm after each convolution; FedBN keeps exactly those
    GroupNorm tensors at each site and shares the rest (under DP too: no BatchNorm)."""
    from silofl.fl.methods.fedbn import fedbn_keys, norm_keys

    shape = (81, 7, 7)  # J = 2 scattering of 28×28 images
    torch.manual_seed(0)
    gn, plain = build_model("scattercnn-gn", shape, 10), build_model("scattercnn", shape, 10)
    assert gn(torch.randn(3, *shape)).shape == (3, 10)
    norms = [m for m in gn.modules() if isinstance(m, torch.nn.GroupNorm)]
    assert [(m.num_groups, m.num_channels, m.affine) for m in norms] == [(4, 16, True), (4, 32, True)]
    assert {type(m) for m in gn.modules() if any(True for _ in m.parameters(recurse=False))} == {
        torch.nn.Conv2d,
        torch.nn.GroupNorm,
        torch.nn.Linear,
    }
    own = ("norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias")
    assert norm_keys(gn) == own and norm_keys(plain) == ()
    shared = fedbn_keys(ModelSpec("scattercnn-gn", shape, 10), private=True)
    assert set(shared) == set(plain.state_dict()) and not set(shared) & set(own)
    # the normalisation sits between each conv and its tanh: every example's groups have mean 0, variance 1
    x = torch.randn(2, *shape)
    z = gn.norm1(gn.conv1(x)).reshape(2, 4, -1)
    torch.testing.assert_close(z.mean(-1), torch.zeros(2, 4), atol=1e-5, rtol=0)
    with pytest.raises(ConfigError, match="scattercnn"):
        build_model("scattercnn-gn", (3969,), 10)


def test_fedper_splits_scattercnn_into_its_cnn_body_and_output_layer():
    """FedPer and FedRep share scattercnn's conv, conv, fc (the body) and keep its last Linear (the head)."""
    from silofl.fl.methods.fedper import body_keys, head_keys

    spec = ModelSpec("scattercnn", (81, 7, 7), 10)
    model = spec.build()
    assert head_keys(model) == ("out.weight", "out.bias")
    assert body_keys(spec) == tuple(f"{m}.{p}" for m in ("conv1", "conv2", "fc") for p in ("weight", "bias"))
    # scattercnn's layout (and so its saved models) is unchanged by the GroupNorm option
    assert list(model.state_dict()) == [*body_keys(spec), "out.weight", "out.bias"]
