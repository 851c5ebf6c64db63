"""Several steps in one message (silofl.comm.batch): framing, the checks on what a site receives, and the
coordinator deferring a round's deliveries to the site's next request."""

import pytest
import torch

from silofl.comm import batch
from silofl.comm.messages import Message, Packet, pack, unpack
from silofl.core.errors import PeerModelRejected
from silofl.site.base import Site


def parts():
    return [
        ("receive", Message({"round": 1}, [Packet(1, 0, b"a"), Packet(2, 0, b"b")])),
        ("train_send", Message({"round": 2, "to": [3]})),
    ]


def test_a_batch_keeps_its_parts_and_their_packets_in_order_through_the_wire():
    m = batch.make(parts())
    step, got = unpack(pack(batch.BATCH, {0: m}))
    back = batch.split(got[0])
    assert step == batch.BATCH and [s for s, _ in back] == ["receive", "train_send"]
    assert [p.data for p in back[0][1].packets] == [b"a", b"b"] and back[1][1].packets == []
    assert back[1][1].meta == {"round": 2, "to": [3]}
    r = batch.reply([Message({"rejected": []}), Message({"x": 1}, [Packet(0, 3, b"c")])])
    a, b = batch.split_reply(r, 2)
    assert a.meta == {"rejected": []} and b.packets[0].data == b"c"
    with pytest.raises(PeerModelRejected):
        batch.split_reply(r, 3)


@pytest.mark.parametrize(
    "meta,packets",
    [
        ({"parts": []}, 0),
        ({"parts": [{"step": "receive", "meta": {}, "packets": 0}] * 9}, 0),  # more than MAX_PARTS
        ({"parts": [{"step": "batch", "meta": {}, "packets": 0}]}, 0),  # a batch inside a batch
        ({"parts": [{"step": "../x", "meta": {}, "packets": 0}]}, 0),
        ({"parts": [{"step": "receive", "meta": {}, "packets": 1}]}, 2),  # packets that do not add up
        ({"parts": [{"step": "receive", "meta": {}, "packets": 3}]}, 2),
        ({"parts": [{"step": "receive", "meta": {}, "packets": True}]}, 1),
        ({"parts": [{"step": "receive", "meta": [], "packets": 0}]}, 0),
        ({"parts": [{"step": "receive", "meta": {}, "packets": 0, "extra": 1}]}, 0),
        ({"parts": "receive"}, 0),
    ],
)
def test_a_malformed_batch_is_refused(meta, packets):
    with pytest.raises(PeerModelRejected):
        batch.split(Message(meta, [Packet(1, 0, b"x")] * packets))


def test_a_site_runs_a_batchs_parts_in_order():
    seen = []

    class Fake:
        def handle(self, step, msg):
            seen.append((step, msg.meta["round"], len(msg.packets)))
            return Message({"step": step}, [Packet(0, 9, step.encode())] if step == "train_send" else [])

    r = Site.on_batch(Fake(), batch.make(parts()))
    assert seen == [("receive", 1, 2), ("train_send", 2, 0)]
    a, b = batch.split_reply(r, 2)
    assert a.meta == {"step": "receive"} and b.packets[0].data == b"train_send"


def test_phases_run_every_sites_last_part_together():
    reqs = {0: batch.make(parts()), 1: batch.make(parts()[1:])}
    ph = batch.phases(reqs)
    assert [(s, idx) for s, idx, _ in ph] == [("receive", {0: 0}), ("train_send", {0: 1, 1: 0})]


def test_a_gossip_site_takes_back_the_mass_of_every_round_a_lost_node_did_not_answer(tiny_cfg):
    from tests.helpers import build_run

    c = build_run(tiny_cfg.replace(method="proxyfl", clients=3)).sites[0]
    c.outgoing(1, [2])  # all of its weight (self weight 0) goes to node 2 in round 1 ...
    c.pushsum_weight = 0.5  # ... it received half a site's weight back
    c.outgoing(
        2, [2]
    )  # and again in round 2: node 2 is then lost, having answered neither round's deliveries
    c.pushsum_weight = 0.25
    c.reclaim({2}, 3, since={2: 1})
    assert c.pushsum_weight == pytest.approx(0.25 + 1.0 + 0.5)
    c.reclaim({2}, 3, since={2: 1})  # taken back once only
    assert c.pushsum_weight == pytest.approx(1.75)


def test_without_since_only_the_last_send_is_taken_back(tiny_cfg):
    from tests.helpers import build_run

    c = build_run(tiny_cfg.replace(method="proxyfl", clients=3)).sites[0]
    c.outgoing(1, [2])
    c.pushsum_weight = 0.5
    c.outgoing(2, [2])
    c.pushsum_weight = 0.0 + 1e-9
    c.reclaim({2}, 3)
    assert c.pushsum_weight == pytest.approx(0.5, abs=1e-6)
    assert torch.isfinite(next(iter(c.shared.parameters()))).all()
