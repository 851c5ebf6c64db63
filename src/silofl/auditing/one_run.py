"""One-run empirical lower bound on ε (Steinke, Nasr & Jagielski, "Privacy Auditing with One (1)
Training Run", NeurIPS 2023, arXiv:2305.08846).

Vendored into silofl (numpy + scipy only) from the validated research module behind issue 17: it was
checked against the authors' Appendix D listing and Google DeepMind's jax_privacy 2.0.0
``auditing.py`` (p-values equal to 1e-15; bounds to the bisection tolerance) and against the numbers the
paper prints. No maintained package fits a torch-only project: jax_privacy needs jax, and
tensorflow-privacy pins TensorFlow; the module is small enough to own. The reference values are
re-checked by ``tests/auditing/test_one_run.py`` against an independent re-typing of Appendix D.

Written from the formula in the paper (no code copied from either reference).

Setting
-------
There are m canaries. Each is included on its own with probability 1/2:
S_i in {-1, +1}. The auditor sees only what the mechanism releases, computes a
score per canary and makes guesses T_i in {-1, 0, +1}. A 0 means "abstain":
the auditor makes no guess for that canary.
    r = #{i : T_i != 0}            (guesses made)
    v = #{i : T_i == S_i}          (correct guesses)

Null hypothesis H0: the mechanism is (eps, delta)-DP with respect to each canary.
Let q = e^eps / (1 + e^eps) = sigmoid(eps) and X ~ Binomial(r, q). Under H0,
the paper's main theorem gives

    P[V >= v] <= P[X >= v] + 2 m delta * max_{1 <= i <= v} P[v - i <= X < v] / i.

The right-hand side is the p-value ``p_value(m, r, v, eps, delta)``. The audited
lower bound is the largest eps that this p-value rejects at level beta:

    eps_lb = sup{ eps >= 0 : p_value(m, r, v, eps, delta) < beta }.

This holds with probability >= 1 - beta over the canary coins and the
mechanism's randomness.

When delta = 0 there is a closed form:
eps_lb = logit(q*), where q* solves P[Binomial(r, q*) >= v] = beta,
i.e. q* = betaincinv(v, r - v + 1, beta).

Note on the search: the delta term is not monotone in eps. For v close to r,
P[X < v] falls as eps grows, so a plain bisection (as in Appendix D) can in
principle stop below the supremum. Stopping there is still valid, only
conservative. Here we scan a grid on [0, eps_pure] and then bisect the last
crossing, where eps_pure is the delta = 0 bound (an upper bound on the
supremum, because the delta term is >= 0).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from scipy import special, stats

__all__ = [
    "p_value",
    "eps_lower_bound",
    "eps_lower_bound_pure",
    "max_auditable_eps",
    "make_guesses",
    "count_guesses",
    "AuditResult",
    "audit",
]


# ----------------------------------------------------------------------------
# Core statistics
# ----------------------------------------------------------------------------


def _check_counts(m: int, r: int, v: int) -> None:
    for name, x in (("m", m), ("r", r), ("v", v)):
        if int(x) != x:
            raise ValueError(f"{name} must be an integer, got {x!r}")
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= v <= r <= m, got m={m}, r={r}, v={v}")
    if m < 1:
        raise ValueError("need at least one canary")


def p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """p-value of observing >= v correct out of r guesses (m canaries) under
    the null hypothesis that the mechanism is (eps, delta)-DP.

    p = P[X >= v] + 2 m delta max_{1<=i<=v} P[v-i <= X <= v-1] / i,
    where X ~ Binomial(r, sigmoid(eps)). The result is clipped to 1.
    """
    _check_counts(m, r, v)
    if eps < 0 or not math.isfinite(eps):
        raise ValueError(f"eps must be finite and >= 0, got {eps}")
    if not 0 <= delta <= 1:
        raise ValueError(f"delta must be in [0, 1], got {delta}")
    if v == 0:
        return 1.0
    q = float(special.expit(eps))
    tail = float(stats.binom.sf(v - 1, r, q))  # P[X >= v]
    if delta == 0:
        return min(tail, 1.0)
    # Sum pmf(v-1), pmf(v-2), ..., pmf(0). Partial sum i is P[v-i <= X <= v-1].
    # Summing pmfs avoids the cancellation of sf(v-i-1) - sf(v-1).
    ks = np.arange(v - 1, -1, -1)
    window = np.cumsum(stats.binom.pmf(ks, r, q))
    alpha = float(np.max(window / np.arange(1, v + 1)))
    return min(tail + 2.0 * m * delta * alpha, 1.0)


def _p_values_on_grid(m: int, r: int, v: int, eps_grid: np.ndarray, delta: float) -> np.ndarray:
    """p_value() at many eps values at once (same formula, vectorised)."""
    q = special.expit(np.asarray(eps_grid, dtype=float))
    tail = stats.binom.sf(v - 1, r, q)
    ks = np.arange(v - 1, -1, -1, dtype=float)[:, None]
    # log pmf written out (much faster than scipy.stats.binom.pmf on a matrix)
    logpmf = (
        special.gammaln(r + 1)
        - special.gammaln(ks + 1)
        - special.gammaln(r - ks + 1)
        + special.xlogy(ks, q[None, :])
        + special.xlog1py(r - ks, -q[None, :])
    )
    window = np.cumsum(np.exp(logpmf), axis=0)
    alpha = np.max(window / np.arange(1, v + 1)[:, None], axis=0)
    return np.minimum(tail + 2.0 * m * delta * alpha, 1.0)


def eps_lower_bound_pure(r: int, v: int, beta: float = 0.05) -> float:
    """Closed form for the delta = 0 bound: logit(q*) with P[Bin(r,q*) >= v] = beta.

    Returns 0 if no eps >= 0 is rejected. Returns +inf never: for v = r = 0 -> 0.
    """
    if not 0 < beta < 1:
        raise ValueError("beta must be in (0, 1)")
    if v == 0 or r == 0:
        return 0.0
    # P[Bin(r, q) >= v] = I_q(v, r - v + 1) (regularized incomplete beta).
    q_star = float(special.betaincinv(v, r - v + 1, beta))
    if q_star <= 0.5:
        return 0.0
    if q_star >= 1.0:
        return math.inf
    return float(special.logit(q_star))


def eps_lower_bound(
    m: int,
    r: int,
    v: int,
    delta: float,
    beta: float = 0.05,
    *,
    grid_points: int = 200,
    tol: float = 1e-7,
) -> float:
    """Largest eps such that (eps, delta)-DP is rejected at level beta.

    Args:
      m: number of canaries, each included independently with probability 1/2.
      r: number of guesses made (no abstention).
      v: number of correct guesses.
      delta: the delta of the (eps, delta)-DP claim being audited.
      beta: significance level; the bound holds with confidence 1 - beta.

    Returns:
      eps_lb >= 0. The mechanism is not (eps, delta)-DP for any eps < eps_lb,
      with confidence 1 - beta.
    """
    _check_counts(m, r, v)
    if not 0 <= delta <= 1:
        raise ValueError(f"delta must be in [0, 1], got {delta}")
    eps_pure = eps_lower_bound_pure(r, v, beta)
    if delta == 0 or eps_pure == 0.0:
        # For delta > 0 the p-value is >= the pure one, so no eps > eps_pure
        # (and no eps at all if eps_pure == 0) can be rejected.
        return eps_pure
    eps_hi = eps_pure
    if not math.isfinite(eps_hi):  # cannot happen for r >= 1, but be safe
        eps_hi = 50.0
    grid = np.linspace(0.0, eps_hi, grid_points + 1)
    pv = _p_values_on_grid(m, r, v, grid, delta)
    below = np.flatnonzero(pv < beta)
    if below.size == 0:
        return 0.0
    j = int(below[-1])
    if j == grid_points:  # p < beta right up to eps_pure (numerically)
        return float(grid[j])
    lo, hi = float(grid[j]), float(grid[j + 1])
    while hi - lo > tol:  # invariant: p(lo) < beta <= p(hi)
        mid = 0.5 * (lo + hi)
        if p_value(m, r, v, mid, delta) < beta:
            lo = mid
        else:
            hi = mid
    return lo


def max_auditable_eps(m: int, r: int, delta: float, beta: float = 0.05) -> float:
    """The bound when all r guesses are correct: the most this audit can show."""
    return eps_lower_bound(m, r, r, delta, beta)


# ----------------------------------------------------------------------------
# Guessing with abstention
# ----------------------------------------------------------------------------


def make_guesses(
    scores: Sequence[float] | np.ndarray,
    k_pos: int,
    k_neg: int,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """Guess +1 (IN) for the k_pos highest scores, -1 (OUT) for the k_neg
    lowest, and 0 (abstain) for the rest. Higher score must mean "more
    likely IN".

    Ties are broken by a random permutation drawn from ``rng``. That is
    independent of the canary coins, so the guesses stay a function of the
    released output plus independent randomness, as the theorem needs.
    """
    y = np.asarray(scores, dtype=float)
    m = y.size
    if k_pos < 0 or k_neg < 0 or k_pos + k_neg > m:
        raise ValueError(f"need k_pos, k_neg >= 0 and k_pos + k_neg <= m={m}")
    if np.any(np.isnan(y)):
        raise ValueError("scores contain NaN")
    rng = np.random.default_rng() if rng is None else rng
    tiebreak = rng.permutation(m)
    order = np.lexsort((tiebreak, y))  # ascending by score, ties random
    t = np.zeros(m, dtype=np.int8)
    if k_neg:
        t[order[:k_neg]] = -1
    if k_pos:
        t[order[m - k_pos :]] = +1
    return t


def count_guesses(
    guesses: Sequence[int] | np.ndarray, included: Sequence[bool] | np.ndarray
) -> tuple[int, int]:
    """(r, v): guesses made and correct guesses. ``included[i]`` is True if
    canary i was IN (S_i = +1)."""
    t = np.asarray(guesses)
    s = np.where(np.asarray(included, dtype=bool), 1, -1)
    if t.shape != s.shape:
        raise ValueError("guesses and included must have the same shape")
    r = int(np.count_nonzero(t))
    v = int(np.count_nonzero((t != 0) & (t == s)))
    return r, v


@dataclasses.dataclass(frozen=True)
class AuditResult:
    eps_lb: float
    m: int
    r: int
    v: int
    k_pos: int
    k_neg: int
    delta: float
    beta: float  # significance used for this bound (after correction)
    n_hypotheses: int  # number of (k_pos, k_neg) candidates tried (Bonferroni)


def audit(
    scores: Sequence[float] | np.ndarray,
    included: Sequence[bool] | np.ndarray,
    k_pos: int,
    k_neg: int,
    delta: float,
    beta: float = 0.05,
    rng: np.random.Generator | None = None,
) -> AuditResult:
    """One audit with (k_pos, k_neg) fixed in advance. This is valid as is."""
    t = make_guesses(scores, k_pos, k_neg, rng)
    r, v = count_guesses(t, included)
    m = len(t)
    return AuditResult(eps_lower_bound(m, r, v, delta, beta), m, r, v, k_pos, k_neg, delta, beta, 1)
