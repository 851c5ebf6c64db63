"""SCAFFOLD with DP gradients: corrected steps g̃ − c_i + c, c_i⁺ = the mean of the round's DP gradients, and
the server's c ← c + (|S|/N)·mean(Δc_i) — against a hand computation."""

from types import SimpleNamespace

import torch
import torch.nn.functional as F

from silofl.comm.messages import Message, Packet
from silofl.comm.wire import decode, encode
from silofl.fl.exchange.centralized import WEIGHT_KEY
from silofl.fl.methods.scaffold import CV, ScaffoldSite
from silofl.runner.config import RunConfig
from tests.fl.test_fedprox import SPEC, data, settings


def test_local_steps_are_corrected_and_the_new_control_variate_is_the_mean_dp_gradient():
    x, y = data()
    site = ScaffoldSite(0, x, y, SPEC, settings(True), shared_field="global")
    g = torch.Generator().manual_seed(2)
    c, ci = ({n: 0.1 * torch.randn(v.shape, generator=g) for n, v in site.c_local.items()} for _ in range(2))
    w0 = site.shared_state()
    bcast = {**w0, **{CV + n: v for n, v in c.items()}}
    r = site.on_receive_global(Message({"round": 0}, [Packet(3, 0, encode(bcast, {"round": 0, "src": 3}))]))
    assert r.meta["rejected"] == [] and all(torch.equal(site.c_global[n], c[n]) for n in c)
    site.c_local = {n: v.clone() for n, v in ci.items()}
    site.train(1)
    ref = SPEC.build()
    ref.load_state_dict(w0)
    grads = []
    for _ in range(3):  # σ ≈ 0, q = 1, a clip no gradient reaches: the DP gradient is the mean gradient
        ref.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        grads.append({n: p.grad.clone() for n, p in ref.named_parameters()})
        with torch.no_grad():
            for n, p in ref.named_parameters():
                p -= 0.1 * (p.grad - ci[n] + c[n])
    torch.testing.assert_close(site.shared_state(), ref.state_dict(), rtol=1e-5, atol=1e-6)
    for n in ci:
        mean = sum(gr[n] for gr in grads) / 3
        torch.testing.assert_close(site.c_local[n], mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(site.c_delta[n], mean - ci[n], rtol=1e-5, atol=1e-6)
    sent, _ = decode(site.payload(1))
    assert all(torch.equal(sent[CV + n], site.c_delta[n]) for n in ci) and site.accountant.steps == 3


def test_the_server_moves_c_by_the_share_of_sites_times_the_mean_delta():
    cfg = RunConfig.from_dict(
        {"method": "scaffold", "clients": 3, "proxy_model": "logreg", "seed": 0}
    ).resolve()
    server = (
        cfg.info.cls(cfg)
        .make_coordinator(3, SimpleNamespace(input_shape=(1, 8, 8), num_classes=10), torch.device("cpu"))
        .server
    )
    model = {k: v.clone() for k, v in server.model.state_dict().items()}
    c0 = {n: torch.full_like(v, 0.5) for n, v in server.c.items()}
    server.c = {n: v.clone() for n, v in c0.items()}
    ups = [
        ({**model, **{CV + n: torch.full_like(v, d) for n, v in c0.items()}}, w)
        for d, w in ((1.0, 1.0), (4.0, 3.0))
    ]
    packets = [
        Packet(k, 3, encode({**u, WEIGHT_KEY: torch.tensor(w, dtype=torch.float64)}, {"round": 1, "src": k}))
        for k, (u, w) in enumerate(ups)
    ]
    assert server.aggregate(1, packets, {0: 1.0, 1: 3.0}) == []
    for n, v in server.c.items():  # 2 of 3 sites; weighted mean Δc = (1·1 + 3·4) / 4 = 3.25
        torch.testing.assert_close(v, c0[n] + (2 / 3) * 3.25)
    assert all(torch.equal(server.model.state_dict()[k], model[k]) for k in model)
    assert set(decode(server.payload(1))[0]) == set(model) | {CV + n for n in c0}
