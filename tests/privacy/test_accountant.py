"""ε from our accountant against Opacus' own accountant and Google's dp-accounting (independent)."""

import pytest
import torch
from dp_accounting import dp_event
from dp_accounting import rdp as gdp_rdp
from dp_accounting.pld import pld_privacy_accountant
from opacus.accountants import RDPAccountant

from silofl.core.errors import BudgetExhausted, ConfigError
from silofl.privacy import Accountant, Budget, epsilon_of, max_steps_within
from silofl.privacy.analysis import DEFAULT_ORDERS

# (σ, q, steps): DP-SGD regimes from ε ≈ 1 to ε ≈ 30. The paper's (1.0, 0.25, 1200) is left out of the
# dp-accounting comparison: its best RDP order is 1.4, where dp-accounting's fractional-order series does
# not converge and it drops those orders (it reports 125 where Opacus and PLD/PRV give 99.6 and 94.4).
CASES = [(1.1, 0.01, 1000), (1.0, 0.004, 10000), (2.0, 0.25, 1200), (1.0, 0.25, 40), (0.8, 0.1, 200)]


def google_rdp(sigma, q, steps, delta):
    acc = gdp_rdp.RdpAccountant(orders=list(DEFAULT_ORDERS))
    acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("sigma,q,steps", CASES)
def test_rdp_agrees_with_opacus_exactly_and_dp_accounting_within_2_percent(sigma, q, steps):
    ours = Accountant("rdp")
    for _ in range(4):
        ours.step(sigma, q, steps // 4)
    ours.step(sigma, q, steps - 4 * (steps // 4))
    op = RDPAccountant()
    op.history = [(sigma, q, steps)]
    assert ours.epsilon(1e-5) == pytest.approx(op.get_epsilon(1e-5), rel=1e-9)
    assert ours.epsilon(1e-5) == pytest.approx(google_rdp(sigma, q, steps, 1e-5), rel=0.02)


def test_prv_agrees_with_dp_accounting_pld():
    sigma, q, steps = 1.0, 0.25, 40
    pld = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    pld.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)
    acc = Accountant("prv")
    acc.step(sigma, q, steps)
    assert acc.epsilon(1e-5) == pytest.approx(pld.get_epsilon(1e-5), rel=0.03)
    assert acc.epsilon(1e-5) <= epsilon_of("rdp", ((sigma, q, steps),), 1e-5)  # PRV is the tighter bound


def test_history_report_and_epsilon_after():
    acc = Accountant("rdp")
    assert acc.epsilon(1e-5) == 0.0
    acc.step(1.0, 0.25, 4)
    acc.step(1.0, 0.25, 4)
    acc.step(2.0, 0.25, 4)
    assert acc.history == ((1.0, 0.25, 8), (2.0, 0.25, 4))
    before = acc.epsilon(1e-5)
    after = acc.epsilon_after(2.0, 0.25, 4, 1e-5)
    assert after > before and acc.steps == 12
    acc.step(2.0, 0.25, 4)
    assert acc.epsilon(1e-5) == pytest.approx(after)
    rep = acc.report(1e-5)
    assert rep["accountant"] == "opacus.rdp" and rep["steps"] == 16 and rep["noise_multiplier"] is None
    with pytest.raises(ConfigError):
        acc.step(0.0, 0.25, 1)


def test_budget_and_max_steps():
    n = max_steps_within("rdp", 1.0, 0.25, 1e-5, target_epsilon=10.0, step_block=4)
    assert n % 4 == 0 and n > 0
    assert epsilon_of("rdp", ((1.0, 0.25, n),), 1e-5) <= 10.0 < epsilon_of("rdp", ((1.0, 0.25, n + 4),), 1e-5)
    acc = Accountant("rdp")
    budget = Budget(acc, 10.0, 1e-5)
    acc.step(1.0, 0.25, n)
    assert not budget.allows(1.0, 0.25, 4)
    with pytest.raises(BudgetExhausted, match="does not allow"):
        budget.require(1.0, 0.25, 4)
    assert Budget(acc, None, 1e-5).allows(1.0, 0.25, 10**6)


def test_accountant_state_round_trips_and_never_shrinks():
    import json

    from silofl.core.errors import ConfigError

    a = Accountant("rdp")
    a.step(1.0, 0.1, 30)
    a.step(1.5, 0.2, 10)
    state = json.loads(json.dumps(a.state_dict()))  # plain JSON
    b = Accountant("rdp")
    b.load_state_dict(state)
    assert b.history == a.history and b.epsilon(1e-5) == a.epsilon(1e-5)
    b.step(1.5, 0.2, 5)
    with pytest.raises(ConfigError, match="never reset"):
        b.load_state_dict(state)  # an older checkpoint cannot roll the spend back
    with pytest.raises(ConfigError, match="'prv'"):
        Accountant("rdp").load_state_dict({**state, "kind": "prv"})
    with pytest.raises(ConfigError, match="invalid"):
        Accountant("rdp").load_state_dict({"kind": "rdp", "history": [[0.0, 0.1, 3]]})


def test_noise_source_state_resumes_the_same_draws():
    from silofl.privacy import NoiseSource

    n = NoiseSource(7)
    n.normal((5,), 1.0)
    st = n.state_dict()
    expect = n.normal((5,), 1.0)
    m = NoiseSource(0)
    m.load_state_dict(st)
    assert torch.equal(m.normal((5,), 1.0), expect)
    assert NoiseSource().state_dict() == {"secure": True}
    with pytest.raises(ValueError):
        NoiseSource().load_state_dict(st)
