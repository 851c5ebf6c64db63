"""Secure aggregation with client sampling: the server samples hospitals each round and the sampled ones
run the secure round; a sample smaller than min_survivors is skipped (no hospital trains, nothing is
released); each hospital's ε against the server composes the discrete mechanisms of the rounds whose sum held
its input — no amplification by sampling, since the server picks the sample — equal to an independent
computation."""

import math

import pytest
import torch

from silofl.privacy import discrete as D
from tests.helpers import build_run
from tests.secure.test_client_level import config
from tests.secure.test_subclient_unit import ORDERS, _ref_gamma, weights


def _ref_epsilon(rounds, delta, beta=D.DEFAULT_BETA):
    """ε at ``delta`` of released rounds, each (γ, d, C, z, survivors, group): the Skellam RDP bound of one
    group of summands' rounded vectors with the noise variance (z·C·γ)², summed, converted by
    dp_accounting."""
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    total = [0.0] * len(ORDERS)
    for gamma, d, clip, z, group in rounds:
        x, var = gamma * clip, (z * clip * gamma) ** 2
        l2 = min(
            x + math.sqrt(d),
            math.sqrt(x * x + d / 4 + math.sqrt(2 * math.log(1 / beta)) * (x + math.sqrt(d) / 2)),
        )
        l1, l2 = group * l2 * min(math.sqrt(d), l2), group * l2
        for i, a in enumerate(ORDERS):
            total[i] += a * l2**2 / (2 * var) + min(
                ((2 * a - 1) * l2**2 + 6 * l1) / (4 * var**2), 3 * l1 / (2 * var)
            )
    return compute_epsilon(ORDERS, total, delta)[0] if rounds else 0.0


@pytest.mark.slow
def test_sampled_rounds_skip_small_samples_and_each_hospital_accounts_its_own(tmp_path):
    """client_rate 0.5 of 4 hospitals (default min_survivors 2), the sub-client unit with 2 sub-clients,
    z = 1: the samples {1}, {0, 2}, {0, 1, 3} — the first round is skipped; hospital 0's ε against the server
    composes two rounds, the others' one; both units equal the independent computation."""
    cfg = config(tmp_path, client_rate=0.5, rounds=3, privacy_unit="subclient", intermediaries="2")
    b = build_run(cfg)
    proto = b.coordinator
    srv = proto.server
    schedule = iter([{1}, {0, 2}, {0, 1, 3}, set()])

    def select(clients):  # the server's sample of the next round, fixed for the test
        srv.selected = next(schedule) & set(clients)

    srv.select = select
    proto.start()
    assert srv.secure.min_survivors == 2 and proto.accounts.sample_rate == 1.0
    sites = b.engine.sites
    before = weights(srv)
    proto.run_round(1)
    h = srv.history[-1]
    assert h["abandoned"] and h["skipped"] and "round skipped" in h["reason"]
    assert torch.equal(weights(srv), before) and all(s.rounds_trained == 0 for s in sites.values())
    assert srv.epsilon_vs_server() == 0.0 and not proto.accounts.accountants["subclient"].history
    proto.run_round(2)
    proto.run_round(3)
    assert [r["survivors"] for r in srv.secure_rounds] == [[0, 2], [0, 1, 3]]
    assert [s.rounds_trained for _, s in sorted(sites.items())] == [2, 1, 1, 1]
    assert all(h.get("step") for h in srv.history[1:])
    mechs = [D.DiscreteMechanism.from_dict(r["mechanisms"][0]) for r in srv.secure_rounds]
    assert [m.parties for m in mechs] == [2, 3] and all(m.per_party == 2 for m in mechs)
    ref = {
        n: _ref_gamma(srv.d, cfg.clip, 20, n, 2, 1.0, 2) for n in (2, 3)
    }  # (γ, d′) of a round with n hospitals
    rounds_of = {0: [2, 3], 1: [3], 2: [2], 3: [3]}
    for k, ns in rounds_of.items():
        for unit, group in (("subclient", 1), ("hospital", 2)):
            want = _ref_epsilon([(*ref[n], cfg.clip, 1.0, group) for n in ns], 1e-3)
            assert srv.epsilon_vs_server_of(k, unit) == pytest.approx(want, rel=1e-6)
    assert srv.epsilon_vs_server() == srv.epsilon_vs_server_of(0) > srv.epsilon_vs_server_of(1)
    # the central Gaussian figures: unamplified (rate 1), every released round
    assert [h[1] for h in proto.accounts.accountants["subclient"].history] == [1.0]
    assert proto.accounts.accountants["subclient"].history[0][2] == 2
    p = proto.privacy_summary()
    assert p["rounds_released"] == 2 and p["rounds_abandoned"] == 1 and p["rounds_skipped_small_sample"] == 1
    assert p["rounds_per_hospital"] == {"0": 2, "1": 1, "2": 1, "3": 1}
    assert p["epsilon_vs_server_per_hospital"]["2"] == srv.epsilon_vs_server_of(2)
    assert p["epsilon_vs_server_hospital"] == srv.epsilon_vs_server_of(0, "hospital")
    assert "no amplification by sampling claimed" in p["note_sampling"]
    assert proto.extra_metrics(1)["epsilon_vs_server"] == srv.epsilon_vs_server_of(1)


def test_a_budget_first_plan_claims_no_amplification_by_sampling(tmp_path):
    """σ from --target-epsilon is planned at sampling rate 1 with secure aggregation (the server picks the
    sample), at the client rate without it."""
    from silofl.runner.plan import party_plans

    for secure, rate in ((True, 1.0), (False, 0.5)):
        cfg = config(tmp_path, client_rate=0.5, target_epsilon=10.0, secure_aggregation=secure).resolve()
        assert [p.sample_rate for p in party_plans(cfg, [160] * 4)] == [rate]


@pytest.mark.slow
def test_many_skipped_rounds_do_not_overflow_a_sites_deferred_broadcasts(tmp_path):
    """Nine rounds whose sample is empty (skipped: no site is asked anything but the deferred broadcast), then
    all four: the deferred broadcasts went out before a site's batch could exceed its bound, and the round
    releases a sum."""
    b = build_run(config(tmp_path, client_rate=0.5, rounds=10))
    proto, srv = b.coordinator, b.coordinator.server
    schedule = iter([set()] * 9 + [{0, 1, 2, 3}, set()])
    srv.select = lambda clients: setattr(srv, "selected", next(schedule) & set(clients))
    proto.start()
    for rnd in range(1, 11):
        proto.run_round(rnd)
    assert srv.secure_skipped == 9 and not b.engine.lost
    assert srv.history[-1]["survivors"] == 4 and srv.history[-1]["step"] is True
