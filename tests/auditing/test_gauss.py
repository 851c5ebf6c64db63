"""The Gaussian-pair estimate (silofl.auditing.gauss) against independent references.

The paper's own worked figures (Agrawal et al., arXiv 2606.12733) are not reproduced here: the text readable
to this project (its abstract and the opening of §1) holds no table or example with its inputs, and the one
figure its summaries quote (≈ 6.7 at ε = 8, WideResNet-16-4 DP-SGD on CIFAR-10) needs a CIFAR-10 training run
whose canary count, steps and sampling rate that text does not give (gauss.py's module doc says so too).
What is checked instead: the closed-form hockey-stick divergence of two Gaussians against numerical
integration, the equal-variance case against Dong, Roth & Su's μ-GDP and dp-accounting's Gaussian
mechanism, the ε solve, and (slow) the confidence box's coverage by simulation."""

import math

import numpy as np
import pytest
from scipy import stats

from silofl.auditing import gauss


def _hockey_stick_by_grid(m1, s1, m0, s0, eps):
    """∫ (p₁ − e^ε p₀)_+ on a fine grid: a route independent of the roots of the closed form."""
    lo, hi = min(m1 - 12 * s1, m0 - 12 * s0), max(m1 + 12 * s1, m0 + 12 * s0)
    x = np.linspace(lo, hi, 200_001)
    f = np.maximum(stats.norm.pdf(x, m1, s1) - math.exp(eps) * stats.norm.pdf(x, m0, s0), 0.0)
    return float(np.trapezoid(f, x))


@pytest.mark.parametrize(
    ("m1", "s1", "m0", "s0", "eps"),
    [
        (1.0, 1.0, 0.0, 1.0, 0.5),  # equal variances: a half-line
        (2.0, 1.3, 0.0, 1.0, 1.0),  # wider present scores: outside two roots
        (0.5, 0.7, 0.0, 1.0, 0.2),  # narrower: between two roots
        (0.0, 2.0, 0.0, 1.0, 1.0),  # equal means, only the spread differs
        (3.0, 1.0, -1.0, 1.1, 2.0),
    ],
)
def test_one_way_divergence_matches_integration(m1, s1, m0, s0, eps):
    got = float(gauss._one_way(m1, s1, m0, s0, eps))
    assert got == pytest.approx(_hockey_stick_by_grid(m1, s1, m0, s0, eps), abs=1e-7)
    both = float(gauss.pair_delta(m1, s1, m0, s0, eps))
    assert both == pytest.approx(max(got, float(gauss._one_way(m0, s0, m1, s1, eps))))


def test_equal_variances_are_mu_gdp_and_dp_accountings_gaussian_mechanism():
    """N(μ, 1) vs N(0, 1) is the Gaussian mechanism with sensitivity 1 and σ = 1/μ: dp-accounting's PLD gives
    its ε at δ independently of both closed forms."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    for mu in (0.5, 2.0):
        e = float(gauss.pair_epsilon(mu, 1.0, 0.0, 1.0, 1e-5))
        assert e == pytest.approx(gauss.gdp_epsilon(mu, 1e-5), rel=1e-9)
        assert float(gauss.pair_epsilon(3 * mu, 3.0, 0.0, 3.0, 1e-5)) == pytest.approx(e, rel=1e-9)  # scale
        assert float(gauss.pair_epsilon(-mu, 1.0, 0.0, 1.0, 1e-5)) == pytest.approx(e, rel=1e-9)  # sign
    ref = pld.from_gaussian_mechanism(1.0, value_discretization_interval=1e-3).get_epsilon_for_delta(1e-5)
    assert float(gauss.pair_epsilon(1.0, 1.0, 0.0, 1.0, 1e-5)) == pytest.approx(ref, abs=5e-3)


def test_pair_epsilon_solves_for_delta():
    m1, s1 = np.array([1.0, 2.0, 0.0, 0.3]), np.array([1.2, 0.9, 1.5, 1.0])
    e = gauss.pair_epsilon(m1, s1, 0.0, 1.0, 1e-5)
    assert (e > 0).all()
    np.testing.assert_allclose(gauss.pair_delta(m1, s1, 0.0, 1.0, e), 1e-5, rtol=1e-6)
    assert float(gauss.pair_epsilon(0.0, 1.0, 0.0, 1.0, 1e-5)) == 0.0  # one distribution: no loss
    # a wider spread alone costs ε; more separation costs more
    assert 0 < gauss.pair_epsilon(0.0, 1.1, 0.0, 1.0, 1e-5) < gauss.pair_epsilon(1.0, 1.1, 0.0, 1.0, 1e-5)
    assert math.isinf(float(gauss.pair_epsilon(30.0, 5.0, 0.0, 0.02, 1e-5)))  # disjoint: no finite ε
    with pytest.raises(ValueError, match="delta"):
        gauss.pair_epsilon(1.0, 1.0, 0.0, 1.0, 0.0)


def test_estimate_is_the_box_minimum_below_the_point_estimate():
    rng = np.random.default_rng(0)
    inc = rng.random(1000) < 0.5
    scores = np.where(inc, rng.normal(1.4, 1.0, 1000), rng.normal(0.0, 1.0, 1000))
    g = gauss.gauss_estimate(scores, inc, 1e-5, 0.95)
    box, at = g["confidence_box"], g["at_minimum"]
    assert (
        box["mu1"][0] < g["mean_in"] < box["mu1"][1] and box["sigma0"][0] < g["sigma_out"] < box["sigma0"][1]
    )
    assert box["mu1"][0] - box["mu0"][1] <= at["mean_gap"] <= box["mu1"][1] - box["mu0"][0]
    assert g["epsilon_estimate"] == pytest.approx(
        float(gauss.pair_epsilon(at["mean_gap"], at["sigma_in"], 0.0, at["sigma_out"], 1e-5))
    )
    # the minimum over the box is no larger than ε at the box's own corners and centre
    corners = gauss.pair_epsilon(
        np.array(
            [box["mu1"][0] - box["mu0"][1], box["mu1"][1] - box["mu0"][0], g["mean_in"] - g["mean_out"]]
        ),
        np.array([box["sigma1"][1], box["sigma1"][0], g["sigma_in"]]),
        0.0,
        np.array([box["sigma0"][1], box["sigma0"][0], g["sigma_out"]]),
        1e-5,
    )
    assert g["epsilon_estimate"] <= corners.min() + 1e-9
    assert 0 < g["epsilon_estimate"] < g["epsilon_point"]
    assert g["epsilon_estimate"] < gauss.gdp_epsilon(1.4, 1e-5)  # below the truth here (the null case:
    # test_gradient.py::test_gauss_estimate_recovers_mu)
    with pytest.raises(ValueError, match="two included"):
        gauss.gauss_estimate(np.zeros(3), np.array([True, False, False]), 1e-5)


@pytest.mark.slow
def test_confidence_box_covers_the_true_epsilon():
    """Gaussian scores with known parameters (unequal variances, as a sampled canary's are): the reported ε
    is at most the true pair's ε in at least 95 % of audits (19 of 20)."""
    rng = np.random.default_rng(1)
    true = float(gauss.pair_epsilon(1.2, 1.05, 0.0, 1.0, 1e-5))
    below = 0
    for _ in range(20):
        inc = rng.random(600) < 0.5
        scores = np.where(inc, rng.normal(1.2, 1.05, 600), rng.normal(0.0, 1.0, 600))
        g = gauss.gauss_estimate(scores, inc, 1e-5, 0.95)
        below += g["epsilon_estimate"] <= true
    assert below >= 19
