import json

import pytest
import torch

from silofl.comm.messages import Packet
from silofl.comm.wire import encode
from silofl.fl.exchange.gossip import PUSHSUM_KEY
from silofl.runner.loop import run as simulate
from silofl.training import dml_loss
from tests.helpers import build_run


def test_round_trains_exchanges_and_accounts(tiny_cfg):
    b = build_run(tiny_cfg)
    before = [{k: v.clone() for k, v in c.shared.state_dict().items()} for c in b.sites]
    ev = b.coordinator.run_round(1)
    b.coordinator.flush()  # the round's deliveries go with each site's next request: deliver them now
    assert ev.left == [] and ev.rejected == [] and b.coordinator.take_late() == []
    c0, c1 = b.sites[0], b.sites[1]
    # exponential graph, round 1 → hop 2 with K = 4: client 0 now holds client 2's trained proxy
    assert not torch.equal(c0.shared.state_dict()["out.weight"], before[0]["out.weight"])
    assert c0.accountant.steps == c0.steps_per_round == 4
    assert c0.epsilon() == pytest.approx(c1.epsilon())
    assert b.engine.bytes_sent[0] == b.engine.bytes_received[2] > 0


def test_corrupt_or_wrong_shape_proxy_is_rejected_and_client_keeps_its_own(tiny_cfg, caplog):
    c = build_run(tiny_cfg).sites[0]
    c.outgoing(1, [1])  # self weight 0: keeps no mass of its own
    own = {k: v.clone() for k, v in c.shared.state_dict().items()}
    bad_nan = dict(own)
    bad_nan["out.weight"] = torch.full_like(own["out.weight"], float("nan"))
    bad_nan[PUSHSUM_KEY] = torch.tensor(1.0, dtype=torch.float64)
    bad_shape = {k: v for k, v in own.items() if k != "out.weight"}
    bad_shape["out.weight"] = torch.zeros(3, 3)
    bad_shape[PUSHSUM_KEY] = torch.tensor(1.0, dtype=torch.float64)
    packets = [
        Packet(2, 0, encode(bad_nan, {"round": 1, "src": 2})),
        Packet(3, 0, encode(bad_shape, {"round": 1, "src": 3})),
        Packet(1, 0, b"not a model"),
    ]
    rejected = c.incoming(1, packets)
    assert [r["src"] for r in rejected] == [2, 3, 1]
    assert "non-finite" in rejected[0]["reason"] and "shape" in rejected[1]["reason"]
    for k, v in c.shared.state_dict().items():
        assert torch.equal(v, own[k])
    assert "rejected the model from node 2" in caplog.text


@pytest.mark.slow
def test_budget_exhaustion_drops_a_client_and_the_rest_continue(tiny_cfg):
    b = build_run(tiny_cfg.replace(rounds=4))
    low = b.sites[1]
    s = low.settings
    low.budget.target_epsilon = (
        low.accountant.epsilon_after(s.noise_multiplier, low.sample_rate, 8, s.delta) * 1.0001
    )
    for rnd in range(1, 5):
        ev = b.coordinator.run_round(rnd)
        if rnd == 3:
            assert ev.left == [1]
    assert not low.active and low.left_at == 3 and low.rounds_trained == 2
    assert low.epsilon() <= low.budget.target_epsilon
    assert all(c.rounds_trained == 4 for c in b.sites if c.cid != 1)
    assert b.coordinator.active == [0, 2, 3]
    with pytest.raises(Exception, match="budget"):
        low.train(5)  # training past the budget is refused, not silently done


@pytest.mark.slow
def test_empty_poisson_batches_are_noise_steps_and_counted(tiny_cfg):
    c = build_run(tiny_cfg.replace(batch_size=1, samples_per_client=60, clients=2)).sites[0]
    c.train(1)
    assert c.steps_per_round == 60 and c.accountant.steps == 60
    assert c.empty_batches > 0


@pytest.mark.slow
def test_same_seed_same_metrics_and_different_seed_differs(tiny_cfg, tmp_path):
    tiny_cfg = tiny_cfg.replace(seed=0)  # a research opt-in: without a seed the randomness is secret
    a = simulate(tiny_cfg.replace(out=str(tmp_path / "a")), progress=False)
    b = simulate(tiny_cfg.replace(out=str(tmp_path / "b")), progress=False)
    c = simulate(tiny_cfg.replace(out=str(tmp_path / "c"), seed=1), progress=False)
    ma, mb, mc = ((tmp_path / x / "metrics.jsonl").read_text() for x in "abc")
    assert ma == mb and ma != mc
    assert a["final"] == b["final"]
    assert c["final"] != a["final"]


