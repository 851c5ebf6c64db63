"""FedProx: the local gradient is the data term's (DP) gradient plus μ·(w − w_global), w_global the model
received."""

import pytest
import torch
import torch.nn.functional as F

from silofl.fl.methods.fedprox import ProxSite, proximal_hook
from silofl.models import ModelSpec
from silofl.site.dpsgd import DPSGDSettings

SPEC = ModelSpec("logreg", (1, 8, 8), 10)


def settings(private: bool, **kw) -> DPSGDSettings:
    base = dict(
        seed=0,
        batch_size=24,
        lr=0.1,
        weight_decay=0.0,
        private=private,
        noise_multiplier=1e-12,
        clip=1e4,
        delta=1e-3,
        accountant="rdp",
        target_epsilon=None,
        dp_backend="auto",
        optimizer="sgd",
        sample_rate=1.0,
        local_steps=3,
    )
    return DPSGDSettings(**{**base, **kw})


def data(n=24):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)


def hand_fedprox(w0: dict, x, y, mu: float, lr: float, steps: int) -> dict:
    """Plain SGD on mean CE + μ/2·‖w − w0‖², full batch, computed on a fresh model (the reference)."""
    ref = SPEC.build()
    ref.load_state_dict(w0)
    anchor = {k: v.detach().clone() for k, v in ref.named_parameters()}
    for _ in range(steps):
        ref.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        with torch.no_grad():
            for k, p in ref.named_parameters():
                p -= lr * (p.grad + mu * (p - anchor[k]))
    return ref.state_dict()


@pytest.mark.parametrize("private", [False, True])
def test_fedprox_steps_on_the_data_gradient_plus_mu_times_the_distance_to_the_received_model(private):
    x, y = data()
    site = ProxSite(0, x, y, SPEC, settings(private), shared_field="global", mu=0.5)
    w0 = {k: v + 0.05 for k, v in site.shared_state().items()}  # "the server's broadcast"
    site.replace_shared(w0)
    site.train(1)
    # under DP with σ ≈ 0 (1e-12), a clip no gradient reaches and q = 1 the DP gradient is the mean gradient:
    # the same path
    expect = hand_fedprox(w0, x, y, mu=0.5, lr=0.1, steps=3)
    for k, v in site.shared.state_dict().items():
        torch.testing.assert_close(v, expect[k], rtol=1e-5, atol=1e-6)
    if private:
        assert (
            site.accountant.steps == 3
        )  # the mechanism that ran fed the accountant: 3 DP steps, nothing else
    # μ = 0 is FedAvg's step, which differs
    plain = hand_fedprox(w0, x, y, mu=0.0, lr=0.1, steps=3)
    assert any(not torch.allclose(plain[k], expect[k]) for k in expect)


def test_the_proximal_hook_adds_mu_times_the_distance_to_whatever_gradient_is_there():
    lin = torch.nn.Linear(3, 2)
    anchor = [p.detach().clone() - 1.0 for p in lin.parameters()]
    noisy = [torch.randn_like(p) for p in lin.parameters()]
    for p, g in zip(lin.parameters(), noisy, strict=True):
        p.grad = g.clone()
    proximal_hook(list(lin.parameters()), anchor, 0.25)()
    for p, g in zip(lin.parameters(), noisy, strict=True):
        torch.testing.assert_close(p.grad, g + 0.25 * torch.ones_like(g))  # w − anchor = 1 everywhere


def test_the_new_flags_reach_their_method_and_are_refused_elsewhere_with_one_line(tmp_path):
    from typer.testing import CliRunner

    from silofl.cli.main import app

    for flags, message in (
        (["--method", "fedavg", "--mu", "0.1"], "option mu does not apply to method 'fedavg'"),
        (["--method", "fedprox", "--mu", "-1"], "mu must be a finite non-negative number"),
        (["--method", "ditto", "--mrmtl-lambda", "2"], "option mrmtl_lambda does not apply"),
        (["--method", "mr-mtl", "--ditto-lambda", "0.5"], "option ditto_lambda does not apply"),
    ):
        r = CliRunner().invoke(
            app, ["run", *flags, "--dataset", "digits", "--rounds", "1", "--out", str(tmp_path / "o")]
        )
        assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output, r.output
        assert not (tmp_path / "o").exists()
