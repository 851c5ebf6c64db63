"""APFL: the mixture α·v + (1 − α)·w, α's gradient ⟨softmax(m) − onehot(y), v(x) − w(x)⟩ and the local
model's step against a hand computation; only the global model's DP steps are counted; the mixture is
exported as one model whose class probabilities are the mixture's."""

import json

import pytest
import torch
import torch.nn.functional as F

from silofl.comm.messages import Message, Packet
from silofl.comm.wire import encode
from silofl.core.errors import ConfigError
from silofl.fl.methods.apfl import APFLMixture, APFLSite, mixture_step
from silofl.inference.pipeline import load_combined
from silofl.models import save_model
from silofl.runner.config import RunConfig
from tests.fl.test_fedprox import SPEC, data, settings


def test_alphas_gradient_and_the_local_step_follow_the_mixtures_cross_entropy():
    x, y = data()
    torch.manual_seed(3)
    v, w = SPEC.build(), SPEC.build()
    mix = APFLMixture(v, w, 0.3)
    ref_v = SPEC.build()
    ref_v.load_state_dict(v.state_dict())
    w_before = {k: t.clone() for k, t in w.state_dict().items()}
    opt = torch.optim.SGD(v.parameters(), lr=0.5)
    with torch.no_grad():
        lv, lw = v(x), w(x)
        m = 0.3 * lv + 0.7 * lw
        expect = float(((torch.softmax(m, 1) - F.one_hot(y, 10).float()) * (lv - lw)).sum(1).mean())
        torch.testing.assert_close(mix(x), m)
    d_alpha = mixture_step(mix, opt, x, y, alpha_lr=0.2)
    assert d_alpha == pytest.approx(expect, rel=1e-5)
    assert float(mix.alpha.detach()) == pytest.approx(min(1.0, max(0.0, 0.3 - 0.2 * expect)), rel=1e-6)
    # the local model: one SGD step on the mixture's loss, ∂L/∂v = α·∂CE/∂m·∂v/∂v; the global model untouched
    F.cross_entropy(0.3 * ref_v(x) + 0.7 * lw, y).backward()
    with torch.no_grad():
        for p in ref_v.parameters():
            p -= 0.5 * p.grad
    torch.testing.assert_close(v.state_dict(), ref_v.state_dict())
    assert all(torch.equal(w.state_dict()[k], w_before[k]) for k in w_before)
    mixture_step(mix, opt, x, y, alpha_lr=1e6)  # a huge step is projected back into [0, 1]
    assert float(mix.alpha.detach()) in (0.0, 1.0)


def test_a_site_round_mixes_against_the_global_model_it_holds_and_counts_only_the_global_steps():
    x, y = data()
    site = APFLSite(
        0,
        x,
        y,
        SPEC,
        settings(True, private_lr=0.01),
        private_spec=SPEC,
        shared_field="global",
        alpha=0.5,
        alpha_lr=0.05,
    )
    w0 = {k: t + 0.01 for k, t in site.shared_state().items()}
    pkt = Packet(3, 0, encode(w0, {"round": 0, "src": 3, "global": True}))
    assert site.on_receive_global(Message({"round": 0}, [pkt])).meta["rejected"] == []
    assert all(torch.equal(site.private.state_dict()[k], w0[k]) for k in w0)  # v starts from the global model
    ref_v, ref_w = SPEC.build(), SPEC.build()
    ref_v.load_state_dict(w0)
    ref_w.load_state_dict(w0)
    ref = APFLMixture(ref_v, ref_w, 0.5)
    ref_opt = torch.optim.Adam(ref_v.parameters(), lr=0.01, weight_decay=0.0)
    for _ in range(3):  # q = 1: the full batch, against w0 (the global model held before the DP round)
        mixture_step(ref, ref_opt, x, y, 0.05)
    site.train(1)
    torch.testing.assert_close(site.private.state_dict(), ref_v.state_dict(), rtol=1e-5, atol=1e-6)
    assert site.mix_weight == pytest.approx(float(ref.alpha.detach()), rel=1e-5)
    assert site.accountant.steps == 3  # the global model's DP steps; v's and α's are no release
    assert site.metric_label("global_acc") == "dp"
    assert {site.metric_label(k) for k in ("combined_acc", "private_acc", "apfl_alpha")} == {"non-private"}
    out = site.evaluate(x, y)
    with torch.no_grad():
        acc = float((site.mixture(x).argmax(1) == y).float().mean())
    assert out["combined_acc"] == pytest.approx(acc) and {"private_acc", "global_acc"} <= set(out)
    assert site.extra_metrics() == {"apfl_alpha": site.mix_weight}


def test_the_exported_mixture_gives_the_mixtures_class_probabilities(tmp_path):
    x, y = data()
    site = APFLSite(0, x, y, SPEC, settings(False), private_spec=SPEC, shared_field="global", alpha=0.3)
    site.private.load_state_dict({k: v * 3 for k, v in site.private.state_dict().items()})
    for role, (model, spec) in site.final_models().items():
        save_model(model, spec, tmp_path / f"client0_{role}")
    assert site.save_mixture(tmp_path) == f"{tmp_path.name}/client0_combined.safetensors"
    meta = json.loads((tmp_path / "client0_combined.json").read_text())
    assert meta["parts"] == ["private", "global"] and meta["alpha"] == pytest.approx(0.3)
    assert meta["privacy"] == "non-private"
    loaded, spec = load_combined(tmp_path, 0)
    with torch.no_grad():
        torch.testing.assert_close(torch.softmax(loaded(x), 1), torch.softmax(site.mixture(x), 1))


def test_apfl_options_are_checked_and_combine_is_refused():
    for bad, msg in (
        ({"apfl_alpha": 1.5}, "apfl_alpha must lie in"),
        ({"apfl_alpha_lr": -1}, "apfl_alpha_lr must be"),
        ({"combine": "weights"}, "--combine does not apply"),
    ):
        with pytest.raises(ConfigError, match=msg):
            RunConfig.from_dict({"method": "apfl", **bad}).resolve()
