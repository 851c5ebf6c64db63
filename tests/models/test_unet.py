"""The UNet (silofl.models.unet): shapes, refusals, and DP-SGD's per-image clipping on it."""

from __future__ import annotations

import pytest
import torch

from silofl.core.errors import ConfigError
from silofl.models import build_model
from silofl.privacy.grad_sample import GhostClipper, ghost_support
from silofl.training.segmentation import segmentation_loss


@pytest.mark.slow  # ~1 s (a UNet forward on a busy machine)
def test_shapes_and_refusals():
    m = build_model("unet", (1, 20, 28), 2)  # sides not divisible by 2^depth still work
    assert m(torch.zeros(2, 1, 20, 28)).shape == (2, 2, 20, 28)
    assert not any(isinstance(x, torch.nn.modules.batchnorm._BatchNorm) for x in m.modules())
    assert ghost_support(m) is None
    with pytest.raises(ConfigError, match="pixels a side"):
        build_model("unet", (1, 4, 4), 2)
    with pytest.raises(ConfigError, match="images"):
        build_model("unet", (16,), 2)


@pytest.mark.slow  # ~2 s
def test_ghost_clipping_matches_per_image_autograd():
    """The clipped sum of the per-layer norm trick equals clipping each image's own autograd gradient."""
    torch.manual_seed(0)
    m = build_model("unet", (1, 8, 8), 2)
    x = torch.randn(3, 1, 8, 8)
    y = (torch.rand(3, 8, 8) > 0.5).long()
    clip = 0.5

    def loss_fn(out, yb):
        return segmentation_loss(out, yb)

    params = [p for p in m.parameters()]
    ref = [torch.zeros_like(p) for p in params]
    norms = []
    for i in range(3):
        g = torch.autograd.grad(segmentation_loss(m(x[i : i + 1]), y[i : i + 1]).sum(), params)
        n = torch.sqrt(sum((t**2).sum() for t in g))
        norms.append(float(n))
        c = min(1.0, clip / (float(n) + 1e-6))
        for r, t in zip(ref, g, strict=True):
            r += c * t
    clipper = GhostClipper(m)
    try:
        _, grads, sq = clipper.clipped_sum(x, loss_fn, (y,), clip)
    finally:
        clipper.close()
    assert sq.sqrt().tolist() == pytest.approx(norms, rel=1e-4)
    for p, r in zip(params, ref, strict=True):
        assert torch.allclose(grads[p], r, atol=1e-5), p.shape
