"""Augmentation multiplicity: an example's K views' gradients are averaged *before* clipping, so the clipped
per-example gradient is that of the mean loss over its views (sensitivity C). Both backends against a
reference computed by hand, one example at a time."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from silofl.privacy import DPGradient, NoiseSource
from silofl.privacy.grad_sample import GhostClipper, VmapClipper
from silofl.training.augment import AugMult


def ce(logits, y):
    return F.cross_entropy(logits, y, reduction="none")


def small_net():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 3, 3, padding=1),
        nn.GroupNorm(1, 3),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(3 * 6 * 6, 8),
        nn.ReLU(),
        nn.Linear(8, 4),
    )


def by_hand(model, x, y, views, clip):
    """Σ_i clip_C(∇ mean_v L(x_iv, y_i)) by a loop over examples, and each example's unclipped squared
    norm."""
    params = list(model.parameters())
    total = [torch.zeros_like(p) for p in params]
    sq = []
    for i in range(len(y)):
        xi = x[i * views : (i + 1) * views]
        loss = ce(model(xi), y[i].expand(views)).mean()
        g = torch.autograd.grad(loss, params)
        n2 = sum(gi.pow(2).sum() for gi in g)
        c = min(1.0, clip / (float(n2.sqrt()) + 1e-6))
        sq.append(float(n2))
        for t, gi in zip(total, g, strict=True):
            t += c * gi
    return total, torch.tensor(sq)


@pytest.mark.parametrize("clipper", [GhostClipper, VmapClipper])
def test_clipped_per_example_gradient_of_the_views_mean_equals_the_reference(clipper):
    model = small_net()
    B, K = 5, 3
    x, y = torch.randn(B * K, 1, 6, 6), torch.randint(0, 4, (B,))
    ref, ref_sq = by_hand(model, x, y, K, clip=1.0)
    clip = float(ref_sq.sqrt().median())  # some examples clipped, some not
    ref, _ = by_hand(model, x, y, K, clip=clip)
    _, grads, sq = clipper(model).clipped_sum(x, ce, (y,), clip, views=K)
    torch.testing.assert_close(sq, ref_sq.to(sq.dtype), rtol=1e-4, atol=1e-6)
    for p, r in zip(model.parameters(), ref, strict=True):
        torch.testing.assert_close(grads[p], r, rtol=1e-4, atol=1e-6)
    # not the same as clipping every view on its own (what averaging *after* clipping would give)
    _, per_view, _ = clipper(model).clipped_sum(x, ce, (y.repeat_interleave(K),), clip)
    assert not all(
        torch.allclose(per_view[p] / K, r, atol=1e-5) for p, r in zip(model.parameters(), ref, strict=True)
    )


def test_dp_gradient_with_views_is_the_clipped_sum_plus_noise_over_the_expected_batch():
    model = small_net()
    B, K = 4, 2
    x, y = torch.randn(B * K, 1, 6, 6), torch.randint(0, 4, (B,))
    ref, _ = by_hand(model, x, y, K, clip=0.1)
    dp = DPGradient(
        model, clip=0.1, noise_multiplier=1e-9, expected_batch_size=8.0, noise=NoiseSource(3), sample_rate=0.5
    )
    logits, st = dp.compute(x, ce, y, views=K)
    assert logits.shape == (B * K, 4) and st.batch_size == B and dp.take_run().steps == 1
    for p, r in zip(model.parameters(), ref, strict=True):
        torch.testing.assert_close(p.grad, r / 8.0, rtol=1e-4, atol=1e-7)


def test_augmult_views_are_crops_of_the_reflect_padded_image_and_flips_are_optional():
    x = torch.arange(2 * 1 * 5 * 5, dtype=torch.float32).view(2, 1, 5, 5)
    state = torch.random.get_rng_state()
    plain = AugMult(3, pad=0, flip=False, seed=1)(x)
    assert torch.equal(plain, x.repeat_interleave(3, 0))  # no padding, no flip: the image itself
    flipped = AugMult(16, pad=0, flip=True, seed=1)(x)
    for i, v in enumerate(flipped):
        assert torch.equal(v, x[i // 16]) or torch.equal(v, x[i // 16].flip(-1))
    assert any(not torch.equal(v, x[i // 16]) for i, v in enumerate(flipped))
    views = AugMult(8, pad=1, flip=False, seed=2)(x)
    assert views.shape == (16, 1, 5, 5)
    padded = F.pad(x, (1, 1, 1, 1), mode="reflect")
    for i, v in enumerate(views):
        crops = [padded[i // 8, :, a : a + 5, b : b + 5] for a in range(3) for b in range(3)]
        assert any(torch.equal(v, c) for c in crops)
    assert torch.equal(views, AugMult(8, pad=1, seed=2)(x))  # seeded: reproducible
    assert torch.equal(torch.random.get_rng_state(), state)  # the global generator is untouched
    assert AugMult(2, seed=0)(x[:0]).shape == (0, 1, 5, 5)
