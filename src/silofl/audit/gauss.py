"""A Gaussian-sum estimate of ε from canary scores (beside the Steinke–Nasr–Jagielski bound).

The idea of "Let's Ask Gauss: Improved One-Run Privacy Auditing" (Agrawal et al., arXiv 2606.12733): a
white-box
auditor's canary-aligned score is a *sum* over many steps (Σ_t ⟨g̃_t, u_i⟩ for DP-SGD's noisy gradients), so
it is
asymptotically Gaussian; rather than thresholding scores into guesses (which throws away how far apart the
included and excluded canaries are), estimate the Gaussian-DP parameter μ from the separation of the two
groups
and convert it to ε at the run's δ.

**This is silofl's own "natural version", written without the paper's text or code** (neither could be found
here), and it was *not* checked against the paper's worked figures. What it computes:

* μ̂ = (mean of included scores − mean of excluded scores) / pooled standard deviation — the separation of two
  equal-variance Gaussians N(0, 1) and N(μ, 1), the trade-off curve of μ-GDP (Dong, Roth & Su 2019);
* a one-sided lower confidence limit μ_lo = μ̂ − z_{confidence} · SE(μ̂), with the large-sample standard error
of
  a standardised mean difference, SE² = 1/n_in + 1/n_out + μ̂² / (2 (n_in + n_out − 2));
* ε = the ε at which μ_lo-GDP meets δ: δ = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (Dong et al., Corollary 2.13).

It is an *estimate* resting on the scores being (close to) Gaussian with equal variance in both groups and on
the
canaries being independent — the CLT regime of many steps with orthogonal (Dirac) canaries. Unlike the SNJ
bound
it is not a guarantee that holds with the stated confidence whatever the score distributions; silofl therefore
always reports it next to the SNJ bound, never instead of it.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, stats


def gdp_delta(mu: float, eps: float) -> float:
    """δ(ε) of μ-GDP: Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)."""
    if mu <= 0:
        return 0.0
    return float(stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest ε ≥ 0 with δ(ε) ≤ ``delta`` for μ-GDP (0 when μ ≤ 0 or δ(0) ≤ δ already)."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    if not mu > 0 or gdp_delta(mu, 0.0) <= delta:
        return 0.0
    hi = 1.0
    while gdp_delta(mu, hi) > delta:
        hi *= 2.0
        if hi > 1e4:
            return math.inf
    return float(optimize.brentq(lambda e: gdp_delta(mu, e) - delta, 0.0, hi, xtol=1e-10))


def gauss_estimate(scores: np.ndarray, included: np.ndarray, delta: float, confidence: float = 0.95) -> dict:
    """μ̂ and its lower confidence limit from included vs excluded canaries' scores; ε at ``delta`` (module
    doc)."""
    s = np.asarray(scores, float)
    inc = np.asarray(included, bool)
    a, b = s[inc], s[~inc]
    n1, n0 = len(a), len(b)
    if n1 < 2 or n0 < 2:
        raise ValueError("the Gaussian estimate needs at least two included and two excluded canaries")
    pooled = math.sqrt(((n1 - 1) * a.var(ddof=1) + (n0 - 1) * b.var(ddof=1)) / (n1 + n0 - 2))
    mu = float((a.mean() - b.mean()) / pooled) if pooled > 0 else (math.inf if a.mean() > b.mean() else 0.0)
    se = math.sqrt(1 / n1 + 1 / n0 + (mu**2 if math.isfinite(mu) else 0.0) / (2 * (n1 + n0 - 2)))
    z = float(stats.norm.ppf(confidence))
    mu_lo = max(0.0, mu - z * se) if math.isfinite(mu) else math.inf
    return {
        "estimator": "Gaussian sum (GDP μ from the included/excluded separation; silofl's version of Agrawal "
        "et al., "
        "not checked against the paper's figures)",
        "mu_hat": mu,
        "mu_standard_error": se,
        "mu_lower": mu_lo,
        "confidence": confidence,
        "delta": delta,
        "epsilon_point": gdp_epsilon(mu, delta) if math.isfinite(mu) else math.inf,
        "epsilon_estimate": gdp_epsilon(mu_lo, delta) if math.isfinite(mu_lo) else math.inf,
        "included": n1,
        "excluded": n0,
    }
