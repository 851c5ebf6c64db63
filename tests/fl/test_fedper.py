"""FedPer: only the body crosses (site → server → site); each site's head stays; the server averages
bodies."""

from types import SimpleNamespace

import pytest
import torch

from silofl.comm.messages import Message, Packet
from silofl.comm.wire import decode, encode
from silofl.core.errors import ConfigError
from silofl.fl.exchange.centralized import WEIGHT_KEY
from silofl.fl.methods.fedper import PersonalHeadSite, body_keys, head_keys
from silofl.models import ModelSpec
from silofl.runner.config import RunConfig
from tests.fl.test_fedprox import data, settings

MLP = ModelSpec("mlp", (1, 8, 8), 10)


def test_the_head_is_the_last_layer_and_a_single_layer_model_is_refused():
    assert head_keys(MLP.build()) == ("out.weight", "out.bias")
    assert set(body_keys(MLP)) == {"hidden.0.weight", "hidden.0.bias", "hidden.1.weight", "hidden.1.bias"}
    with pytest.raises(ConfigError, match="single layer"):
        body_keys(ModelSpec("logreg", (1, 8, 8), 10))


def test_only_the_body_leaves_the_site_and_a_received_body_keeps_the_sites_head():
    x, y = data()
    body = body_keys(MLP)
    site = PersonalHeadSite(
        0, x, y, MLP, settings(True, local_steps=1), shared_field="private", shared_keys=body
    )
    sent, _ = decode(site.payload(1))
    assert set(sent) == set(body)
    head = {k: v.clone() for k, v in site.shared_state().items() if k not in body}
    new_body = {k: v + 0.5 for k, v in site.shared_state().items() if k in body}
    pkt = Packet(3, 0, encode(new_body, {"round": 1, "src": 3}))
    assert site.on_receive_global(Message({"round": 1}, [pkt])).meta["rejected"] == []
    now = site.shared_state()
    assert all(torch.equal(now[k], new_body[k]) for k in body) and all(
        torch.equal(now[k], head[k]) for k in head
    )
    whole = {**new_body, **head}  # a whole model where a body is expected is refused, state untouched
    r = site.on_receive_global(Message({"round": 2}, [Packet(3, 0, encode(whole, {"round": 2, "src": 3}))]))
    assert len(r.meta["rejected"]) == 1 and all(torch.equal(site.shared_state()[k], now[k]) for k in now)


def test_the_server_averages_and_broadcasts_bodies_only():
    cfg = RunConfig.from_dict({"method": "fedper", "clients": 2, "proxy_model": "mlp", "seed": 0}).resolve()
    proto = cfg.info.cls(cfg).make_coordinator(
        2, SimpleNamespace(input_shape=(1, 8, 8), num_classes=10), torch.device("cpu")
    )
    server = proto.server
    start = {k: v.clone() for k, v in server.state().items()}
    assert set(start) == set(body_keys(MLP))
    ups = [{k: v + d for k, v in start.items()} for d in (1.0, 3.0)]
    packets = [
        Packet(
            k, 2, encode({**u, WEIGHT_KEY: torch.tensor(1.0, dtype=torch.float64)}, {"round": 1, "src": k})
        )
        for k, u in enumerate(ups)
    ]
    assert server.aggregate(1, packets, {0: 1.0, 1: 1.0}) == []
    for k, v in server.state().items():
        torch.testing.assert_close(v, start[k] + 2.0)
    assert set(decode(server.payload(1))[0]) == set(start)
