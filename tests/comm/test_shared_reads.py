"""A payload that several sites of one process receive is decoded and checked once; received models are
probed in one vectorised pass — with the verdicts of one at a time (silofl.comm.wire.read_model_shared,
silofl.site.probe)."""

from __future__ import annotations

import pytest
import torch

from silofl.comm import wire
from silofl.comm.wire import encode, read_model_shared
from silofl.core.errors import PeerModelRejected
from silofl.site.probe import probe_many
from tests.adversarial.test_hostile_models import proxy_message
from tests.helpers import build_run


def test_one_decode_per_payload_and_refusals_shared(monkeypatch):
    calls = []
    real = wire.decode
    monkeypatch.setattr(wire, "decode", lambda data, *a: calls.append(1) or real(data, *a))
    ref = {"w": torch.zeros(2, 3)}
    good = encode(
        {"w": torch.ones(2, 3), "s": torch.tensor(0.5, dtype=torch.float64)}, {"round": 1, "src": 4}
    )
    cache: dict = {}
    reads = [read_model_shared(cache, good, ref, ("s",), expect={"round": 1, "src": 4}) for _ in range(5)]
    assert len(calls) == 1 and all(r[1] == {"s": 0.5} and r[2]["src"] == 4 for r in reads)
    assert (
        reads[0][0] is not reads[1][0] and reads[0][0]["w"] is reads[1][0]["w"]
    )  # fresh dicts, shared tensors
    for _ in range(3):  # another expectation is another entry; its refusal is given to every reader
        with pytest.raises(PeerModelRejected, match="round is 1"):
            read_model_shared(cache, good, ref, ("s",), expect={"round": 2, "src": 4})
    assert len(calls) == 2
    read_model_shared(None, good, ref, ("s",), expect={"round": 1, "src": 4})  # no cache: read_model
    assert len(calls) == 3


def test_batched_probe_gives_the_verdicts_of_one_at_a_time():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).eval()
    x = torch.randn(4, 5)
    good = [{k: torch.randn_like(v) for k, v in model.state_dict().items()} for _ in range(3)]
    huge = {k: v * 1e5 for k, v in good[0].items()}
    nan = {k: v.clone() for k, v in good[1].items()}
    nan["2.bias"][0] = float("nan")
    states = [good[0], huge, good[1], nan, good[2]]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    many = probe_many(model, states, x, 1e6)
    assert many == [True, False, True, False, True]
    assert many == [probe_many(model, [s], x, 1e6)[0] for s in states]
    assert all(
        torch.equal(v, before[k]) for k, v in model.state_dict().items()
    )  # the scratch model untouched


def test_a_complete_graph_round_decodes_each_payload_once_and_refuses_a_hostile_one(tiny_cfg, monkeypatch):
    b = build_run(tiny_cfg.replace(graph="complete", self_weight=0.25))
    calls = []
    real = wire.decode
    monkeypatch.setattr(wire, "decode", lambda data, *a: calls.append(1) or real(data, *a))
    b.coordinator.run_round(1)
    calls.clear()
    b.coordinator.run_round(2)  # round 1's deliveries go with round 2's requests (silofl.comm.batch)
    assert len(calls) == 4  # 4 sites each received the other 3 payloads: K decodes, not K(K − 1)
    site = b.sites[0]
    msgs = [proxy_message(b.sites[k], 3, k, weight=0.25) for k in (1, 2)]
    msgs.append(proxy_message(b.sites[3], 3, 3, weight=0.25, scale=1e5))  # passes the bounds, not the probe
    rejected = site.incoming(3, msgs)
    assert [r["src"] for r in rejected] == [3] and "probe batch" in rejected[0]["reason"]
