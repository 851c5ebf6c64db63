"""The one-run bound (silofl.auditing.one_run) against an independent reference: a plain re-typing of the
authors' Appendix D listing (Steinke, Nasr & Jagielski 2023, arXiv:2305.08846), written here with
math and scipy.stats only, and the numbers the paper prints."""

import math

import numpy as np
import pytest
import scipy.stats

from silofl.auditing import one_run


def appendix_d_p_value(m, r, v, eps, delta):
    """Appendix D's p_value_DP_audit, line by line."""
    q = 1 / (1 + math.exp(-eps))
    beta = scipy.stats.binom.sf(v - 1, r, q)
    alpha = 0
    s = 0
    for i in range(1, v + 1):
        s = s + scipy.stats.binom.pmf(v - i, r, q)
        if s > i * alpha:
            alpha = s / i
    return min(beta + alpha * delta * 2 * m, 1)


def appendix_d_eps(m, r, v, delta, p=0.05):
    """Appendix D's get_eps_audit (bisection; 40 steps here instead of 30)."""
    lo, hi = 0, 1
    while appendix_d_p_value(m, r, v, hi, delta) < p:
        hi = hi + 1
    for _ in range(40):
        mid = (lo + hi) / 2
        if appendix_d_p_value(m, r, v, mid, delta) < p:
            lo = mid
        else:
            hi = mid
    return lo


def test_p_value_equals_appendix_d():
    for m, r in ((10, 10), (100, 50), (1000, 100), (5000, 200)):
        for v in sorted({1, r // 2, (3 * r) // 4, r - 1, r}):
            for eps in (0.0, 0.3, 1.0, 2.5, 5.0):
                for delta in (0.0, 1e-5, 1e-3):
                    ref = appendix_d_p_value(m, r, v, eps, delta)
                    assert one_run.p_value(m, r, v, eps, delta) == pytest.approx(ref, abs=1e-12), (
                        m,
                        r,
                        v,
                        eps,
                        delta,
                    )


# (m, r, v, δ) -> ε at 95%: the values the research behind issue 17 checked against Appendix D and jax_privacy
REFERENCE = [
    (1000, 100, 75, 1e-4, 0.67298),
    (1000, 100, 75, 1e-5, 0.69947),
    (1000, 100, 100, 1e-5, 3.46538),
    (1000, 200, 200, 1e-5, 4.16649),
    (1000, 1000, 1000, 1e-5, 5.78228),
    (1000, 1000, 600, 1e-5, 0.29723),
    (1000, 100, 60, 1e-5, 0.04955),
    (5000, 500, 480, 1e-5, 2.78302),
    (100000, 1510, 1439, 1e-5, 2.67585),
    (10000, 10000, 6000, 1e-6, 0.37168),
    (50, 50, 50, 1e-5, 2.78331),
    (1000, 100, 90, 0.0, 1.63082),
]


@pytest.mark.parametrize("m,r,v,delta,expected", REFERENCE)
def test_bound_matches_reference_values(m, r, v, delta, expected):
    got = one_run.eps_lower_bound(m, r, v, delta, 0.05)
    assert got == pytest.approx(expected, abs=2e-5)
    if v <= 250:  # the listing's pure-Python loop takes seconds per bound beyond that
        assert got == pytest.approx(appendix_d_eps(m, r, v, delta), abs=1e-6)


def test_numbers_printed_in_the_paper():
    assert one_run.eps_lower_bound(1000, 100, 75, 1e-4) == pytest.approx(
        0.673, abs=5e-4
    )  # Appendix D example
    assert one_run.eps_lower_bound(100000, 1510, 1439, 1e-5) == pytest.approx(2.675, abs=1e-3)  # Section 7


def test_pure_closed_form_and_monotonicity():
    assert one_run.eps_lower_bound(1000, 100, 90, 0.0) == pytest.approx(one_run.eps_lower_bound_pure(100, 90))
    # more correct guesses never lower the bound; a δ term never raises it
    bounds = [one_run.eps_lower_bound(1000, 200, v, 1e-5) for v in range(100, 201, 10)]
    assert all(a <= b + 1e-9 for a, b in zip(bounds, bounds[1:], strict=False))
    assert one_run.eps_lower_bound(1000, 200, 180, 1e-3) <= one_run.eps_lower_bound(1000, 200, 180, 0.0)
    assert one_run.eps_lower_bound(1000, 100, 50, 1e-5) == 0.0  # chance
    assert one_run.max_auditable_eps(1000, 100, 1e-5) == pytest.approx(3.46538, abs=2e-5)


def test_random_guessing_rarely_gives_a_bound():
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(200):
        inc = rng.random(1000) < 0.5
        hits += one_run.audit(rng.standard_normal(1000), inc, 50, 50, 1e-5, 0.05, rng).eps_lb > 0
    assert hits / 200 <= 0.1  # ≤ 5% in expectation


def test_bad_counts_are_refused():
    with pytest.raises(ValueError):
        one_run.p_value(10, 11, 5, 1.0, 1e-5)
    with pytest.raises(ValueError):
        one_run.eps_lower_bound(10, 5, 6, 1e-5)
