"""The heads for features take DP-SGD's fast per-example-norm (ghost) path and match Opacus' per-sample
gradients."""

import pytest
import torch

from silofl.models import build_model
from silofl.privacy.grad_sample import GhostClipper, ghost_support, make_clipper
from tests.privacy.test_grad_sample import ce, opacus_reference


@pytest.mark.parametrize(
    "name", ["linear", "scattercnn", "scattercnn-gn", pytest.param("mlp", marks=pytest.mark.slow)]
)
def test_heads_on_scatter_features_use_ghost_norms_matching_opacus(name):
    shape = (81, 4, 4)  # J = 2 scattering of 16×16 images
    torch.manual_seed(0)
    model = build_model(name, shape, 10)
    assert ghost_support(model) is None and isinstance(make_clipper(model, "auto"), GhostClipper)
    ref_model = build_model(name, shape, 10)
    ref_model.load_state_dict(model.state_dict())
    x, y = torch.randn(7, *shape), torch.randint(0, 10, (7,))
    ref_sq, ref_sum = opacus_reference(ref_model, x, y, clip=0.1)
    clipper = GhostClipper(model)
    _, grads, sq = clipper.clipped_sum(x, ce, (y,), 0.1)
    clipper.close()
    torch.testing.assert_close(sq.sqrt(), ref_sq.sqrt(), rtol=1e-5, atol=1e-6)
    for p, ref_p in zip(model.parameters(), ref_model.parameters(), strict=True):
        torch.testing.assert_close(grads[p].flatten(), ref_sum[ref_p], rtol=1e-4, atol=1e-6)
