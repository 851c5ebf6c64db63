import json

import pytest
import torch

from silofl.comm.messages import Message, Packet
from silofl.comm.wire import decode, encode
from silofl.fl.exchange.centralized import WEIGHT_KEY
from silofl.fl.registry import methods
from silofl.runner.loop import run as simulate
from tests.helpers import MODEL_FOR, build_run, spy_packets

pytestmark = pytest.mark.slow  # every test here is a whole run

METHODS = methods()
# dp-ssp (one full-batch release, q = 1, through the secure sum) is left out of this sample-rate check:
# tests/comm/test_torchdist.py runs it end to end on the simulator and torch.distributed
EXAMPLE_LEVEL = [m for m, i in METHODS.items() if not i.client_level and m != "dp-ssp"]


@pytest.mark.parametrize("method", EXAMPLE_LEVEL)
def test_every_example_level_method_runs_end_to_end_and_writes_its_run_folder(method, tiny_cfg, tmp_path):
    out = tmp_path / method
    s = simulate(
        tiny_cfg.replace(method=method, rounds=2, out=str(out), **MODEL_FOR.get(method, {})), progress=False
    )
    info = METHODS[method]
    assert s["headline"] == info.headline and s["final"][info.headline]["mean"] is not None
    for f in ("config.yaml", "metrics.jsonl", "metrics.csv", "summary.json", "accuracy_epsilon.png"):
        assert (out / f).is_file(), f
    rec = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert info.headline in rec and rec["epsilon"] > 0 and rec["delta"] == 1e-3
    acc = s["accounting"][0]
    n = 120 * (4 if method == "joint" else 1)
    assert acc["sample_rate"] == pytest.approx(30 / n) and acc["steps"] == 2 * (n // 30)
    from silofl.privacy import epsilon_of

    assert acc["epsilon"] == pytest.approx(epsilon_of("rdp", ((1.0, 30 / n, 2 * (n // 30)),), 1e-3))
    assert s["privacy"]["formal_guarantee"] is True  # strict mode, or no mutual learning at all
    sent = s["bytes"]["total_sent"]
    assert (sent == 0) == (info.exchange == "none")
    assert s["sites_trained"] == (1 if method == "joint" else 4)


def test_fedavg_clients_hold_the_size_weighted_average_of_their_uploads(tiny_cfg):
    b = build_run(tiny_cfg.replace(method="fedavg"))
    proto = b.coordinator
    proto.start()
    proto.flush()  # the broadcast goes with each site's next request (silofl.comm.batch): deliver it now
    first = [c.shared_state() for c in b.sites]
    for c in b.sites[1:]:  # the server's initial broadcast: everyone starts equal
        assert all(torch.equal(first[0][k], c.shared_state()[k]) for k in first[0])
    server_bytes = b.engine.bytes_sent[proto.server_id]
    packets = spy_packets(b.engine)
    proto.run_round(1)
    proto.flush()
    uploads = [decode(data)[0] for src, dst, data in packets if dst == proto.server_id]
    assert len(uploads) == 4
    w = torch.tensor([float(u.pop(WEIGHT_KEY)) for u in uploads], dtype=torch.float64)
    assert torch.allclose(w, torch.full((4,), 120.0, dtype=torch.float64))
    for k, v in proto.server.state().items():
        expect = sum(u[k].double() * wi for u, wi in zip(uploads, w / w.sum(), strict=True)).to(v.dtype)
        torch.testing.assert_close(v, expect)
        for c in b.sites:
            assert torch.equal(c.shared_state()[k], v)
    ev = proto.evaluate(1)
    assert len({round(m["accs"]["global_acc"], 9) for m in ev.values()}) == 1
    assert b.engine.bytes_received[proto.server_id] == sum(b.engine.bytes_sent[c] for c in range(4))
    assert b.engine.bytes_sent[proto.server_id] > server_bytes  # the broadcast, counted for the server


def test_server_rejects_a_corrupt_upload_and_averages_the_rest(tiny_cfg, caplog):
    b = build_run(tiny_cfg.replace(method="fedavg"))
    proto = b.coordinator
    good = b.sites[0].shared_state()
    bad = {k: torch.full_like(v, float("inf")) for k, v in good.items()}
    packets = [
        Packet(
            0, 4, encode({**good, WEIGHT_KEY: torch.tensor(2.0, dtype=torch.float64)}, {"round": 1, "src": 0})
        ),
        Packet(
            1, 4, encode({**bad, WEIGHT_KEY: torch.tensor(1.0, dtype=torch.float64)}, {"round": 1, "src": 1})
        ),
        Packet(2, 4, encode(good, {"round": 1, "src": 2})),
    ]  # no aggregation weight
    rejected = proto.server.aggregate(1, packets)
    assert [r["src"] for r in rejected] == [1, 2]
    for k, v in proto.server.state().items():
        torch.testing.assert_close(v, good[k])
    assert "server rejected the model from client 1" in caplog.text


def test_fml_averages_memes_but_private_models_stay_local(tiny_cfg):
    b = build_run(tiny_cfg.replace(method="fml", private_models=["mlp", "cnn1", "lenet5", "cnn2"]))
    b.coordinator.start()
    b.coordinator.run_round(1)
    b.coordinator.flush()  # the round's broadcast goes with each site's next request: deliver it now
    memes = [c.shared_state() for c in b.sites]
    assert all(torch.equal(memes[0][k], m[k]) for m in memes for k in m)
    assert [c.private_spec.name for c in b.sites] == ["mlp", "cnn1", "lenet5", "cnn2"]
    meme_bytes = len(b.sites[0].payload(1))
    # each client sent one meme (plus a weight) and received the initial and one averaged meme
    for c in range(4):
        assert meme_bytes < b.engine.bytes_sent[c] < 1.01 * meme_bytes


def test_avgpush_gossips_like_proxyfl_without_private_models(tiny_cfg):
    push = build_run(tiny_cfg.replace(method="avgpush", private_model=None))
    prox = build_run(tiny_cfg.replace(method="proxyfl"))
    assert all(c.private is None for c in push.sites)
    push.coordinator.run_round(1)
    prox.coordinator.run_round(1)
    assert dict(push.engine.bytes_sent) == dict(prox.engine.bytes_sent)
    assert all(c.pushsum_weight == pytest.approx(1.0) for c in push.sites)  # regular graph: weights stay 1


def test_cwt_passes_one_model_through_every_client_in_order(tiny_cfg):
    b = build_run(tiny_cfg.replace(method="cwt", private_model=None))
    proto = b.coordinator
    packets = spy_packets(b.engine)
    proto.run_round(1)
    assert [(s, d) for s, d, _ in packets] == [(0, 1), (1, 2), (2, 3), (3, 0)]
    assert proto.holder == 0
    assert all(c.accountant.steps == c.steps_per_round for c in b.sites)
    # the model back at client 0 is client 3's trained one
    for k, v in b.sites[0].shared_state().items():
        assert torch.equal(v, b.sites[3].shared_state()[k])
    ev = proto.evaluate(1)
    assert set(ev) == {0, 1, 2, 3} and len({m["accs"]["global_acc"] for m in ev.values()}) == 1


def test_cwt_holder_hands_the_model_on_when_it_leaves(tiny_cfg):
    b = build_run(tiny_cfg.replace(method="cwt", rounds=3, private_model=None))
    proto = b.coordinator
    proto.run_round(1)
    c0 = b.sites[0]
    c0.budget.target_epsilon = c0.epsilon() * 1.0001  # no room for another round
    proto.call("status", {0: Message()})  # the site says so in its next reply
    held = c0.shared_state()
    packets = spy_packets(b.engine)
    ev = proto.run_round(2)
    order = [(s, d) for s, d, _ in packets]
    assert ev.left == [0] and order[0] == (0, 1)  # handed over before client 1 trains
    assert order[1:] == [(1, 2), (2, 3), (3, 1)] and proto.holder == 1
    assert any(not torch.equal(held[k], b.sites[1].shared_state()[k]) for k in held)


def test_regular_with_and_without_dp_and_joint_trains_once_on_pooled_data(tiny_cfg, tmp_path):
    dp = simulate(tiny_cfg.replace(method="regular", rounds=2, out=str(tmp_path / "r")), progress=False)
    nodp = simulate(
        tiny_cfg.replace(method="regular", rounds=2, privacy="off", out=str(tmp_path / "n")), progress=False
    )
    assert dp["final"]["epsilon"]["mean"] > 0 and nodp["final"]["epsilon"]["mean"] is None
    assert [r["private_model"] for r in dp["final"]["per_client"]] == ["cnn1"] * 4
    assert dp["bytes"]["total_sent"] == nodp["bytes"]["total_sent"] == 0
    joint = build_run(tiny_cfg.replace(method="joint"))
    assert len(joint.sites) == 1 and joint.sites[0].n == 4 * 120
    assert joint.sites[0].shared_spec.name == "cnn1"


def test_cwt_with_one_visit_per_round_moves_the_model_one_hop_per_round(tiny_cfg):
    b = build_run(tiny_cfg.replace(method="cwt", cwt_visits=1, private_model=None))
    packets = spy_packets(b.engine)
    for rnd in range(1, 6):
        b.coordinator.run_round(rnd)
    assert [(s, d) for s, d, _ in packets] == [(0, 1), (1, 2), (2, 3), (3, 0), (0, 1)]
    assert [c.rounds_trained for c in b.sites] == [2, 1, 1, 1]  # ε is spent only by the client that trains
    assert b.sites[0].accountant.steps == 2 * b.sites[0].steps_per_round
