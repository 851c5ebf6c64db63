"""Pooled example-level noise (silofl.privacy.discrete: calibrate_pooled, encode_sum, epsilon per threat):
the decoded sum is the sites' clipped sums plus noise of the pooled target variance; the accountant agrees
with independent computations (dp-accounting's Gaussian RDP and the exact Rényi divergence of the Skellam
distribution) for one and many rounds; a hostile site that adds no noise leaves the honest sites' ε within
the per-threat figure reported."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import RdpAccountant
from scipy import stats
from scipy.special import logsumexp

from silofl.core.errors import ConfigError
from silofl.privacy import discrete as D


def _pooled(**kw) -> D.DiscreteMechanism:
    base = dict(dim=1000, clip=0.5, bits=40, parties=5, min_survivors=4, noise_multiplier=2.0, rows=30)
    base.update(kw)
    return D.calibrate_pooled(**base)


def _site_sums(rng: np.random.Generator, parties: int, rows: int, dim: int, clip: float) -> list[np.ndarray]:
    """Each site's sum of ``rows`` random examples, each clipped to ``clip``."""
    out = []
    for _ in range(parties):
        g = rng.normal(size=(rows, dim)) * rng.uniform(0.1, 3.0, size=(rows, 1)) / math.sqrt(dim)
        g *= np.minimum(1.0, clip / np.linalg.norm(g, axis=1, keepdims=True))
        out.append(g.sum(0))
    return out


def _secure_sum(vectors, mechs, seed: int, rotation_seed: int = 7) -> np.ndarray:
    """What the server decodes: the modular sum of the parties' encodings (the masks cancel)."""
    total = np.zeros(mechs[0].padded_dim(), dtype=np.uint64)
    for k, (x, m) in enumerate(zip(vectors, mechs, strict=True)):
        enc = D.encode_sum(
            x, m, rotation_seed=rotation_seed, rng=D.DiscreteRandom(seed + k), bound=30 * m.clip
        )
        total = D.add_mod(total, enc, m.bits)
    return D.decode(total, mechs[0], rotation_seed=rotation_seed)


def test_the_pooled_mechanism_is_one_example_per_summand_with_plain_rounding():
    m = _pooled()
    assert m.beta == 0 and m.per_party == 1 and m.min_survivors == 4
    # one example's sensitivity: γC + √d′ (the coupled rounding), close to γC at 40 bits
    assert m.l2_sensitivity() == pytest.approx(m.scale * m.clip + math.sqrt(m.padded_dim()))
    assert m.l2_sensitivity() < 1.01 * m.scale * m.clip
    # the survivors floor carries the pooled noise (z·C)²
    assert m.central_std(4) >= 2.0 * 0.5 * (1 - 1e-12)
    assert D.DiscreteMechanism.from_dict(m.to_dict()) == m


def test_the_decoded_sum_is_the_sum_of_the_clipped_sums_plus_noise_of_the_pooled_variance():
    """Five sites, the floor m = 4: the residual of the decoded sum is noise of variance 5·(zC)²/4 per
    coordinate (every site adds (zC)²/m), mean zero, Gaussian-like; rounding is below 10⁻⁶ of it."""
    m = _pooled(dim=4000)
    rng = np.random.default_rng(0)
    sums = _site_sums(rng, 5, 30, 4000, 0.5)
    resid = _secure_sum(sums, [m] * 5, seed=100) - np.sum(sums, axis=0)
    target = 5 * m.local_mu / m.scale**2
    assert target == pytest.approx(5 / 4 * (2.0 * 0.5) ** 2, rel=1e-6)
    n = resid.size
    assert abs(resid.mean()) < 5 * math.sqrt(target / n)
    assert abs(resid.var() - target) < 5 * target * math.sqrt(2 / n)
    assert stats.normaltest(resid).pvalue > 1e-3


def test_encode_sum_refuses_what_the_group_was_not_sized_for():
    m = _pooled(dim=10)
    with pytest.raises(ValueError, match="exceeds its bound"):
        D.encode_sum(np.full(10, 10.0), m, rotation_seed=1, rng=D.DiscreteRandom(0), bound=1.0)
    with pytest.raises(ValueError, match="pooled mechanism"):
        D.encode_sum(
            np.zeros(10), D.calibrate(**_base_calibrate()), rotation_seed=1, rng=D.DiscreteRandom(0), bound=1
        )
    with pytest.raises(ConfigError, match="too few"):  # a model too large for the bits
        _pooled(dim=2**24, bits=16, rows=1000)


