"""Hostile models from another site or the server: each refused before it touches any local model, logged,
with the site's models and the run intact (finding 7 of the hardening issue, and more)."""

import torch

from silofl.comm.messages import Message, Packet
from silofl.comm.wire import encode
from silofl.fl.exchange.centralized import WEIGHT_KEY
from silofl.fl.exchange.gossip import PUSHSUM_KEY
from tests.helpers import build_run


def proxy_message(site, rnd, src, weight=1.0, scale=None, fill=None, meta_src=None, **overrides):
    state = {k: v.clone() for k, v in site.shared.state_dict().items()}
    for k, v in state.items():
        if scale is not None:
            state[k] = v * scale
        if fill is not None:
            state[k] = torch.full_like(v, fill)
    state.update(overrides)
    state[PUSHSUM_KEY] = torch.tensor(weight, dtype=torch.float64)
    return Packet(
        src, site.cid, encode(state, meta={"round": rnd, "src": src if meta_src is None else meta_src})
    )


def snapshot(site):
    return {k: v.clone() for k, v in {**site.shared.state_dict(), **site.private.state_dict()}.items()}


def unchanged(site, before):
    now = {**site.shared.state_dict(), **site.private.state_dict()}
    return all(torch.equal(now[k], v) for k, v in before.items())


def test_a_pushsum_weight_of_1e300_is_refused_even_at_self_weight_half(tiny_cfg, caplog):
    b = build_run(tiny_cfg.replace(self_weight=0.5))
    site = b.sites[0]
    site.outgoing(1, [1])
    before, w = snapshot(site), site.pushsum_weight
    rejected = site.incoming(1, [proxy_message(b.sites[2], 1, 2, weight=1e300)])
    assert len(rejected) == 1 and "exceeds the total weight" in rejected[0]["reason"]
    assert unchanged(site, before) and site.pushsum_weight == w * 0.5  # it kept its own share only
    assert "rejected the model from node 2" in caplog.text


def test_finite_but_huge_weights_never_reach_the_private_model(tiny_cfg):
    """A proxy of finite 3e38 values turned 88,213 of 93,610 private-model parameters into NaN before."""
    b = build_run(tiny_cfg)
    site = b.sites[0]
    rejected = site.incoming(1, [proxy_message(b.sites[2], 1, 2, fill=3e38)])
    assert "exceed the bound" in rejected[0]["reason"]
    site.train(2)  # the private model distils from the (own) proxy: still finite
    assert all(torch.isfinite(p).all() for p in site.private.parameters())


def test_weights_that_pass_every_bound_but_blow_up_the_outputs_are_refused_by_the_probe(tiny_cfg):
    b = build_run(tiny_cfg)
    site = b.sites[0]
    before = snapshot(site)
    rejected = site.incoming(1, [proxy_message(b.sites[2], 1, 2, scale=1e5)])  # |w| ≤ 1e6, logits far beyond
    assert "probe batch" in rejected[0]["reason"] and unchanged(site, before)


def test_nan_replayed_and_forged_messages_are_refused(tiny_cfg):
    b = build_run(tiny_cfg)
    site, peer = b.sites[0], b.sites[2]
    before = snapshot(site)
    msgs = [
        proxy_message(peer, 1, 2, fill=float("nan")),  # NaN weights
        proxy_message(peer, 0, 2),  # an earlier round's message, replayed
        proxy_message(peer, 1, 2, meta_src=3),  # claims to come from site 3
        Packet(2, 0, b"\xff" * 64),
    ]  # not a model at all
    reasons = [r["reason"] for r in site.incoming(1, msgs)]
    assert "non-finite" in reasons[0] and "round is 0" in reasons[1] and "src is 3" in reasons[2]
    assert "not valid safetensors" in reasons[3]
    assert unchanged(site, before)


def test_the_coordinator_routes_only_what_a_site_may_send(tiny_cfg):
    """A site whose reply carries a packet claiming another sender, or addressed to a site that is not its
    neighbour this round, gets nothing delivered."""
    b = build_run(tiny_cfg)
    real = b.engine.call
    delivered = []

    def tampering(step, requests):
        replies = real(step, requests)
        if step == "train_send":
            evil = replies[1].packets[0]
            replies[1].packets += [
                Packet(3, 0, evil.data),
                Packet(1, 2, evil.data),
            ]  # forged sender; not its neighbour
        if step == "receive":
            delivered.extend((p.src, k) for k, m in requests.items() for p in m.packets)
        return replies

    b.engine.call = tampering
    ev = b.coordinator.run_round(1)  # round 1: hop 2 on 4 sites, so 1 → 3 only
    b.coordinator.flush()  # the deliveries go with each site's next request: now
    assert sorted(delivered) == [(0, 2), (1, 3), (2, 0), (3, 1)]
    assert sorted(r["reason"] for r in ev.rejected) == [
        "site 1 may not send to node 2 in round 1",
        "site 1 sent a packet as node 3",
    ]


def test_the_server_refuses_an_upload_claiming_another_weight(tiny_cfg):
    b = build_run(tiny_cfg.replace(method="fedavg"))
    srv = b.coordinator.server
    good = {k: v.clone() for k, v in b.sites[0].shared_state().items()}
    ups = [
        Packet(
            k,
            4,
            encode({**good, WEIGHT_KEY: torch.tensor(w, dtype=torch.float64)}, meta={"round": 1, "src": k}),
        )
        for k, w in ((0, 120.0), (1, 1e9))
    ]
    rejected = srv.aggregate(1, ups, {0: 120.0, 1: 120.0})
    assert [r["src"] for r in rejected] == [1] and "aggregation weight" in rejected[0]["reason"]


def test_a_hostile_broadcast_is_refused_and_the_site_keeps_its_model(tiny_cfg):
    b = build_run(tiny_cfg.replace(method="fedavg"))
    site = b.sites[1]
    before = {k: v.clone() for k, v in site.shared_state().items()}
    bad = {k: torch.full_like(v, 3e38) for k, v in before.items()}
    reply = site.handle(
        "receive_global", Message({"round": 1}, [Packet(4, 1, encode(bad, meta={"round": 1, "src": 4}))])
    )
    assert "exceed the bound" in reply.meta["rejected"][0]["reason"]
    assert all(torch.equal(site.shared_state()[k], v) for k, v in before.items())
