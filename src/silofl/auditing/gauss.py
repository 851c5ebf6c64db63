"""The Gaussian-pair estimate of ε from canary scores, beside the Steinke–Nasr–Jagielski bound.

**The paper.** Agrawal, Wei, Singh, Magdon-Ismail & Zikas, "Let's Ask Gauss: Improved One-Run Privacy
Auditing" (arXiv 2606.12733, v1, June 2026). What of it could be read here: the abstract and the opening of
§1 (every search of the stored copy of arxiv.org/html/2606.12733 returned only that part, whatever the query:
method, algorithm, tables), and three secondary summaries of its method (arxivlens.com, newx.sg and a
machine-written digest of June 2026 arXiv papers); no code of the paper was found. What they say the method
is:

1. in white-box DP-SGD, the canary-aligned signals (each step's noisy gradient projected on a canary) form a
   sequence whose normalised sum is asymptotically Gaussian (a CLT, with a rate);
2. so instead of thresholding scores into IN/OUT guesses (SNJ), the auditor "models the present and absent
   canary score distributions as a pair of one-dimensional Gaussians and uses the closed-form hockey-stick
   divergence between Gaussians" to get ε at δ;
3. the Gaussians' parameters are estimated with confidence intervals (the digest names bootstrap and
   Bonferroni intervals and a numerical optimisation), so the reported ε holds at the stated confidence
   *under the Gaussian model*.

The closed form for a pair of Gaussians with arbitrary means and variances is the "Normal Distributions
Indistinguishability Spectrum" (NDIS) of Wei, Lu, Magdon-Ismail & Zikas (arXiv 2309.01243) — the same group.

**What silofl computes** (:func:`gauss_estimate`):

* present (included) scores ~ N(μ₁, σ₁²) and absent (excluded) scores ~ N(μ₀, σ₀²), fitted by the sample means
  and unbiased variances — unequal variances allowed (an included canary's score also carries the variance of
  its Poisson sampling);
* ε(μ₁, σ₁, μ₀, σ₀; δ): the smallest ε ≥ 0 with max(H_{e^ε}(P₁‖P₀), H_{e^ε}(P₀‖P₁)) ≤ δ, H the hockey-stick
  divergence of the two Gaussians in closed form (:func:`pair_delta`: the set where one density exceeds
  e^ε times the other is bounded by the roots of a quadratic; with equal variances it is μ-GDP's
  δ = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2), μ = |μ₁ − μ₀| / σ, Dong, Roth & Su 2019, Cor. 2.13);
* the confidence step: a box of four intervals, each at level 1 − β/4 (Bonferroni, β = 1 − confidence):
  Student-t intervals for μ₁ and μ₀, χ² intervals for σ₁² and σ₀²; the reported ε is the **minimum of ε over
  the box** (a grid over the box, refined twice around its best point). If the scores in each group are
  independent Gaussians, ε_lower ≤ ε(true parameters) with probability ≥ confidence.

**Where silofl departs or could not check.**

* The paper's worked figures could not be reproduced: the readable text holds no table or example with its
  inputs. The one figure the summaries quote (a lower bound of about 6.7 at ε = 8, WideResNet-16-4 DP-SGD on
  CIFAR-10) needs a CIFAR-10 training run with the paper's canary count, steps and sampling rate, which the
  readable text does not give, and far more compute than this project's shared CPUs. The tests therefore check
  the arithmetic against independent references instead (numerical integration of the hockey-stick divergence,
  Dong et al.'s μ-GDP closed form, dp-accounting's Gaussian mechanism) and the confidence step by simulation.
* The paper's confidence step may differ (bootstrap ellipse rather than a Bonferroni box); a box is the more
  conservative of the two at the same confidence.
* Like the paper's, this is an estimate under the Gaussian model and the canaries' independence — not a
  guarantee whatever the score distributions, as the SNJ bound is. silofl reports it next to the SNJ bound,
  never instead of it.

``mu_hat`` / ``mu_standard_error`` (the pooled standardised separation and its large-sample SE) are kept as a
diagnostic: what the per-step sum separates by, to compare with q·√T/σ.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import optimize, special, stats

EPS_CAP = 700.0  # e^ε stays finite in float64; an ε above this is reported as inf


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


def _mass(lo, hi, m, s):
    """P(lo < X < hi) for X ~ N(m, s²), elementwise, without cancellation in either tail."""
    a, b = (lo - m) / s, (hi - m) / s
    upper = a > 0  # both ends in the upper tail: use the mirrored lower tail
    return np.where(upper, special.ndtr(-a) - special.ndtr(-b), special.ndtr(b) - special.ndtr(a))


@np.errstate(divide="ignore", invalid="ignore", over="ignore")
def _one_way(m1, s1, m0, s0, eps):
    """H_{e^ε}(N(m1, s1²) ‖ N(m0, s0²)) = P₁(A) − e^ε P₀(A), A = {p₁ > e^ε p₀} (NDIS, one dimension).

    log p₁ − log p₀ − ε = a x² + b x + c with a = 1/(2 s0²) − 1/(2 s1²): A is a half-line (a = 0), the outside
    of the roots (a > 0) or the inside (a < 0)."""
    m1, s1, m0, s0, eps = np.broadcast_arrays(*(np.asarray(v, float) for v in (m1, s1, m0, s0, eps)))
    a = 0.5 / s0**2 - 0.5 / s1**2
    b = m1 / s1**2 - m0 / s0**2
    c = -0.5 * m1**2 / s1**2 + 0.5 * m0**2 / s0**2 + np.log(s0 / s1) - eps
    gamma = np.exp(np.minimum(eps, EPS_CAP))
    inf = np.full(a.shape, np.inf)
    scale = np.maximum(1.0 / s0**2, 1.0 / s1**2)
    flat = np.abs(a) <= 1e-12 * scale
    # a = 0: b x + c > 0 (b = 0: A is everything or nothing)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = -c / b
    lo_lin = np.where(b > 0, t, -inf)
    hi_lin = np.where(b > 0, inf, t)
    lin = np.where(
        b == 0,
        np.where(c > 0, 1.0 - gamma, 0.0),
        _mass(lo_lin, hi_lin, m1, s1) - gamma * _mass(lo_lin, hi_lin, m0, s0),
    )
    # a ≠ 0: the roots, by the cancellation-free form
    disc = b**2 - 4 * a * c
    root = np.sqrt(np.maximum(disc, 0.0))
    q = -0.5 * (b + np.where(b >= 0, root, -root))
    with np.errstate(divide="ignore", invalid="ignore"):
        r1, r2 = q / a, np.where(q != 0, c / q, 0.0)
    r_lo, r_hi = np.minimum(r1, r2), np.maximum(r1, r2)
    inside = _mass(r_lo, r_hi, m1, s1) - gamma * _mass(r_lo, r_hi, m0, s0)
    outside = (
        _mass(-inf, r_lo, m1, s1)
        + _mass(r_hi, inf, m1, s1)
        - gamma * (_mass(-inf, r_lo, m0, s0) + _mass(r_hi, inf, m0, s0))
    )
    quad = np.where(
        a > 0,
        np.where(disc <= 0, 1.0 - gamma, outside),  # no roots, a > 0: A is the whole line
        np.where(disc <= 0, 0.0, inside),  # no roots, a < 0: A is empty
    )
    return np.maximum(np.where(flat, lin, quad), 0.0)


def pair_delta(m1, s1, m0, s0, eps):
    """δ(ε) of the pair N(m1, s1²), N(m0, s0²): the larger hockey-stick divergence of the two directions."""
    return np.maximum(_one_way(m1, s1, m0, s0, eps), _one_way(m0, s0, m1, s1, eps))


def pair_epsilon(m1, s1, m0, s0, delta: float, iterations: int = 40) -> np.ndarray:
    """The smallest ε ≥ 0 with :func:`pair_delta` ≤ ``delta``, elementwise (bisection; inf above
    :data:`EPS_CAP`)."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    m1, s1, m0, s0 = np.broadcast_arrays(*(np.asarray(v, float) for v in (m1, s1, m0, s0)))
    lo = np.zeros(m1.shape)
    done = pair_delta(m1, s1, m0, s0, lo) <= delta
    hi = np.ones(m1.shape)
    while True:
        over = (pair_delta(m1, s1, m0, s0, hi) > delta) & ~done & (hi < EPS_CAP)
        if not over.any():
            break
        hi = np.where(over, np.minimum(hi * 2.0, EPS_CAP), hi)
    capped = (pair_delta(m1, s1, m0, s0, hi) > delta) & ~done
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        ok = pair_delta(m1, s1, m0, s0, mid) <= delta
        hi, lo = np.where(ok, mid, hi), np.where(ok, lo, mid)
    return np.where(done, 0.0, np.where(capped, np.inf, hi))