def _base_calibrate() -> dict:
    return dict(dim=10, clip=0.5, bits=30, parties=5, min_survivors=4, noise_multiplier=1.0)


@pytest.mark.parametrize("rounds", [1, 50])
def test_the_accountant_matches_dp_accounting_gaussian_rdp_at_fine_resolution(rounds):
    """At 48 bits the rounding and the discreteness cost almost nothing: the discrete ε of ``rounds`` pooled
    rounds lies at or just above dp-accounting's for the Gaussian mechanism of the same z (the noise the
    survivors floor carries), never below."""
    z = 3.0
    m = _pooled(bits=48, noise_multiplier=z, dim=200)
    mine = D.epsilon([m], rounds=rounds, delta=1e-5)
    acc = RdpAccountant(orders=[float(a) for a in D.DISCRETE_ORDERS])
    acc.compose(dp_event.GaussianDpEvent(z), rounds)
    ref = acc.get_epsilon(1e-5)
    assert ref <= mine <= ref * 1.01
    assert D.epsilon([m] * rounds, rounds=1, delta=1e-5) == pytest.approx(mine)


def test_the_skellam_bound_holds_over_the_exact_renyi_divergence_of_one_coordinate():
    """An independent, numerical check of the RDP the accountant uses: the exact Rényi divergence of a
    Skellam of variance V shifted by an integer Δ from the unshifted one (scipy's pmf) lies at or below
    :func:`D.skellam_rdp` with L1 = L2 = Δ, and close to it."""
    for var, shift in ((50.0, 3), (400.0, 8)):
        dist = stats.skellam(var / 2, var / 2)
        k = np.arange(-int(30 * math.sqrt(var)), int(30 * math.sqrt(var)) + 1)
        lp, lq = dist.logpmf(k - shift), dist.logpmf(k)
        for a in (2, 4, 8):
            exact = float(logsumexp(a * lp + (1 - a) * lq)) / (a - 1)
            bound = float(D.skellam_rdp([a], l1=shift, l2=shift, variance=var)[0])
            assert exact <= bound * (1 + 1e-9) and bound <= exact * 1.5 + 1e-3


def test_per_threat_epsilons_count_only_the_honest_survivors():
    m = _pooled()
    t = D.epsilon_per_threat([m], rounds=10, delta=1e-5, colluders=1)
    assert t["outsiders"] == t["server"] == D.epsilon([m], rounds=10, delta=1e-5)
    assert t["colluders"] == D.epsilon([m], rounds=10, delta=1e-5, survivors=3) > t["server"]
    assert D.epsilon([m], rounds=1, delta=1e-5, colluders=4) == math.inf
    with pytest.raises(ConfigError):
        D.epsilon([m], rounds=1, delta=1e-5, colluders=-1)


def test_a_hostile_site_adding_no_noise_lowers_the_honest_epsilon_only_to_the_colluder_figure():
    """Five sites, floor m = 4, every site assumes c = 1 colluder. One site masks its sum with no noise:
    the noise measured in the decoded sum is that of the four honest shares — at least the m − c = 3 the
    colluder figure counts — so the honest sites' true ε (their measured noise through the same bound) is
    at most the figure they reported against the server plus one colluder."""
    m = _pooled(dim=4000)
    hostile = D.DiscreteMechanism.from_dict({**m.to_dict(), "local_mu": 0.0})
    sums = _site_sums(np.random.default_rng(1), 5, 30, 4000, 0.5)
    resid = _secure_sum(sums, [m, m, m, m, hostile], seed=200) - np.sum(sums, axis=0)
    measured_shares = resid.var() * m.scale**2 / m.local_mu
    assert measured_shares == pytest.approx(4.0, rel=0.1)
    reported = D.epsilon_per_threat([m], rounds=20, delta=1e-5, colluders=1)
    true = D.epsilon([m], rounds=20, delta=1e-5, survivors=math.floor(measured_shares * 0.95))
    assert reported["server"] < true <= reported["colluders"]


def test_budget_first_calibration_of_the_pooled_mechanism_meets_the_target():
    m = D.calibrate_for_epsilon(
        3.0, delta=1e-5, rounds=20, dim=500, clip=0.1, bits=32, parties=8, min_survivors=7, rows=1000
    )
    assert m.beta == 0
    eps = D.epsilon([m], rounds=20, delta=1e-5)
    assert 2.99 < eps <= 3.0
