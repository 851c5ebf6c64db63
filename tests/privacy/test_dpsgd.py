"""DP-SGD gradient: noise scale σC/B_expected, sum of clipped gradients, Poisson sampling."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from silofl.privacy import DPGradient, NoiseSource, poisson_batch
from silofl.privacy.grad_sample import VmapClipper


def ce(logits, y):
    return F.cross_entropy(logits, y, reduction="none")


def big_linear():
    torch.manual_seed(0)
    return nn.Linear(400, 100)  # 40,100 parameters: enough samples for a tight std estimate


@pytest.mark.parametrize("sigma,clip,expected_b", [(1.0, 1.0, 250.0), (0.7, 2.5, 40.0)])
def test_empty_batch_gives_noise_only_with_std_sigma_c_over_expected_batch(sigma, clip, expected_b):
    model = big_linear()
    dp = DPGradient(
        model,
        clip=clip,
        noise_multiplier=sigma,
        expected_batch_size=expected_b,
        noise=NoiseSource(7),
        sample_rate=0.25,
    )
    dp.compute(torch.zeros(0, 400), ce, torch.zeros(0, dtype=torch.long))
    g = torch.cat([p.grad.flatten() for p in model.parameters()])
    target = sigma * clip / expected_b
    assert abs(g.mean().item()) < 4 * target / g.numel() ** 0.5
    assert g.std().item() == pytest.approx(target, rel=0.03)


def test_gradient_is_clipped_sum_plus_noise_over_expected_batch():
    model = big_linear()
    x, y = torch.randn(32, 400) * 3, torch.randint(0, 100, (32,))
    _, ref, _ = VmapClipper(model).clipped_sum(x, ce, (y,), 0.5)
    dp = DPGradient(
        model,
        clip=0.5,
        noise_multiplier=1.3,
        expected_batch_size=50.0,
        noise=NoiseSource(11),
        sample_rate=0.5,
    )
    dp.compute(x, ce, y)
    resid = torch.cat([(p.grad - ref[p] / 50.0).flatten() for p in model.parameters()])
    assert resid.std().item() == pytest.approx(1.3 * 0.5 / 50.0, rel=0.03)
    # the same seed reproduces the same noise exactly
    grads = [p.grad.clone() for p in model.parameters()]
    dp2 = DPGradient(
        model,
        clip=0.5,
        noise_multiplier=1.3,
        expected_batch_size=50.0,
        noise=NoiseSource(11),
        sample_rate=0.5,
    )
    dp2.compute(x, ce, y)
    for g, p in zip(grads, model.parameters(), strict=True):
        assert torch.equal(g, p.grad)


def test_secure_noise_has_the_right_scale_and_is_not_seeded():
    a = NoiseSource().normal((200_000,), std=2.0)
    b = NoiseSource().normal((200_000,), std=2.0)
    assert a.std().item() == pytest.approx(2.0, rel=0.01)
    assert abs(a.mean().item()) < 0.02
    assert not torch.equal(a, b)


def test_poisson_sampling_rate_and_independence():
    g = torch.Generator().manual_seed(0)
    sizes = torch.tensor([len(poisson_batch(1000, 0.25, g)) for _ in range(400)], dtype=torch.float)
    assert sizes.mean().item() == pytest.approx(250, rel=0.01)
    assert sizes.std().item() == pytest.approx((1000 * 0.25 * 0.75) ** 0.5, rel=0.15)
    g = torch.Generator().manual_seed(0)
    assert any(len(poisson_batch(10, 0.05, g)) == 0 for _ in range(100))  # empty batches happen
