import json

import pytest
import torch
import torch.nn.functional as F

from silofl.comm.messages import Packet
from silofl.comm.wire import decode, encode
from silofl.core.errors import BudgetExhausted, ConfigError
from silofl.models import build_model
from silofl.privacy import epsilon_of
from silofl.privacy.analysis import unit_noise_multipliers
from silofl.runner.config import RunConfig
from silofl.runner.loop import run as simulate
from silofl.site.subclients import CLIP, UNCLIPPED, UNITS, local_steps, subclient_shards
from silofl.training.local_sgd import flat, local_updates
from silofl.training.server_opt import DP2RMSProp, FedAdam
from tests.helpers import build_run, spy_packets


@pytest.fixture
def cl_cfg(tmp_path):
    """A seconds-long client-level DP config on digits: 4 hospitals × 160 examples, MLP 64-256-10."""
    return RunConfig.from_dict(
        dict(
            method="dp-fedavg",
            dataset="digits",
            partition="iid",
            clients=4,
            samples_per_client=160,
            batch_size=16,
            rounds=3,
            delta=1e-3,
            proxy_model="mlp256",
            test_limit=200,
            out=str(tmp_path / "run"),
        )
    )


def test_subclient_split_is_disjoint_and_covers_the_client():
    perm = torch.randperm(103, generator=torch.Generator().manual_seed(1))
    for v in (1, 2, 7, 103):
        parts = subclient_shards(perm, v)
        assert len(parts) == v
        joined = torch.cat(parts)
        assert sorted(joined.tolist()) == list(range(103))  # coverage, no index twice
        sizes = [len(p) for p in parts]
        assert max(sizes) - min(sizes) <= 1
    with pytest.raises(ConfigError):
        subclient_shards(perm, 104)
    assert local_steps(103, 2, 10, 3) == [3 * 5, 3 * 5]


