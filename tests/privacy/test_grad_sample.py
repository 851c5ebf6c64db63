"""Fast per-example norms and clipped sums against Opacus' per-sample gradients (independent reference)."""

import pytest
import torch
import torch.nn.functional as F
from opacus import GradSampleModule
from torch import nn

from silofl.core.errors import ConfigError
from silofl.models import build_model
from silofl.privacy.grad_sample import GhostClipper, VmapClipper, clip_factors, make_clipper


def ce(logits, y):
    return F.cross_entropy(logits, y, reduction="none")


def opacus_reference(model, x, y, clip):
    gs = GradSampleModule(model, loss_reduction="sum")
    ce(gs(x), y).sum().backward()
    per = {p: p.grad_sample.reshape(len(x), -1).clone() for p in model.parameters()}
    gs._close()
    sq = sum(g.pow(2).sum(1) for g in per.values())
    c = clip_factors(sq, clip)
    return sq, {p: torch.einsum("b,bk->k", c, g) for p, g in per.items()}


@pytest.mark.parametrize(
    "name,shape",
    [("mlp", (1, 28, 28)), ("lenet5", (1, 28, 28)), ("cnn1", (3, 32, 32)), ("cnn2", (1, 16, 16))],
)
@pytest.mark.parametrize("cls", [GhostClipper, VmapClipper])
def test_norms_and_clipped_sum_match_opacus(name, shape, cls):
    torch.manual_seed(0)
    model = build_model(name, shape, 10)
    ref_model = build_model(name, shape, 10)
    ref_model.load_state_dict(model.state_dict())
    x, y = torch.randn(13, *shape), torch.randint(0, 10, (13,))
    ref_sq, ref_sum = opacus_reference(ref_model, x, y, clip=1.0)
    clipper = cls(model)
    _, grads, sq = clipper.clipped_sum(x, ce, (y,), 1.0)
    clipper.close()
    torch.testing.assert_close(sq.sqrt(), ref_sq.sqrt(), rtol=1e-5, atol=1e-6)
    for p, ref_p in zip(model.parameters(), ref_model.parameters(), strict=True):
        torch.testing.assert_close(grads[p].flatten(), ref_sum[ref_p], rtol=1e-4, atol=1e-6)


class SeqModel(nn.Module):
    """Linear layers on 3-D inputs (tokens), to hit both the materialised and the ghost-norm branch."""

    def __init__(self, T, d_in, d_hidden):
        super().__init__()
        self.a = nn.Linear(d_in, d_hidden)
        self.b = nn.Linear(d_hidden, 3)
        self.T = T

    def forward(self, x):
        return self.b(torch.tanh(self.a(x))).mean(1)


@pytest.mark.parametrize("T,d_in,d_hidden", [(2, 16, 16), (40, 3, 4)])
def test_linear_on_sequences_matches_opacus(T, d_in, d_hidden):
    torch.manual_seed(1)
    model, ref_model = SeqModel(T, d_in, d_hidden), SeqModel(T, d_in, d_hidden)
    ref_model.load_state_dict(model.state_dict())
    x, y = torch.randn(7, T, d_in), torch.randint(0, 3, (7,))
    ref_sq, ref_sum = opacus_reference(ref_model, x, y, clip=0.1)
    _, grads, sq = GhostClipper(model).clipped_sum(x, ce, (y,), 0.1)
    torch.testing.assert_close(sq, ref_sq, rtol=1e-5, atol=1e-7)
    for p, ref_p in zip(model.parameters(), ref_model.parameters(), strict=True):
        torch.testing.assert_close(grads[p].flatten(), ref_sum[ref_p], rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("backend", ["ghost", "vmap"])
def test_every_clipped_example_gradient_is_at_most_C(backend):
    torch.manual_seed(2)
    model = build_model("lenet5", (1, 28, 28), 10)
    clipper = make_clipper(model, backend)
    C = 0.05
    for i in range(6):
        x, y = torch.randn(1, 1, 28, 28) * (i + 1), torch.randint(0, 10, (1,))
        _, grads, sq = clipper.clipped_sum(
            x, ce, (y,), C
        )  # a batch of one: the clipped sum is that example's clipped gradient
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads.values()))
        assert sq.sqrt().item() > C  # it really was clipped
        assert norm.item() <= C * (1 + 1e-5)


def test_auto_falls_back_to_vmap_for_other_layers_and_rejects_batchnorm():
    ln = nn.Sequential(nn.Conv2d(1, 4, 3), nn.LayerNorm([4, 6, 6]), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    assert isinstance(make_clipper(ln, "auto"), VmapClipper)
    with pytest.raises(ConfigError):
        make_clipper(ln, "ghost")
    bn = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4))
    with pytest.raises(ConfigError, match="BatchNorm2d"):
        make_clipper(bn, "auto")


class Reused(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(5, 5)

    def forward(self, x):
        return self.l(torch.relu(self.l(x)))


def test_reused_layer_is_detected_and_dp_gradient_falls_back():
    from silofl.privacy import DPGradient, NoiseSource

    torch.manual_seed(3)
    model = Reused()
    dp = DPGradient(
        model, clip=1.0, noise_multiplier=0.0, expected_batch_size=4, noise=NoiseSource(0), sample_rate=0.5
    )
    assert dp.backend_name == "ghost"
    x, y = torch.randn(4, 5), torch.randint(0, 5, (4,))
    dp.compute(x, ce, y)
    assert dp.backend_name == "vmap"
    got = [p.grad.clone() for p in model.parameters()]
    _, ref, _ = VmapClipper(model).clipped_sum(x, ce, (y,), 1.0)
    for g, p in zip(got, model.parameters(), strict=True):
        torch.testing.assert_close(g, ref[p] / 4)


def _bag_batch(n, m, d):
    x = torch.randn(n, m, d + 1)
    x[..., -1] = (torch.rand(n, m) < 0.7).float()
    x[:, 0, -1] = 1.0  # every bag has at least one instance
    return x


@pytest.mark.parametrize("name,shape", [("vgg", (3, 16, 16)), ("resnet18", (3, 8, 8)), ("deepset", (6, 5))])
def test_vgg_resnet18_groupnorm_and_deepset_use_the_ghost_rules_and_match_opacus(name, shape):
    torch.manual_seed(2)
    model = build_model(name, shape, 4)
    ref_model = build_model(name, shape, 4)
    ref_model.load_state_dict(model.state_dict())
    x = _bag_batch(7, *shape[:1], shape[1] - 1) if name == "deepset" else torch.randn(7, *shape)
    y = torch.randint(0, 4, (7,))
    ref_sq, ref_sum = opacus_reference(ref_model, x, y, clip=0.5)
    clipper = make_clipper(model, "auto")
    assert isinstance(clipper, GhostClipper)  # GroupNorm has its own per-layer rule: no vmap fallback
    _, grads, sq = clipper.clipped_sum(x, ce, (y,), 0.5)
    clipper.close()
    torch.testing.assert_close(sq.sqrt(), ref_sq.sqrt(), rtol=1e-4, atol=1e-5)
    for p, ref_p in zip(model.parameters(), ref_model.parameters(), strict=True):
        torch.testing.assert_close(grads[p].flatten(), ref_sum[ref_p], rtol=1e-3, atol=1e-5)
