"""FedRep: each round the head's DP steps first (body fixed), then the body's (head fixed), under one DP
mechanism whose accountant counts every step; only the body is sent — against a hand computation."""

import pytest
import torch
import torch.nn.functional as F

from silofl.comm.wire import decode
from silofl.fl.methods.fedper import body_keys
from silofl.fl.methods.fedrep import RepresentationSite, head_steps
from silofl.models import ModelSpec
from tests.fl.test_fedprox import data, settings

MLP = ModelSpec("mlp", (1, 8, 8), 10)
HEAD = ("out.weight", "out.bias")


def test_the_head_phase_takes_its_share_of_the_round_and_the_body_always_trains():
    assert [head_steps(k, 0.5) for k in (1, 2, 3, 4, 5)] == [0, 1, 2, 2, 3]
    assert head_steps(10, 0.0) == 0 and head_steps(10, 0.95) == 9 and head_steps(4, 0.25) == 1


@pytest.mark.parametrize("private", [False, True])
def test_the_head_trains_first_then_the_body_and_the_accountant_counts_every_step(private):
    x, y = data()
    body = body_keys(MLP)
    lr = 0.1
    site = RepresentationSite(
        0,
        x,
        y,
        MLP,
        settings(private, lr=lr, local_steps=5),
        shared_field="private",
        shared_keys=body,
        head_share=0.4,
    )
    ref = MLP.build()
    ref.load_state_dict(site.shared_state())
    site.train(1)
    assert site.phases == ["head", "head", "body", "body", "body"]
    # σ ≈ 0, a clip no gradient reaches, q = 1: each DP step is the full-batch mean gradient, SGD
    for phase in site.phases:
        ref.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        with torch.no_grad():
            for n, p in ref.named_parameters():
                if (n in HEAD) == (phase == "head"):
                    p -= lr * p.grad
    torch.testing.assert_close(site.shared_state(), ref.state_dict(), rtol=1e-5, atol=1e-6)
    if private:
        assert site.accountant.steps == 5  # the head's 2 DP steps and the body's 3: one mechanism
    assert set(decode(site.payload(1))[0]) == set(body)  # the head never leaves


def test_a_model_that_is_all_head_is_refused_before_any_data_is_read():
    from silofl.core.errors import ConfigError
    from silofl.runner.config import RunConfig

    with pytest.raises(ConfigError, match="'logreg' has a single layer"):
        RunConfig.from_dict({"method": "fedrep", "proxy_model": "logreg"}).resolve()
    assert RunConfig.from_dict({"method": "fedrep", "proxy_model": "cnn-gn"}).resolve().method == "fedrep"


@pytest.mark.parametrize("backend", ["ghost", "vmap"])
def test_a_head_step_clips_the_heads_gradient_alone_and_releases_nothing_of_the_body(backend):
    """DPGradient.only (FedRep's phases): each example's gradient of the head alone is clipped to C — its
    body part neither shrinks it nor is released — checked against per-example gradients by hand."""
    from torch.func import functional_call, grad, vmap

    from silofl.privacy import DPGradient, NoiseSource

    torch.manual_seed(0)
    model = MLP.build()
    x, y = torch.randn(12, 1, 8, 8), torch.randint(0, 10, (12,))
    head = [model.out.weight, model.out.bias]
    clip = 0.05  # below every example's head-gradient norm: every example is clipped
    dp = DPGradient(model, clip, 0.0, 12.0, NoiseSource(0), backend=backend, sample_rate=1.0)
    dp.only = head

    def loss(out, t):
        return F.cross_entropy(out, t, reduction="none")

    dp.compute(x, loss, y)
    assert dp.backend_name == backend
    params = {n: p.detach() for n, p in model.named_parameters() if n in HEAD}

    def one(prm, xi, ti):
        return loss(functional_call(model, prm, (xi.unsqueeze(0),)), ti.unsqueeze(0)).sum()

    per = vmap(grad(one), in_dims=(None, 0, 0))(params, x, y)
    norms = torch.sqrt(sum(g.reshape(12, -1).pow(2).sum(1) for g in per.values()))
    assert bool((norms > clip).all())
    factor = (clip / (norms + 1e-6)).clamp(max=1.0)
    for n, p in model.named_parameters():
        if n in HEAD:
            want = torch.einsum("b,b...->...", factor, per[n]) / 12.0
            torch.testing.assert_close(p.grad, want, rtol=1e-4, atol=1e-7)
        else:
            assert p.grad is None  # the body's gradient is not released
    # the released vector's sensitivity is C: every clipped example's contribution has norm C (= the clip)
    clipped = torch.sqrt(sum((factor[:, None] * g.reshape(12, -1)).pow(2).sum(1) for g in per.values()))
    torch.testing.assert_close(clipped, torch.full((12,), clip), rtol=1e-4, atol=1e-6)
    dp.only = None  # the whole model again: the body's gradient is back
    dp.compute(x, loss, y)
    assert all(p.grad is not None for p in model.parameters())
    assert dp.take_run().steps == 2  # both steps counted by the one mechanism