def test_vectorized_local_sgd_equals_one_model_at_a_time_and_plain_torch_sgd():
    torch.manual_seed(0)
    model = build_model("mlp256", (1, 8, 8), 10)
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    x, y = torch.randn(200, 1, 8, 8), torch.randint(0, 10, (200,))
    shards = subclient_shards(torch.randperm(200, generator=torch.Generator().manual_seed(2)), 5)
    together = local_updates(model, start, x, y, shards, 2, 8, 0.1, torch.Generator().manual_seed(3))
    alone = local_updates(model, start, x, y, shards, 2, 8, 0.1, torch.Generator().manual_seed(3), chunk=1)
    for (a, sa), (b, sb) in zip(together, alone, strict=True):
        assert sa == sb == 2 * (40 // 8)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # reference: torch.optim.SGD on shard 0 with the same shuffles
    g = torch.Generator().manual_seed(3)
    perms = [[torch.randperm(len(s), generator=g) for _ in range(2)] for s in shards]
    ref = build_model("mlp256", (1, 8, 8), 10)
    ref.load_state_dict(start)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for e in range(2):
        order = shards[0][perms[0][e]]
        for s in range(len(order) // 8):
            b = order[s * 8 : (s + 1) * 8]
            opt.zero_grad()
            F.cross_entropy(ref(x[b]), y[b]).backward()
            opt.step()
    expect = flat(dict(ref.named_parameters())).detach() - flat(start)
    torch.testing.assert_close(together[0][0], expect, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("unit", ["hospital", "subclient"])
def test_uploads_are_clipped_for_the_unit_and_the_server_adds_noise_of_the_stated_std(cl_cfg, unit):
    b = build_run(cl_cfg.replace(intermediaries="4", privacy_unit=unit, clip=0.05, noise_multiplier=1.5))
    proto = b.coordinator
    proto.start()
    srv = proto.server
    before = flat({k: p.detach().clone() for k, p in srv.model.named_parameters()})
    packets = spy_packets(b.engine)
    proto.run_round(1)
    uploads = [(src, decode(data)[0]) for src, dst, data in packets if dst == proto.server_id]
    assert len(uploads) == 4
    units = 1 if unit == "hospital" else 4
    total = torch.zeros_like(before, dtype=torch.float64)
    for _, msg in uploads:
        assert float(msg[UNITS]) == units
        # each sub-client clipped to C/v (hospital) or C (sub-client): the message's norm ≤ units·C
        assert float(msg["update"].norm()) <= units * 0.05 * (1 + 1e-4)
        assert float(msg["update"].norm()) > 0.5 * units * 0.05  # these updates are far above the clip
        total += msg["update"].double()
    after = flat({k: p.detach() for k, p in srv.model.named_parameters()})
    D = 4 * units
    noise = (after - before).double() * D - total  # dp-fedavg, server lr 1: Δw = (Σ + noise) / D
    std = 1.5 * 0.05  # no adaptive part: z_Δ = z
    assert float(noise.mean()) == pytest.approx(0.0, abs=4 * std / noise.numel() ** 0.5)
    assert float(noise.std()) == pytest.approx(std, rel=0.02)
    h = srv.history[-1]
    assert h["noise_std"] == pytest.approx(std) and h["v"] == 4
    z_h, z_s = (1.5, 6.0) if unit == "hospital" else (0.375, 1.5)
    assert (h["z_hospital"], h["z_subclient"]) == (pytest.approx(z_h), pytest.approx(z_s))
    led = srv.accounts
    for u, z in (("hospital", z_h), ("subclient", z_s)):
        assert led.accountants[u].history == ((pytest.approx(z), 1.0, 1),)
        assert led.epsilons()[u] == pytest.approx(epsilon_of("rdp", ((z, 1.0, 1),), 1e-3))


def test_the_broadcast_announces_the_subclient_clip_of_the_unit(cl_cfg):
    for unit, want in (("hospital", 0.25), ("subclient", 1.0)):
        b = build_run(cl_cfg.replace(intermediaries="4", privacy_unit=unit))
        tensors, _ = decode(b.coordinator.server.payload(0, 0))
        assert float(tensors[CLIP]) == pytest.approx(want)
        b.coordinator.start()
        b.coordinator.flush()  # the broadcast goes with each site's next request: deliver it now
        assert all(c.clip == pytest.approx(want) and c.v == 4 and c.selected for c in b.sites)


def test_server_rejects_an_update_above_its_bound_or_from_an_unselected_client(cl_cfg, caplog):
    b = build_run(cl_cfg)
    b.coordinator.start()
    srv = b.coordinator.server
    good = [(c.cid, c.train(1)) for c in b.sites]
    t, _ = decode(good[0][1])
    t["update"] = t["update"] * 10  # 10× the clip
    bad = encode(t, {"round": 1, "src": 0})
    srv.selected = {0, 1, 2}
    rejected = srv.aggregate(
        1, [Packet(0, 4, bad), Packet(1, 4, good[1][1]), Packet(2, 4, good[2][1]), Packet(3, 4, good[3][1])]
    )
    reasons = {r["src"]: r["reason"] for r in rejected}
    assert set(reasons) == {0, 3}
    assert "exceeds the announced bound" in reasons[0] and "not selected" in reasons[3]
    assert srv.history[-1]["updates"] == 2
    assert all(torch.isfinite(p).all() for p in srv.model.parameters())
    t2, _ = decode(good[1][1])
    t2[UNCLIPPED] = torch.tensor(float("nan"), dtype=torch.float64)
    assert srv.aggregate(2, [Packet(1, 4, encode(t2, {"round": 2, "src": 1}))])[0]["reason"].startswith(
        "invalid"
    )


def test_fedadam_matches_torch_adam_on_the_pseudo_gradient():
    g = torch.Generator().manual_seed(0)
    deltas = [torch.randn(50, generator=g) for _ in range(6)]
    ours = FedAdam(lr=0.05, beta1=0.9, beta2=0.99, tau=1e-3, bias_correction=True)
    w = torch.zeros(50)
    p = torch.nn.Parameter(torch.zeros(50))
    opt = torch.optim.Adam([p], lr=0.05, betas=(0.9, 0.99), eps=1e-3)
    for d in deltas:
        w = w + ours.step(d)
        p.grad = -d
        opt.step()
    torch.testing.assert_close(w, p.detach(), rtol=1e-5, atol=1e-6)


def test_dp2_rmsprop_alternates_phases_with_a_delayed_preconditioner():
    opt = DP2RMSProp(lr=0.1, lr_sgd=1.0, delay=2, beta=0.5, tau=1e-3)
    d1, d2, d3 = torch.full((3,), 1.0), torch.full((3,), 3.0), torch.full((3,), 4.0)
    assert [opt.phase(r) for r in range(1, 7)] == ["sgd", "sgd", "adaptive", "adaptive", "sgd", "sgd"]
    assert torch.equal(opt.step(d1), d1) and torch.equal(opt.step(d2), d2)  # SGD phase, accumulating
    u = 0.5 * 2.0**2 / (1 - 0.5)  # (1−β)·(mean of the phase's updates)², bias-corrected (one refresh)
    torch.testing.assert_close(opt.step(d3), 0.1 * d3 / (u**0.5 + 1e-3))
    torch.testing.assert_close(opt.step(d3), 0.1 * d3 / (u**0.5 + 1e-3))  # same delayed u
    assert torch.equal(opt.step(d1), d1)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["dp-fedavg", "dp-fedadam", "dp-fednova", "dp2-rmsprop", "fedadam"])
def test_client_level_methods_run_end_to_end_and_report_both_units(cl_cfg, method, tmp_path):
    cfg = cl_cfg.replace(
        method=method,
        intermediaries="adaptive" if method != "fedadam" else "2",
        adaptive_clip=True,
        out=str(tmp_path / method),
    )
    s = simulate(cfg, progress=False)
    out = tmp_path / method
    for f in (
        "config.yaml",
        "metrics.jsonl",
        "metrics.csv",
        "summary.json",
        "accuracy_epsilon.png",
        "server_rounds.png",
    ):
        assert (out / f).is_file(), f
    assert s["headline"] == "global_acc" and 0.0 <= s["final"]["global_acc"]["mean"] <= 1.0
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {r["round"] for r in recs} == {1, 2, 3} and len(recs) == 12
    assert len(s["server_rounds"]) == 3
    if method == "fedadam":
        assert s["privacy"]["mode"] == "off" and recs[-1]["epsilon"] is None
        return
    last = recs[-1]
    for k in ("xi", "phi", "lambda", "cos_std", "v", "clip", "epsilon_hospital", "epsilon_subclient"):
        assert k in last, k
    priv = s["privacy"]
    assert priv["privacy_unit"] == "hospital" and priv["formal_guarantee"]
    assert last["epsilon"] == pytest.approx(priv["epsilon_hospital"])
    # hospital-calibrated: the accountant saw z every round; the sub-client unit its own multiplier of round
    # t's mechanism (update sum with clip C/v_t, the unclipped count and the norm sum, block by block)
    hist = s["accounting"][0]["history"]
    assert hist == [[1.0, 1.0, 3]]
    vs = [h["v"] for h in s["server_rounds"]]
    count_std, norm_z = priv["clip_count_noise_std"], priv["norm_sum_noise_multiplier"]
    assert count_std is not None and norm_z is not None  # adaptive clip and adaptive v release both
    sub = tuple(
        (unit_noise_multipliers(1.0, v, "hospital", count_std, norm_z)["subclient"], 1.0, 1) for v in vs
    )
    assert priv["epsilon_subclient"] == pytest.approx(epsilon_of("rdp", sub, 1e-3))
    assert priv["epsilon_hospital"] == pytest.approx(epsilon_of("rdp", ((1.0, 1.0, 3),), 1e-3))


@pytest.mark.slow
def test_same_seed_same_numbers_and_client_sampling(cl_cfg, tmp_path):
    cfg = cl_cfg.replace(method="dp-fedadam", intermediaries="adaptive", client_rate=0.5, rounds=4, seed=0)
    a = simulate(cfg.replace(out=str(tmp_path / "a")), progress=False)
    b = simulate(cfg.replace(out=str(tmp_path / "b")), progress=False)
    assert a["server_rounds"] == b["server_rounds"]
    assert a["final"]["global_acc"] == b["final"]["global_acc"]
    assert a["accounting"][0]["history"] == [[1.0, 0.5, 4]]
    counts = [h["updates"] for h in a["server_rounds"]]
    assert all(0 <= n <= 4 for n in counts) and sum(counts) < 16  # Poisson: not every client every round
    # the selection the server drew is the one it broadcast: only selected clients trained
    assert sum(counts) == sum(c.rounds_trained for c in build_and_run(cfg, tmp_path))


def build_and_run(cfg, tmp_path):
    b = build_run(cfg.replace(out=str(tmp_path / "c")))
    b.coordinator.start()
    for r in range(1, cfg.rounds + 1):
        b.coordinator.run_round(r)
    return b.sites


@pytest.mark.slow
def test_budget_stops_the_server_and_a_too_small_budget_is_an_error(cl_cfg, tmp_path):
    one = epsilon_of("rdp", ((1.0, 1.0, 1),), 1e-3)
    two = epsilon_of("rdp", ((1.0, 1.0, 2),), 1e-3)
    s = simulate(
        cl_cfg.replace(
            rounds=5,
            target_epsilon=(two + epsilon_of("rdp", ((1.0, 1.0, 3),), 1e-3)) / 2,
            calibrate_noise=False,
        ),
        progress=False,
    )
    assert s["rounds_run"] == 3 and {x["round"] for x in s["left"]} == {3}
    assert s["privacy"]["epsilon_hospital"] == pytest.approx(two)
    with pytest.raises(BudgetExhausted, match="single round"):
        simulate(
            cl_cfg.replace(target_epsilon=one / 2, calibrate_noise=False, out=str(tmp_path / "x")),
            progress=False,
        )


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"intermediaries": "lots"}, "intermediaries"),
        ({"intermediaries": "0"}, "at least 1"),
        ({"privacy_unit": "patient"}, "privacy_unit"),
        ({"intermediaries": "adaptive", "privacy": "off"}, "without DP"),
        ({"client_rate": 0.0}, "client_rate"),
        ({"clip_quantile": 1.5}, "clip_quantile"),
    ],
)
def test_bad_client_level_options_are_clear_errors(cl_cfg, changes, match):
    with pytest.raises(ConfigError, match=match):
        cl_cfg.replace(**changes).resolve()


