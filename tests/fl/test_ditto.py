"""Ditto: the personal model's update is the mean cross-entropy gradient plus λ·(v − w^t), w^t the global
model the site received (not the one its DP round moved), by the personal model's own (non-DP) optimizer; the
accountant counts only the global model's DP steps."""

import torch
import torch.nn.functional as F

from silofl.comm.messages import Message, Packet
from silofl.comm.wire import encode
from silofl.fl.methods.ditto import DittoSite
from tests.fl.test_fedprox import SPEC, data, settings

SERVER = 3


def broadcast(site, rnd, state):
    pkt = Packet(SERVER, site.cid, encode(state, {"round": rnd, "src": SERVER, "global": True}))
    assert site.on_receive_global(Message({"round": rnd}, [pkt])).meta["rejected"] == []


def test_the_personal_model_steps_on_its_loss_plus_lambda_times_the_distance_to_the_received_global_model():
    x, y = data()
    lam, lr = 0.7, 0.01
    site = DittoSite(
        0,
        x,
        y,
        SPEC,
        settings(True, private_lr=lr),
        private_spec=SPEC,
        shared_field="global",
        ditto_lambda=lam,
    )
    w0 = {k: v + 0.01 for k, v in site.shared_state().items()}
    broadcast(site, 0, w0)  # before round 1: both models start from the server's initial model
    for k, v in site.private.state_dict().items():
        assert torch.equal(v, w0[k])
    ref = SPEC.build()
    ref.load_state_dict(w0)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=lr, weight_decay=0.0)

    def reference_round(anchor):
        for _ in range(3):  # q = 1: every step sees the full batch
            ref_opt.zero_grad()
            F.cross_entropy(ref(x), y).backward()
            with torch.no_grad():
                for name, p in ref.named_parameters():
                    p.grad += lam * (p - anchor[name])
            ref_opt.step()

    site.train(1)
    reference_round(w0)
    w1 = {k: v - 0.02 for k, v in site.shared_state().items()}  # what the server broadcasts after round 1
    broadcast(site, 1, w1)
    site.train(2)  # the DP round moves the global model before the personal round: the pull is towards w1
    reference_round(w1)
    for k, v in site.private.state_dict().items():
        torch.testing.assert_close(v, ref.state_dict()[k], rtol=1e-5, atol=1e-6)
    assert (
        site.accountant.steps == 6
    )  # the global model's 3 DP steps a round; the personal model's are no release
    assert site.metric_label("private_acc") == "non-private" and site.metric_label("global_acc") == "dp"
    assert set(site.final_models()) == {"global", "private"}
