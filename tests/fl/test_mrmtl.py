"""MR-MTL: a site keeps its own DP model; the server's mean is only the target of the pull λ·(w − w̄) added to
the DP gradient."""

import torch
import torch.nn.functional as F

from silofl.comm.wire import encode
from silofl.fl.methods.mrmtl import MeanRegularisedSite
from tests.fl.test_ditto import broadcast
from tests.fl.test_fedprox import SPEC, data, settings


def hand_sgd(start, anchor, x, y, lam, lr, steps):
    ref = SPEC.build()
    ref.load_state_dict(start)
    for _ in range(steps):
        ref.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        with torch.no_grad():
            for k, p in ref.named_parameters():
                p -= lr * (p.grad + lam * (p - anchor[k]))
    return ref.state_dict()


def test_a_site_keeps_its_model_and_is_pulled_towards_the_mean_it_received():
    x, y = data()
    site = MeanRegularisedSite(0, x, y, SPEC, settings(True), shared_field="private", mrmtl_lambda=2.0)
    w0 = {k: v + 0.01 for k, v in site.shared_state().items()}
    broadcast(site, 0, w0)  # before round 1: every site starts from the server's initial model
    assert all(torch.equal(site.shared_state()[k], w0[k]) for k in w0)
    site.train(1)
    w1 = site.shared_state()
    torch.testing.assert_close(w1, hand_sgd(w0, w0, x, y, 2.0, 0.1, 3), rtol=1e-5, atol=1e-6)
    mean = {k: v * 0.5 for k, v in w1.items()}
    broadcast(site, 1, mean)
    assert all(torch.equal(site.shared_state()[k], w1[k]) for k in w1)  # the mean is not loaded
    site.train(2)
    torch.testing.assert_close(
        site.shared_state(), hand_sgd(w1, mean, x, y, 2.0, 0.1, 3), rtol=1e-5, atol=1e-6
    )
    assert site.accountant.steps == 6 and site.metric_label("private_acc") == "dp"
    # a corrupt mean is refused and the target stays
    from silofl.comm.messages import Message, Packet

    bad = {k: torch.full_like(v, float("nan")) for k, v in mean.items()}
    r = site.on_receive_global(Message({"round": 2}, [Packet(3, 0, encode(bad, {"round": 2, "src": 3}))]))
    assert len(r.meta["rejected"]) == 1 and all(torch.equal(site.target[k], mean[k]) for k in mean)