def test_errors_that_need_the_data(cl_cfg):
    with pytest.raises(ConfigError, match="at most 10 sub-clients"):
        build_run(cl_cfg.replace(intermediaries="11"))  # 160 examples / batch 16
    with pytest.raises(ConfigError, match="privacy units"):
        build_run(cl_cfg.replace(delta=0.3))
    assert RunConfig(method="fednova").resolve().privacy == "off"
    assert RunConfig(method="dp-fedadam").resolve().options.server_lr == 0.03
    assert RunConfig(method="rmsprop").resolve().options.server_lr == 0.003
    assert RunConfig.from_dict({"method": "dp2-rmsprop", "server_lr": 0.5}).resolve().options.server_lr == 0.5


def test_fednova_normalises_each_update_by_its_local_steps(cl_cfg, monkeypatch):
    """Clients with more local steps must not dominate: Δ_j is scaled by τ̄/τ_j before clipping."""
    from silofl.site import subclients

    cfg = cl_cfg.replace(method="dp-fednova", clients=2, clip=100.0)
    b = build_run(cfg)
    srv = b.coordinator.server
    srv.sizes = [160, 320]  # public sizes the server announces τ̄ from: 10 and 20 steps of 16
    assert srv.tau_bar() == pytest.approx(15.0)
    b.coordinator.start()
    b.coordinator.flush()
    d = srv.d
    fake = {0: [(torch.full((d,), 1e-3), 10)], 1: [(torch.full((d,), 2e-3), 20)]}
    c0, c1 = b.sites
    for c in (c0, c1):
        monkeypatch.setattr(subclients, "local_updates", lambda *a, c=c, **k: fake[c.cid])
        upd = decode(c.train(1))[0]["update"]
        delta, tau = fake[c.cid][0]
        torch.testing.assert_close(upd, delta * (15.0 / tau))  # both become 1.5e-3 per coordinate
