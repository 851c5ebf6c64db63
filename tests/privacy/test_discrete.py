"""The Skellam mechanism for secure aggregation (silofl.privacy.discrete): its noise, its encoding, its
calibration and its accountant, the last against an independent port of the paper's reference code."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from silofl.core.errors import ConfigError
from silofl.privacy import discrete as D
from silofl.privacy.analysis import epsilon_from_rdp


def _mech(**kw) -> D.DiscreteMechanism:
    base = dict(dim=100, clip=1.0, bits=24, parties=4, min_survivors=3, noise_multiplier=1.0)
    base.update(kw)
    return D.calibrate(**base)


# ------------------------------------------------------------------------------------------------ the noise
@pytest.mark.parametrize("mu", [0.6, 7.0, 45.0, 3.0e6, 2.0**40])
def test_skellam_noise_is_integer_centred_with_variance_mu(mu):
    n = 20_000
    x = D.DiscreteRandom(seed=11).skellam(n, mu)
    assert x.dtype == np.int64 and x.shape == (n,)
    # mean 0 within 5 standard errors; the sample variance within 5 of its standard errors
    # (Var(s²) ≈ (μ₄ − σ⁴)/n, Skellam's fourth central moment being 3σ⁴ + σ²)
    assert abs(x.mean()) <= 5 * math.sqrt(mu / n)
    se_var = math.sqrt((2 * mu**2 + mu) / n)
    assert abs(x.var() - mu) <= 5 * se_var


@pytest.mark.parametrize("mu", [3.0, 30.0])  # the multiplication method (λ < 10) and PTRS (λ ≥ 10)
def test_skellam_noise_follows_the_skellam_pmf(mu):
    x = D.DiscreteRandom(seed=5).skellam(20_000, mu)
    dist = stats.skellam(mu / 2, mu / 2)
    lo, hi = int(dist.ppf(0.002)), int(dist.ppf(0.998))
    edges = np.arange(lo, hi + 1)
    observed = np.array([(x < lo).sum()] + [(x == k).sum() for k in edges] + [(x > hi).sum()])
    p = np.concatenate([[dist.cdf(lo - 1)], dist.pmf(edges), [dist.sf(hi)]])
    chi2 = stats.chisquare(observed, p / p.sum() * x.size)
    assert chi2.pvalue > 1e-3


@pytest.mark.parametrize("lam", [0.05, 9.9, 10.0, 1000.0])  # both sides of the switch to PTRS at λ = 10
def test_poisson_draws_follow_the_poisson_pmf(lam):
    x = D.DiscreteRandom(seed=13).poisson(20_000, lam)
    dist = stats.poisson(lam)
    lo, hi = int(dist.ppf(0.001)), int(dist.ppf(0.999))
    cells = np.arange(lo, hi + 1)
    observed = np.array([(x < lo).sum()] + [(x == k).sum() for k in cells] + [(x > hi).sum()])
    p = np.concatenate([[dist.cdf(lo - 1)], dist.pmf(cells), [dist.sf(hi)]])
    keep = p > 0
    assert stats.chisquare(observed[keep], p[keep] / p[keep].sum() * x.size).pvalue > 1e-3


def test_poisson_log_pmf_matches_scipy_where_scipy_is_exact():
    for lam in (10.0, 57.3, 1e4):
        k = np.arange(0, int(lam + 12 * math.sqrt(lam)), dtype=np.float64)
        assert np.allclose(D._poisson_logpmf(k, lam), stats.poisson.logpmf(k, lam), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", D.KINDS)
def test_an_encoding_of_zero_is_the_partys_noise(kind):
    m = _mech(dim=1000, bits=30, parties=4, min_survivors=2, noise_multiplier=0.01, kind=kind)
    rng = D.DiscreteRandom(seed=21)
    noise = np.concatenate(
        [D.centre(D.encode(np.zeros(1000), m, rotation_seed=r, rng=rng), 30) for r in range(5)]
    )
    assert noise.dtype == np.int64 and m.local_mu > 0
    assert abs(noise.mean()) <= 5 * math.sqrt(m.local_mu / noise.size)
    assert abs(noise.var() - m.local_mu) <= 5 * math.sqrt((2 * m.local_mu**2 + m.local_mu) / noise.size)


def test_poisson_of_large_mean_matches_scipy_quantiles():
    lam = 2.0**39
    x = D.DiscreteRandom(seed=2).poisson(20_000, lam)
    z = (x - lam) / math.sqrt(lam)
    assert stats.kstest(z, "norm").pvalue > 1e-3  # Poisson(2^39) is normal to within 1e-6


def test_secure_noise_by_default_and_seeded_noise_reproducible():
    a, b = D.DiscreteRandom(), D.DiscreteRandom()
    assert a.secure and a.state_dict() == {"secure": True}
    assert not np.array_equal(a.skellam(64, 1e6), b.skellam(64, 1e6))  # two parties never share a stream
    s = D.DiscreteRandom().skellam(20_000, 50.0)  # the secure path's sampler is the same sampler
    assert abs(s.var() - 50.0) <= 5 * math.sqrt((2 * 50.0**2 + 50.0) / s.size)

    r1, r2 = D.DiscreteRandom(seed=7), D.DiscreteRandom(seed=7)
    assert not r1.secure
    assert np.array_equal(r1.skellam(100, 1e4), r2.skellam(100, 1e4))
    state = json.loads(json.dumps(r1.state_dict()))  # plain JSON
    first = r1.skellam(100, 1e4)
    r3 = D.DiscreteRandom(seed=99)
    r3.load_state_dict(state)
    assert np.array_equal(r3.skellam(100, 1e4), first)
    with pytest.raises(ValueError):
        a.load_state_dict(state)
    with pytest.raises(ValueError):
        r1.load_state_dict({"secure": True})
    with pytest.raises(ConfigError):
        D.DiscreteRandom(seed=-1)


# -------------------------------------------------------------------------------------------- the encoding
def test_hadamard_rotation_is_orthonormal_and_pinned_to_its_seed():
    m = _mech(dim=37)
    x = np.random.default_rng(0).normal(size=37)
    y = D.rotate(x, m, rotation_seed=123)
    assert y.shape == (64,) and m.padded_dim() == 64
    assert np.linalg.norm(y) == pytest.approx(np.linalg.norm(x), rel=1e-12)
    assert np.allclose(D.unrotate(y, m, rotation_seed=123), x, atol=1e-12)
    assert not np.allclose(D.rotate(x, m, rotation_seed=124), y)
    # the signs come from SHAKE-256, not numpy's generators: every party, every version agrees
    assert D._rotation_signs(0, 8).tolist() == [1.0, -1.0, -1.0, -1.0, -1.0, 1.0, 1.0, -1.0]


def test_conditional_rounding_never_exceeds_its_bound():
    rng = D.DiscreteRandom(seed=3)
    g = np.random.default_rng(1)
    for beta in (D.DEFAULT_BETA, 0.0, 0.9):
        for dim, norm in ((1, 0.3), (16, 2.0), (256, 4.0), (1024, 50.0)):
            bound = D.rounded_l2_norm_bound(norm, beta, dim)
            for _ in range(20):
                x = g.normal(size=dim)
                x *= norm / np.linalg.norm(x)
                r = D.conditional_round(x, bound, rng)
                assert r.dtype == np.int64
                assert np.all(np.abs(r - x) < 1)  # a rounding, to a neighbouring integer
                assert np.linalg.norm(r) <= bound


def test_rounding_is_unbiased():
    x = np.full(20_000, 0.3)
    r = D.conditional_round(
        x, D.rounded_l2_norm_bound(np.linalg.norm(x), 0.0, x.size), D.DiscreteRandom(seed=4)
    )
    assert abs(r.mean() - 0.3) <= 5 * math.sqrt(0.21 / x.size)


def test_encode_sum_decode_without_noise_recovers_the_sum():
    n, d = 5, 300
    m = _mech(dim=d, clip=2.0, bits=48, parties=n, min_survivors=n, noise_multiplier=0.0)
    assert m.local_mu == 0
    g = np.random.default_rng(2)
    xs = [g.normal(size=d) * s for s in (0.01, 0.05, 0.1, 0.5, 1.0)]  # the last two exceed the clip norm
    clipped = [x * min(1.0, m.clip / np.linalg.norm(x)) for x in xs]
    rng = D.DiscreteRandom(seed=1)
    encs = [D.encode(x, m, rotation_seed=77, rng=rng) for x in xs]
    for e in encs:
        assert e.dtype == np.uint64 and e.shape == (m.padded_dim(),) and int(e.max()) < 2**48
        centred = np.where(e >= 2**47, e.astype(np.int64) - 2**48, e.astype(np.int64))
        assert np.linalg.norm(centred) <= m.l2_sensitivity()  # the rounded vector is within its bound
    total = encs[0]
    for e in encs[1:]:
        total = D.add_mod(total, e, m.bits)
    out = D.decode(total, m, rotation_seed=77)
    assert out.shape == (d,)
    # every rounding moves a rotated coordinate by < 1/γ: the error's L2 norm is < n·√d'/γ
    err = np.linalg.norm(out - np.sum(clipped, axis=0))
    assert err < n * math.sqrt(m.padded_dim()) / m.scale
    assert err < 1e-9 * n


def test_sums_within_the_group_decode_exactly_and_beyond_it_wrap():
    m = _mech(dim=64, clip=1.0, bits=16, parties=3, min_survivors=3, noise_multiplier=0.0)
    g = np.random.default_rng(3)
    rng = D.DiscreteRandom(seed=2)
    half = 2 ** (m.bits - 1)

    def centred(v):
        return D.centre(v, m.bits)

    encs = [D.encode(g.normal(size=64), m, rotation_seed=9, rng=rng) for _ in range(3)]
    rounded = [centred(e) for e in encs]  # no noise: the encodings are the rounded vectors
    exact = np.sum(rounded, axis=0)
    assert np.abs(exact).max() < half  # the calibrated range holds this sum
    total = D.add_mod(D.add_mod(encs[0], encs[1], m.bits), encs[2], m.bits)
    assert np.array_equal(centred(total), exact)
    assert np.allclose(
        D.decode(total, m, rotation_seed=9) * m.scale, D.unrotate(exact.astype(float), m, rotation_seed=9)
    )
    # outside the group, the sum is reduced mod 2^bits
    a = np.array([half - 1, 2 * half - 1, 5], dtype=np.uint64)
    b = np.array([1, 1, 2 * half - 7], dtype=np.uint64)
    assert D.add_mod(a, b, m.bits).tolist() == [half, 0, 2 * half - 2]


def test_wrap_tail_bound_dominates_the_exact_skellam_tail():
    for v in (4.0, 100.0, 1e4):
        for k in (1.0, 2.0, 4.0, 6.0):
            a = k * math.sqrt(v)
            assert stats.skellam(v / 2, v / 2).sf(math.ceil(a) - 1) <= D._chernoff_tail(a, 0.0, v) * (
                1 + 1e-9
            )
    # with a sub-Gaussian part alone it is the Gaussian Chernoff bound exp(−a²/2s)
    assert D._chernoff_tail(3.0, 1.0, 0.0) == pytest.approx(math.exp(-4.5), rel=1e-6)
    m = _mech(dim=1000, bits=20, parties=8, min_survivors=6)
    p1 = m.coordinate_wrap_probability(8)
    assert 0 < p1 < 1e-3 and m.wrap_probability_bound(8) == pytest.approx(min(1.0, 1024 * p1))
    assert m.expected_wrapped_coordinates(8) == pytest.approx(1024 * p1)
    assert m.coordinate_wrap_probability(16) > p1  # more summands, more risk


def test_wrap_bound_holds_for_real_sums_of_aligned_updates():
    # a tight group (k = 2 standard deviations) so that coordinates do wrap; the same draws in a 62-bit
    # group give the un-reduced integer sum, whose coordinates outside the 12-bit range are the wraps
    n = 6
    m = D.calibrate(dim=256, clip=1.0, bits=12, parties=n, min_survivors=n, noise_multiplier=0.3, k=2.0)
    wide = D.DiscreteMechanism(**{**m.to_dict(), "bits": 62})
    x = np.random.default_rng(5).normal(size=256)
    x *= 1.0 / np.linalg.norm(x)  # every party sends the same update: the worst case of the bound
    wrapped, total = 0, 0
    for r in range(4):
        s = np.zeros(m.padded_dim(), dtype=np.int64)
        for p in range(n):
            s += D.centre(D.encode(x, wide, rotation_seed=r, rng=D.DiscreteRandom(seed=1000 * r + p)), 62)
        wrapped += int(np.sum((s >= 2**11) | (s < -(2**11))))
        total += s.size
        # the narrow group's sum is the wide one's reduced mod 2^12
        narrow = np.zeros(m.padded_dim(), dtype=np.uint64)
        for p in range(n):
            narrow = D.add_mod(
                narrow, D.encode(x, m, rotation_seed=r, rng=D.DiscreteRandom(seed=1000 * r + p)), 12
            )
        assert np.array_equal(D.centre(narrow, 12), ((s + 2**11) % 2**12) - 2**11)
    rate, bound = wrapped / total, m.coordinate_wrap_probability(n)
    assert 0 < rate <= bound  # it does wrap, and no more often than the bound says


def test_huge_finite_updates_are_clipped_not_zeroed():
    m = _mech(dim=4, bits=40, noise_multiplier=0.0)
    x = np.array([1e308, -1e308, 3.0, 0.0])  # its norm overflows a float64
    out = D.decode(D.encode(x, m, rotation_seed=2, rng=D.DiscreteRandom(seed=1)), m, rotation_seed=2)
    assert np.allclose(out, [m.clip / math.sqrt(2), -m.clip / math.sqrt(2), 0, 0], atol=1e-6)


def test_encode_and_decode_refuse_bad_input():
    m = _mech(dim=10)
    rng = D.DiscreteRandom(seed=0)
    for bad in (
        np.zeros(9),
        np.zeros((10, 1)),
        [0.0] * 10,
        np.array([np.nan] + [0.0] * 9),
        np.array(["a"] * 10),
    ):
        with pytest.raises(ValueError):
            D.encode(bad, m, rotation_seed=1, rng=rng)
    with pytest.raises(ConfigError):
        D.encode(np.zeros(10), m, rotation_seed=-1, rng=rng)
    good = D.encode(np.zeros(10), m, rotation_seed=1, rng=rng)
    for bad in (good.astype(np.int64), good[:-1], np.full(16, 2**m.bits, dtype=np.uint64)):
        with pytest.raises(ValueError):
            D.decode(bad, m, rotation_seed=1)
    with pytest.raises(ValueError):
        D.add_mod(good, np.full(16, 2**m.bits, dtype=np.uint64), m.bits)
    with pytest.raises(ValueError):
        D.add_mod(good, good, 63)


# --------------------------------------------------------------------------------------- the reference
# An independent port of google-research/federated distributed_dp/accounting_utils.py (Apache 2.0):
# rounded_l2_norm_bound, rounded_l1_norm_bound, _skellam_rdp and skellam_epsilon with q = 1, in its own
# float units (scale = γ, central_stddev in float units, l2_sens = the clip norm), converted to (ε, δ) by
# dp_accounting's compute_epsilon (tensorflow_privacy's get_privacy_spent there).
def _ref_rounded_l2_norm_bound(l2_norm_bound, beta, dim):
    bound_1 = l2_norm_bound + np.sqrt(dim)
    if beta == 0:
        return bound_1
    squared_bound_2 = np.square(l2_norm_bound) + 0.25 * dim
    squared_bound_2 += np.sqrt(2.0 * np.log(1.0 / beta)) * (l2_norm_bound + 0.5 * np.sqrt(dim))
    return min(bound_1, np.sqrt(squared_bound_2))


def _ref_rounded_l1_norm_bound(l2_norm_bound, dim):
    return l2_norm_bound * min(np.sqrt(dim), l2_norm_bound)


def _ref_skellam_rdp(l1_sens, l2_sens, central_var, scale, order):
    a, s, mu = order, scale, central_var
    rdp = a / (2 * mu) * l2_sens**2
    rdp += min(((2 * a - 1) * s * l2_sens**2 + 6 * l1_sens) / (4 * s**3 * mu**2), 3 * l1_sens / (2 * s * mu))
    return rdp


def _ref_skellam_rdp_curve(scale, central_stddev, l2_sens, beta, dim, orders):
    l2_sens = _ref_rounded_l2_norm_bound(l2_sens * scale, beta, dim) / scale
    l1_sens = _ref_rounded_l1_norm_bound(l2_sens * scale, dim) / scale
    return np.array([_ref_skellam_rdp(l1_sens, l2_sens, central_stddev**2, scale, int(o)) for o in orders])


def test_skellam_rdp_equals_the_reference_on_both_branches():
    orders = list(range(2, 80))
    branches = set()
    for v in (2.0, 10.0, 1e3, 1e6):
        for l2 in (1.0, 5.0, 100.0):
            for d in (1, 100):
                l1 = _ref_rounded_l1_norm_bound(l2, d)
                ref = np.array([_ref_skellam_rdp(l1, l2, v, 1.0, a) for a in orders])
                assert np.allclose(D.skellam_rdp(orders, l1=l1, l2=l2, variance=v), ref, rtol=1e-12, atol=0)
                for a in orders:
                    branches.add(((2 * a - 1) * l2**2 + 6 * l1) / (4 * v**2) < 3 * l1 / (2 * v))
    assert branches == {True, False}  # both terms of the min were exercised


def _ref_epsilon(parts, delta, orders):
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    total = sum(steps * _ref_skellam_rdp_curve(*p, orders=orders) for p, steps in parts)
    return compute_epsilon(list(orders), list(total), delta)[0]


def _ref_params(m: D.DiscreteMechanism, survivors: int):
    # their padded dimension: pad_zeros pads to 2**ceil(log2 d)
    dim = 2 ** math.ceil(math.log2(m.dim))
    return (m.scale, math.sqrt(survivors * m.local_mu) / m.scale, m.clip, m.beta, dim)


@pytest.mark.parametrize(
    "dim,clip,bits,parties,survivors,z,beta,rounds,delta",
    [
        (100, 1.0, 24, 4, 3, 1.0, D.DEFAULT_BETA, 1, 1e-5),
        (1000, 0.1, 16, 10, 7, 0.7, D.DEFAULT_BETA, 50, 1e-6),
        (5000, 3.0, 12, 8, 8, 2.0, 0.0, 200, 1e-5),  # coarse: rounding inflates the sensitivity
        (1, 0.5, 20, 2, 1, 5.0, 0.3, 1000, 1e-3),
        (70_000, 1.0, 20, 16, 12, 1.1, D.DEFAULT_BETA, 30, 1e-5),
    ],
)
def test_epsilon_equals_the_reference_implementation(
    dim, clip, bits, parties, survivors, z, beta, rounds, delta
):
    m = D.calibrate(
        dim=dim, clip=clip, bits=bits, parties=parties, min_survivors=survivors, noise_multiplier=z, beta=beta
    )
    eps = D.epsilon([m], rounds=rounds, delta=delta)
    ref = _ref_epsilon([(_ref_params(m, survivors), rounds)], delta, D.DISCRETE_ORDERS)
    assert eps == pytest.approx(ref, rel=1e-9)
    # the RDP curve itself, in integer units, equals theirs in float units
    assert np.allclose(
        D.rdp(m, D.DISCRETE_ORDERS, survivors=survivors),
        _ref_skellam_rdp_curve(*_ref_params(m, survivors), orders=D.DISCRETE_ORDERS),
        rtol=1e-9,
        atol=0,
    )
    # fewer survivors, less noise, more ε; the guarantee is never better than the central Gaussian's
    if survivors > 1:
        assert D.epsilon([m], rounds=rounds, delta=delta, survivors=survivors - 1) > eps
    gauss = epsilon_from_rdp(D.DISCRETE_ORDERS, [rounds * a / (2 * z**2) for a in D.DISCRETE_ORDERS], delta)[
        0
    ]
    assert eps >= gauss


def test_epsilon_composes_the_mechanisms_of_a_round():
    update = _mech(dim=2000, clip=1.0, bits=20, parties=6, min_survivors=5, noise_multiplier=1.2)
    count = _mech(dim=1, clip=0.5, bits=20, parties=6, min_survivors=5, noise_multiplier=10.0)
    eps = D.epsilon([update, count], rounds=40, delta=1e-5, survivors=5)
    ref = _ref_epsilon([(_ref_params(update, 5), 40), (_ref_params(count, 5), 40)], 1e-5, D.DISCRETE_ORDERS)
    assert eps == pytest.approx(ref, rel=1e-9)
    assert eps > D.epsilon([update], rounds=40, delta=1e-5)
    assert D.epsilon([update], rounds=0, delta=1e-5) == 0.0 and D.epsilon([], rounds=5, delta=1e-5) == 0.0
    assert D.epsilon([_mech(noise_multiplier=0.0)], rounds=1, delta=1e-5) == math.inf
    with pytest.raises(ConfigError):
        D.epsilon([update], rounds=1, delta=0.0)
    with pytest.raises(ConfigError):
        D.rdp(update, [1.5, 2.0], survivors=3)  # the bound is stated at integer orders


def _exact_skellam_shift_rdp(v: float, shift: int, orders) -> np.ndarray:
    """D_α(Sk(v/2, v/2) + shift ‖ Sk(v/2, v/2)) at each order, summed numerically over the support."""
    dist = stats.skellam(v / 2, v / 2)
    width = int(60 * math.sqrt(v)) + 60 + shift
    k = np.arange(-width, width + 1)
    lp, lq = dist.logpmf(k - shift), dist.logpmf(k)
    ok = np.isfinite(lp) & np.isfinite(lq)
    lp, lq = lp[ok], lq[ok]
    return np.array([np.logaddexp.reduce(a * lp + (1 - a) * lq) / (a - 1) for a in orders])


@pytest.mark.parametrize("v,shift", [(6.0, 1), (50.0, 3), (300.0, 10), (2.0, 2)])
def test_the_bound_is_never_below_the_numerical_renyi_divergence(v, shift):
    orders = list(range(2, 40, 3))
    bound = D.skellam_rdp(orders, l1=shift, l2=shift, variance=v)
    exact = _exact_skellam_shift_rdp(v, shift, orders)
    assert np.all(np.isfinite(exact)) and np.all(exact > 0)
    assert np.all(bound >= exact * (1 - 1e-9))
    assert bound[0] <= 3 * exact[0] + 1  # and not vacuous
    assert epsilon_from_rdp(orders, bound, 1e-5)[0] >= epsilon_from_rdp(orders, exact, 1e-5)[0]


# the distributed discrete Gaussian: port of the same file's compute_rdp_dgaussian and ddgauss_epsilon (q = 1;
# their gamma is the float width of one integer step, 1/γ here; local_stddev in float units)
def _ref_ddgauss_epsilon(gamma, local_stddev, num_clients, l2_sens, beta, dim, rounds, delta, orders):
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    scale = 1.0 / (gamma + 1e-22)
    l2_sens = _ref_rounded_l2_norm_bound(l2_sens * scale, beta, dim) / scale
    l1_sens = _ref_rounded_l1_norm_bound(l2_sens * scale, dim) / scale
    tau = 0
    for k in range(1, num_clients):
        tau += math.exp(-2 * (math.pi * local_stddev * scale) ** 2 * (k / (k + 1)))
    tau *= 10
    l1_scale = l1_sens / (np.sqrt(num_clients) * local_stddev)
    l2_scale = l2_sens / (np.sqrt(num_clients) * local_stddev)

    def eps(order):
        term_1 = (order / 2.0) * l2_scale**2 + tau * dim
        term_2 = (order / 2.0) * (l2_scale**2 + 2 * l1_scale * tau + tau**2 * dim)
        term_3 = (order / 2.0) * (l2_scale + np.sqrt(dim) * tau) ** 2
        return min(term_1, term_2, term_3)

    rdp = np.array([eps(int(o)) for o in orders]) * rounds
    return compute_epsilon(list(orders), list(rdp), delta)[0]


@pytest.mark.parametrize(
    "dim,clip,bits,parties,survivors,z,rounds",
    [(100, 1.0, 24, 4, 3, 1.0, 1), (1000, 0.1, 16, 10, 7, 0.7, 50), (5000, 3.0, 12, 8, 8, 2.0, 200)],
)
def test_ddgauss_epsilon_equals_the_reference_implementation(dim, clip, bits, parties, survivors, z, rounds):
    m = D.calibrate(
        dim=dim,
        clip=clip,
        bits=bits,
        parties=parties,
        min_survivors=survivors,
        noise_multiplier=z,
        kind="ddgauss",
    )
    sigma_float = math.sqrt(m.local_mu) / m.scale
    for s in (survivors, 1):  # τ > 0 with several parties; one party: the plain discrete Gaussian
        ref = _ref_ddgauss_epsilon(
            1 / m.scale, sigma_float, s, m.clip, m.beta, m.padded_dim(), rounds, 1e-5, D.DISCRETE_ORDERS
        )
        assert D.epsilon([m], rounds=rounds, delta=1e-5, survivors=s) == pytest.approx(ref, rel=1e-9)
    # with the local σ small enough for τ to matter, still equal
    small = D.DiscreteMechanism(**{**m.to_dict(), "local_mu": 0.09, "scale": 3.0, "clip": 1.0})
    ref = _ref_ddgauss_epsilon(1 / 3.0, 0.1, 5, 1.0, m.beta, small.padded_dim(), 1, 1e-5, D.DISCRETE_ORDERS)
    assert D.epsilon([small], rounds=1, delta=1e-5, survivors=5) == pytest.approx(ref, rel=1e-9)


@pytest.mark.parametrize("sigma2", [0.7, 2.5, 40.0])
def test_discrete_gaussian_noise_follows_its_pmf(sigma2):
    x = D.DiscreteRandom(seed=8).discrete_gaussian(20_000, sigma2)
    assert x.dtype == np.int64
    support = np.arange(-int(12 * math.sqrt(sigma2)) - 3, int(12 * math.sqrt(sigma2)) + 4)
    pmf = np.exp(-(support**2) / (2 * sigma2))
    pmf /= pmf.sum()
    keep = pmf * x.size >= 5  # chi-square cells with enough mass; the rest pooled
    observed = [(x == k).sum() for k in support[keep]] + [(~np.isin(x, support[keep])).sum()]
    expected = list(pmf[keep] * x.size) + [pmf[~keep].sum() * x.size]
    assert stats.chisquare(observed, expected).pvalue > 1e-3
    big = D.DiscreteRandom().discrete_gaussian(20_000, 1e6)  # secure source; variance σ² to within 1e-300
    assert abs(big.var() - 1e6) <= 5 * math.sqrt(2 / big.size) * 1e6


def test_ddgauss_encode_sum_decode():
    m = _mech(dim=50, bits=32, parties=3, min_survivors=3, noise_multiplier=0.5, kind="ddgauss")
    g, rng = np.random.default_rng(4), D.DiscreteRandom(seed=3)
    xs = [g.normal(size=50) * 0.1 for _ in range(3)]
    errs = []
    for rseed in range(30):
        total = np.zeros(m.padded_dim(), dtype=np.uint64)
        for x in xs:
            total = D.add_mod(total, D.encode(x, m, rotation_seed=rseed, rng=rng), m.bits)
        errs.append(D.decode(total, m, rotation_seed=rseed) - np.sum(xs, axis=0))
    err = np.concatenate(errs)
    assert abs(err.std() - m.central_std(3)) <= 0.05 * m.central_std(3)  # z·c = 0.5 (+ rounding)
    assert m.wrap_probability_bound(3) < 1e-6


# -------------------------------------------------------------------------------------------- calibration
@pytest.mark.parametrize(
    "dim,bits,parties,survivors,z", [(100, 16, 4, 3, 1.0), (10_000, 20, 16, 10, 0.8), (7, 32, 2, 2, 3.0)]
)
def test_calibrate_meets_its_target(dim, bits, parties, survivors, z):
    c, k = 0.7, D.DEFAULT_K
    m = D.calibrate(dim=dim, clip=c, bits=bits, parties=parties, min_survivors=survivors, noise_multiplier=z)
    assert (m.parties, m.min_survivors, m.bits, m.dim) == (parties, survivors, bits, dim)
    assert survivors * m.local_mu >= (z * c * m.scale) ** 2  # the survivors' noise alone meets z·c
    assert m.central_std(survivors) >= z * c and m.central_std(survivors) == pytest.approx(z * c, rel=1e-12)
    assert m.noise_multiplier() == pytest.approx(z, rel=1e-12)

    def k_sigma(gamma):  # k standard deviations of a coordinate of the sum, integer units
        d = m.padded_dim()
        return k * math.sqrt(gamma**2 * c**2 * (parties**2 / d + parties * z**2 / survivors) + parties / 4)

    assert k_sigma(m.scale) <= 2 ** (bits - 1) * (1 + 1e-12)
    if m.local_mu < D.MAX_LOCAL_MU * 0.999:  # the largest such γ (unless capped)
        assert k_sigma(m.scale * 1.001) > 2 ** (bits - 1)
    assert 0 <= m.wrap_probability_bound(parties) <= 1


def test_discrete_epsilon_approaches_the_gaussian_at_large_bits():
    m = _mech(dim=1000, bits=40, parties=8, min_survivors=8, noise_multiplier=1.0)
    assert m.local_mu == pytest.approx(D.MAX_LOCAL_MU)  # the cap binds
    eps = D.epsilon([m], rounds=100, delta=1e-5)
    gauss = epsilon_from_rdp(D.DISCRETE_ORDERS, [100 * a / 2 for a in D.DISCRETE_ORDERS], 1e-5)[0]
    assert gauss <= eps <= 1.001 * gauss


def test_calibrate_for_epsilon_meets_the_budget_tightly():
    kw = dict(delta=1e-5, rounds=30, dim=500, clip=1.0, bits=20, parties=6, min_survivors=4)
    count = _mech(dim=1, clip=0.5, bits=20, parties=6, min_survivors=4, noise_multiplier=20.0)
    for others in ((), (count,)):
        m = D.calibrate_for_epsilon(3.0, others=others, **kw)
        z = m.noise_multiplier()
        assert D.epsilon([m, *others], rounds=30, delta=1e-5) <= 3.0
        below = D.calibrate(
            dim=500, clip=1.0, bits=20, parties=6, min_survivors=4, noise_multiplier=z * (1 - 2e-3)
        )
        assert D.epsilon([below, *others], rounds=30, delta=1e-5) > 3.0
    # at large bits the discrete z is the Gaussian's at the same ε (integer orders) to within 1%
    big = D.calibrate_for_epsilon(3.0, **{**kw, "bits": 40})
    lo, hi = 0.1, 100.0
    while hi - lo > 1e-4:  # bisection on the Gaussian's ε at the same orders
        mid = (lo + hi) / 2
        gauss = epsilon_from_rdp(D.DISCRETE_ORDERS, [30 * a / (2 * mid**2) for a in D.DISCRETE_ORDERS], 1e-5)[
            0
        ]
        lo, hi = (lo, mid) if gauss <= 3.0 else (mid, hi)
    zg = hi
    assert big.noise_multiplier() == pytest.approx(zg, rel=0.01)
    with pytest.raises(ConfigError, match="unreachable"):
        D.calibrate_for_epsilon(1e-6, **kw)


def test_calibrate_refuses_too_few_bits_and_bad_arguments():
    with pytest.raises(ConfigError, match="too few"):
        D.calibrate(dim=100, clip=1.0, bits=2, parties=16, min_survivors=8, noise_multiplier=1.0)
    with pytest.raises(ConfigError, match="too few"):  # the group holds the sum but rounding swamps it
        D.calibrate(dim=100_000, clip=1.0, bits=8, parties=4, min_survivors=4, noise_multiplier=1.0)
    good = dict(dim=10, clip=1.0, bits=16, parties=4, min_survivors=2, noise_multiplier=1.0)
    for key, bad in [
        ("min_survivors", 5),
        ("min_survivors", 0),
        ("parties", 0),
        ("noise_multiplier", -1.0),
        ("noise_multiplier", math.nan),
        ("clip", 0.0),
        ("clip", math.inf),
        ("bits", 63),
        ("dim", 0),
        ("kind", "gauss"),
        ("beta", 1.0),
    ]:
        with pytest.raises(ConfigError):
            D.calibrate(**{**good, key: bad})


# --------------------------------------------------------------------------------------- hostile input
def test_from_dict_round_trips_and_refuses_hostile_input():
    m = _mech()
    d = json.loads(json.dumps(m.to_dict()))
    assert D.DiscreteMechanism.from_dict(d) == m
    assert D.DiscreteMechanism.from_dict({k: v for k, v in d.items() if k != "parties"}).parties == 0
    hostile = [
        ("bits", 0),
        ("bits", 63),
        ("bits", 1000),
        ("bits", 16.0),
        ("bits", True),
        ("bits", "16"),
        ("dim", 0),
        ("dim", 2**40),
        ("dim", None),
        ("clip", math.nan),
        ("clip", -1.0),
        ("clip", "1"),
        ("clip", 10**400),
        ("dim", 10**400),
        ("kind", "x" * 10**6),
        ("scale", math.inf),
        ("scale", 0.0),
        ("scale", 1e300),
        ("local_mu", math.nan),
        ("local_mu", -1.0),
        ("local_mu", 1e30),
        ("beta", 1.0),
        ("beta", [0.5]),
        ("min_survivors", 0),
        ("min_survivors", 10**9),
        ("min_survivors", 5),  # more than the 4 parties
        ("parties", -1),
        ("kind", "gauss"),
        ("kind", 3),
    ]
    for key, value in hostile:
        with pytest.raises(ConfigError):
            D.DiscreteMechanism.from_dict({**d, key: value})
    for bad in (None, [], "x", {**d, "extra": 1}, {k: v for k, v in d.items() if k != "scale"}):
        with pytest.raises(ValueError):  # ConfigError is a ValueError
            D.DiscreteMechanism.from_dict(bad)