@pytest.mark.slow
def test_run_folder_contract_and_privacy_modes(tiny_cfg, tmp_path):
    s = simulate(tiny_cfg.replace(privacy="paper", out=str(tmp_path / "p")), progress=False)
    out = tmp_path / "p"
    for f in ("config.yaml", "metrics.jsonl", "metrics.csv", "summary.json", "accuracy_epsilon.png"):
        assert (out / f).is_file(), f
    rec = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    for k in (
        "round",
        "client",
        "private_acc",
        "proxy_acc",
        "epsilon",
        "delta",
        "bytes_sent",
        "bytes_received",
    ):
        assert k in rec
    assert s["privacy"]["mode"] == "paper" and s["privacy"]["formal_guarantee"] is False
    assert "NOT a formal guarantee" in s["privacy"]["note"] and s["privacy"]["dml_beta"] == 0.5
    acc = s["accounting"][0]
    assert set(acc) >= {"noise_multiplier", "sample_rate", "steps", "delta", "epsilon", "accountant"}
    assert acc["steps"] == 3 * 4 and acc["sample_rate"] == pytest.approx(30 / 120)
    assert len(list((out / "models").glob("*.safetensors"))) == 8
    off = simulate(tiny_cfg.replace(privacy="off", out=str(tmp_path / "o")), progress=False)
    assert off["final"]["epsilon"]["mean"] is None and off["privacy"]["formal_guarantee"] is False


def test_dml_loss_matches_the_published_definition():
    torch.manual_seed(0)
    logits, other = torch.randn(6, 4), torch.randn(6, 4)
    y = torch.randint(0, 4, (6,))
    ours = dml_loss(logits, y, torch.log_softmax(other, 1), 0.5).mean()
    kl = torch.nn.KLDivLoss(reduction="batchmean")(torch.log_softmax(logits, 1), torch.softmax(other, 1))
    ref = 0.5 * torch.nn.functional.cross_entropy(logits, y) + 0.5 * kl
    torch.testing.assert_close(ours, ref)


def test_run_stops_when_every_client_spent_its_budget(tiny_cfg, tmp_path):
    from silofl.privacy import epsilon_of, max_steps_within

    target = 1.0001 * epsilon_of("rdp", ((1.0, 0.25, 8),), 1e-3)
    assert max_steps_within("rdp", 1.0, 0.25, 1e-3, target, step_block=4) == 8  # two rounds fit
    s = simulate(
        tiny_cfg.replace(rounds=6, target_epsilon=target, calibrate_noise=False, out=str(tmp_path / "b")),
        progress=False,
    )
    assert s["rounds_run"] == 3
    assert sorted(x["client"] for x in s["left"]) == [0, 1, 2, 3] and {x["round"] for x in s["left"]} == {3}
    assert all(a["steps"] == 8 and a["epsilon"] <= target for a in s["accounting"])
    last = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()][-4:]
    assert [(r["round"], r["active"]) for r in last] == [(3, False)] * 4  # evaluated as they left
    assert all(r["round"] == 3 for r in s["final"]["per_client"])


@pytest.mark.slow
def test_heterogeneous_private_models_and_prv_accountant(tiny_cfg, tmp_path):
    cfg = tiny_cfg.replace(
        rounds=2, accountant="prv", private_models=["mlp", "cnn1", "lenet5", "cnn2"], out=str(tmp_path / "h")
    )
    s = simulate(cfg, progress=False)
    assert [r["private_model"] for r in s["final"]["per_client"]] == ["mlp", "cnn1", "lenet5", "cnn2"]
    acc = s["accounting"][0]
    assert acc["accountant"] == "opacus.prv" and acc["steps"] == 8
    from silofl.privacy import epsilon_of

    assert acc["epsilon"] == pytest.approx(epsilon_of("prv", ((1.0, 0.25, 8),), 1e-3))
    assert acc["epsilon"] <= epsilon_of("rdp", ((1.0, 0.25, 8),), 1e-3)
