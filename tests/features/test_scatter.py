"""ScatterNet features: kymatio's scattering, then GroupNorm without affine parameters, one example at a
time."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from silofl.core.errors import ConfigError
from silofl.features.scatter import ScatterFeatures, scattering_channels


def _images(n=4, c=1, size=16, seed=0):
    """Smooth random images (blocks of 2×2 pixels, like silofl's upsampled digits)."""
    x = torch.rand(n, c, size // 2, size // 2, generator=torch.Generator().manual_seed(seed))
    return x.repeat_interleave(2, dim=2).repeat_interleave(2, dim=3)


def _group_norm_by_hand(s: np.ndarray, groups: int) -> np.ndarray:
    n, c = s.shape[:2]
    g = s.reshape(n, groups, -1).astype(np.float64)
    mu, var = g.mean(-1, keepdims=True), g.var(-1, keepdims=True)  # biased, as GroupNorm
    return ((g - mu) / np.sqrt(var + 1e-5)).reshape(s.shape)


@pytest.mark.parametrize("c", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_equals_kymatio_then_group_norm(c):
    from kymatio.scattering2d.frontend.torch_frontend import ScatteringTorch2D

    x = _images(n=3, c=c)
    ours = ScatterFeatures(j=2, l=8).transform(x)
    k = ScatteringTorch2D(J=2, shape=(16, 16), L=8)
    # kymatio on each channel of each image separately: the scattering of a colour image is its channels'
    # scatterings
    ref = torch.stack([torch.cat([k(x[i, ch]) for ch in range(c)]) for i in range(len(x))]).numpy()
    assert ref.shape == (3, c * 81, 4, 4) == tuple(ours.shape)
    groups = math.gcd(27, c * 81)
    assert groups == 27  # Tramèr & Boneh's choice for 81 (grey) and 243 (colour) channels
    np.testing.assert_allclose(ours.numpy(), _group_norm_by_hand(ref, groups), rtol=1e-4, atol=1e-4)


def test_one_example_depends_on_no_other():
    stage = ScatterFeatures(j=2, l=8)
    x = _images(n=6)
    base = stage.transform(x)
    changed = x.clone()
    changed[2] = torch.rand(changed[2].shape)
    after = stage.transform(changed)
    keep = [0, 1, 3, 4, 5]
    assert torch.equal(after[keep], base[keep])  # bit-identical
    assert not torch.equal(after[2], base[2])
    assert torch.equal(stage.transform(x[4:5]), base[4:5])  # alone or in a batch: the same bits


def test_shape_and_bounds():
    from silofl.features import record, value_bounds

    stage = ScatterFeatures(j=2, l=8)
    assert stage.output_shape((1, 28, 28)) == (81, 7, 7)
    assert scattering_channels(2, 8) == 81 and scattering_channels(1, 8) == 9
    lo, hi = stage.value_bounds((1, 16, 16))
    cfg = SimpleNamespace(features="scatter", scatter_j=2, scatter_l=8)
    assert (lo, hi) == value_bounds(record(stage, (1, 16, 16), cfg))
    x = _images(n=4)
    x[0] = 0
    x[0, 0, 0, 0] = 1  # one bright pixel: the most extreme group values
    f = stage.transform(x)
    assert lo <= float(f.min()) and float(f.max()) <= hi


@pytest.mark.parametrize("shape,j", [((1, 16, 16), 5), ((1, 8, 8), 4)])
def test_j_too_large_for_the_image(shape, j):
    with pytest.raises(ConfigError, match=f"J = {j} needs images of at least"):
        ScatterFeatures(j=j).output_shape(shape)


def test_not_for_table_rows():
    with pytest.raises(ConfigError, match="apply to images"):
        ScatterFeatures().output_shape((12,))