def confidence_box(a: np.ndarray, b: np.ndarray, confidence: float) -> dict:
    """Bonferroni box for (μ₁, σ₁, μ₀, σ₀) at ``confidence``: four two-sided intervals at 1 − β/4 each."""
    beta4 = (1.0 - confidence) / 4
    box = {}
    for tag, x in (("1", a), ("0", b)):
        n = len(x)
        m, v = float(x.mean()), float(x.var(ddof=1))
        t = float(stats.t.ppf(1 - beta4 / 2, n - 1))
        half = t * math.sqrt(v / n)
        chi_hi, chi_lo = stats.chi2.ppf(1 - beta4 / 2, n - 1), stats.chi2.ppf(beta4 / 2, n - 1)
        box[f"mu{tag}"] = (m - half, m + half)
        box[f"sigma{tag}"] = (math.sqrt((n - 1) * v / chi_hi), math.sqrt((n - 1) * v / chi_lo))
    return box


def _box_minimum(box: dict, delta: float, grid: int = 7, zooms: int = 2) -> tuple[float, dict]:
    """min of ε over the box: ε depends on μ₁ − μ₀, σ₁, σ₀; a grid over those, refined ``zooms`` times."""
    d_lo = box["mu1"][0] - box["mu0"][1]
    d_hi = box["mu1"][1] - box["mu0"][0]
    ranges = [(d_lo, d_hi), box["sigma1"], box["sigma0"]]
    best, arg = math.inf, (0.0, 1.0, 1.0)
    for _ in range(zooms + 1):
        axes = [np.unique(np.append(np.linspace(lo, hi, grid), np.clip(0.0, lo, hi))) for lo, hi in ranges]
        d, s1, s0 = np.meshgrid(*axes, indexing="ij")
        e = pair_epsilon(d, s1, np.zeros_like(d), s0, delta)
        i = np.unravel_index(int(np.argmin(e)), e.shape)
        if e[i] <= best:
            best, arg = float(e[i]), (float(d[i]), float(s1[i]), float(s0[i]))
        # zoom: a quarter of each range around the best point, inside the box
        ranges = [
            (max(lo, x - (hi - lo) / 4), min(hi, x + (hi - lo) / 4))
            for (lo, hi), x in zip(ranges, arg, strict=True)
        ]
    return best, {"mean_gap": arg[0], "sigma_in": arg[1], "sigma_out": arg[2]}


