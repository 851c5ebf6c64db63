"""The DP-SGD recipe's training parts: the shared model's SGD with (Nesterov) momentum against the update rule
written out, the server's momentum step (FedAvgM) on the average of the uploads."""

import pytest
import torch

from silofl.site.dpsgd import DPSGDSettings, shared_optimizer
from silofl.training.server_opt import ServerMomentum, make_optimizer


def settings(**kw):
    base = dict(
        seed=0,
        batch_size=10,
        lr=0.1,
        weight_decay=0.01,
        private=True,
        noise_multiplier=1.0,
        clip=1.0,
        delta=1e-3,
        accountant="rdp",
        target_epsilon=None,
        dp_backend="auto",
    )
    return DPSGDSettings(**{**base, **kw})


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_momentum_and_nesterov_follow_the_update_rule(nesterov):
    lr, mu, wd = 0.1, 0.9, 0.01
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))
    opt = shared_optimizer(
        [w], settings(optimizer="sgd", momentum=mu, nesterov=nesterov, lr=lr, weight_decay=wd)
    )
    ref, buf = w.detach().clone(), None
    gen = torch.Generator().manual_seed(0)
    for _ in range(4):
        g = torch.randn(3, generator=gen)
        w.grad = g.clone()
        opt.step()
        d = g + wd * ref  # weight decay on the gradient, then heavy-ball momentum
        buf = d.clone() if buf is None else mu * buf + d
        ref = ref - lr * ((d + mu * buf) if nesterov else buf)
        torch.testing.assert_close(w.detach(), ref)


def test_adam_stays_the_default_optimizer():
    w = torch.nn.Parameter(torch.zeros(2))
    opt = shared_optimizer([w], settings())
    assert (
        type(opt) is torch.optim.Adam and opt.defaults["lr"] == 0.1 and opt.defaults["weight_decay"] == 0.01
    )


def test_server_momentum_steps_on_the_mean_update():
    class Opts:
        server_lr, server_momentum = 0.5, 0.9

    opt = make_optimizer("fedavgm", Opts())
    assert isinstance(opt, ServerMomentum)
    d1, d2 = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0])
    torch.testing.assert_close(opt.step(d1), 0.5 * d1)
    torch.testing.assert_close(opt.step(d2), 0.5 * (0.9 * d1 + d2))
    state = opt.state_dict()
    again = make_optimizer("fedavgm", Opts())
    again.load_state_dict(state)
    torch.testing.assert_close(again.step(d1), opt.step(d1))