def gauss_estimate(scores: np.ndarray, included: np.ndarray, delta: float, confidence: float = 0.95) -> dict:
    """The Gaussian-pair ε (point and lower confidence value) from included vs excluded canaries' scores
    (module doc)."""
    s = np.asarray(scores, float)
    inc = np.asarray(included, bool)
    a, b = s[inc], s[~inc]
    n1, n0 = len(a), len(b)
    if n1 < 2 or n0 < 2:
        raise ValueError("the Gaussian estimate needs at least two included and two excluded canaries")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    v1, v0 = float(a.var(ddof=1)), float(b.var(ddof=1))
    pooled = math.sqrt(((n1 - 1) * v1 + (n0 - 1) * v0) / (n1 + n0 - 2))
    gap = float(a.mean() - b.mean())
    mu = gap / pooled if pooled > 0 else (math.inf if gap > 0 else 0.0)
    se = math.sqrt(1 / n1 + 1 / n0 + (mu**2 if math.isfinite(mu) else 0.0) / (2 * (n1 + n0 - 2)))
    out: dict[str, Any] = {
        "estimator": "Gaussian pair (Agrawal et al. 2026): present/absent scores as two Gaussians, ε from "
        "their hockey-stick divergence, minimised over a Bonferroni confidence box (silofl.auditing.gauss)",
        "mean_in": float(a.mean()),
        "mean_out": float(b.mean()),
        "sigma_in": math.sqrt(v1),
        "sigma_out": math.sqrt(v0),
        "mu_hat": mu,
        "mu_standard_error": se,
        "confidence": confidence,
        "delta": delta,
        "included": n1,
        "excluded": n0,
    }
    if v1 <= 0 or v0 <= 0:  # degenerate scores (every canary identical in a group): no Gaussian to fit
        sep = gap > 0
        out.update(
            mu_lower=math.inf if sep else 0.0,
            epsilon_point=math.inf if sep else 0.0,
            epsilon_estimate=math.inf if sep else 0.0,
            confidence_box=None,
            at_minimum=None,
            epsilon_point_unbounded=sep,
            epsilon_estimate_unbounded=sep,
        )
        return out
    box = confidence_box(a, b, confidence)
    eps_lo, at = _box_minimum(box, delta)
    point = float(pair_epsilon(gap, math.sqrt(v1), 0.0, math.sqrt(v0), delta))
    out.update(
        mu_lower=max(0.0, mu - float(stats.norm.ppf(confidence)) * se),
        epsilon_point=point,
        epsilon_estimate=eps_lo,
        confidence_box={k: list(v) for k, v in box.items()},
        at_minimum=at,
    )
    out["epsilon_cap"] = EPS_CAP  # an ε above it is reported as "> EPS_CAP" (null in audit.json)
    out["epsilon_point_unbounded"] = math.isinf(out["epsilon_point"])
    out["epsilon_estimate_unbounded"] = math.isinf(out["epsilon_estimate"])
    return out


def epsilon_text(g: dict | None, key: str = "epsilon_estimate", nd: int = 3) -> str:
    """A Gaussian-pair ε for a report: ``nd`` decimals; "> 700" where ε is above :data:`EPS_CAP`, where the
    solve stops (the fitted Gaussians barely overlap; audit.json holds null and ``<key>_unbounded``); — where
    there is none."""
    if not g:
        return "—"
    v = g.get(key)
    if g.get(f"{key}_unbounded") or (isinstance(v, float) and math.isinf(v)):
        return f"> {EPS_CAP:g}"
    return "—" if v is None else f"{v:.{nd}f}"


def epsilon_value(g: dict, key: str = "epsilon_estimate") -> float | None:
    """The figure to compare with an accountant's ε: :data:`EPS_CAP` for an estimate above it (so it counts as
    exceeding only an accountant ε below the cap), else the value (None where there is none)."""
    if g.get(f"{key}_unbounded"):
        return EPS_CAP
    v = g.get(key)
    return None if v is None else float(v)
