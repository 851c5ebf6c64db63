"""Pure privacy analysis of hyperparameter tuning by random repetition (Papernot & Steinke, "Hyperparameter
Tuning with Renyi Differential Privacy", ICLR 2022, arXiv:2110.03620 v2). No state lives here, as in
:mod:`silofl.privacy.analysis`.

The tuned algorithm A draws a number K of trials from a distribution fixed in advance and independent of the
data, runs K independent trials of one randomized algorithm Q (a trial: draw settings, train, score on data
that is not private), and releases only the best trial's output — never K, never the other trials. If K = 0
(possible for the Poisson distribution only) A releases a fixed output ⊥ ("nothing"). "Best" must be a total
order on Q's outputs (ties broken by a fixed rule or by uniform chance, not by anything private).

**Theorem 2 (truncated negative binomial).** Let Q be (λ, ε)-RDP and (λ̂, ε̂)-RDP with λ ∈ (1, ∞), λ̂ ∈ [1,
∞); let η ∈ (−1, ∞), γ ∈ (0, 1) and K ~ D_{η,γ}: P[K = k] = (1 − γ)^k / (γ^{−η} − 1) · ∏_{ℓ=0}^{k−1} (ℓ +
η)/(ℓ + 1) for k ≥ 1 (η = 0, logarithmic: P[K = k] = (1 − γ)^k / (k · log(1/γ)); η = 1, geometric: P[K = k] =
γ(1 − γ)^{k−1}). Then A is (λ, ε')-RDP with

    ε' = ε + (1 + η)(1 − 1/λ̂) ε̂ + (1 + η) log(1/γ)/λ̂ + log(E[K])/(λ − 1),

E[K] = η(1 − γ)/(γ(1 − γ^η)) (η ≠ 0), (1/γ − 1)/log(1/γ) (η = 0). K ≥ 1 always.

**Theorem 6 (Poisson).** Let Q be (λ, ε)-RDP and (ε̂, δ̂)-DP with λ ∈ (1, ∞), and K ~ Poisson(μ). If
e^{ε̂} ≤ 1 + 1/(λ − 1), A is (λ, ε')-RDP with

    ε' = ε + μ δ̂ + log(μ)/(λ − 1).

Here ε̂ = log(1 + 1/(λ − 1)) (the largest the condition allows) and δ̂ is Q's δ at ε̂ from its own RDP curve
(:func:`silofl.privacy.analysis.delta_from_rdp`). P[K = 0] = e^{−μ}. silofl takes μ ≥ 1 only, as
``dp_accounting`` does: below 1 the formula is not an upper bound (see :func:`poisson`).

Both are applied at every order of Q's RDP curve (λ̂ minimised over the curve's orders ≥ 1), and then RDP's
monotonicity in λ (D_λ is non-decreasing in λ) lowers each order to the smallest value at any order above it,
as Google's ``dp_accounting`` does (``_compute_rdp_repeat_and_select``, which these functions are tested
against). The tuned curve goes to (ε, δ) by the conversion every ε of silofl's ``rdp`` accountant uses.

**Trials with different settings.** Q must be one algorithm: when a trial first draws its settings uniformly
from a grid, Q is the mixture over the grid, and by the joint quasi-convexity of Rényi divergence (van Erven &
Harremoës 2014, Thm. 13) its RDP curve is at most the pointwise maximum of every grid setting's curve — of
every setting, not only of those drawn.

**A cap on K.** Running at most ``cap`` trials (K' = min(K, cap)) changes A's output only when K > cap, an
event of
probability τ = P[K > cap] independent of the data. Coupling A and the capped A' on the same draws gives
|P[A'(x) ∈ S] − P[A(x) ∈ S]| ≤ τ for every event S, so if A is (ε, δ₀)-DP, A' is (ε, δ₀ + (1 + e^ε)τ)-DP.
:func:`repeat_and_select_epsilon` reports the ε at which δ₀ + (1 + e^ε)τ equals the δ asked for, and refuses
when τ is too large for that δ. The capped algorithm's guarantee is an (ε, δ) one, not an RDP curve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from silofl.core.errors import ConfigError
from silofl.privacy.analysis import delta_from_rdp, epsilon_from_rdp

DISTRIBUTIONS = ("poisson", "negbin", "geometric", "logarithmic")
SOURCE = (
    "Papernot & Steinke, Hyperparameter Tuning with Renyi Differential Privacy, ICLR 2022 "
    "(arXiv:2110.03620 v2)"
)


@dataclass(frozen=True)
class TrialCount:
    """The distribution of the number K of trials: Poisson(μ) (``kind="poisson"``) or the truncated negative
    binomial D_{η,γ} (``kind="negbin"``; η = 0 logarithmic, η = 1 geometric). Build it with :func:`poisson`,
    :func:`truncated_negative_binomial`, :func:`geometric`, :func:`logarithmic` or
    :func:`parse_trial_count`."""

    kind: str
    mu: float = math.nan
    eta: float = math.nan
    gamma: float = math.nan

    @property
    def name(self) -> str:
        """How the distribution is written on the command line (``poisson:4``, ``geometric:0.25``, …)."""
        if self.kind == "poisson":
            return f"poisson:{self.mu:g}"
        if self.eta == 1:
            return f"geometric:{self.gamma:g}"
        if self.eta == 0:
            return f"logarithmic:{self.gamma:g}"
        return f"negbin:{self.eta:g},{self.gamma:g}"

    @property
    def theorem(self) -> str:
        """Which theorem of Papernot & Steinke bounds the tuned algorithm."""
        return "Theorem 6, Poisson" if self.kind == "poisson" else "Theorem 2, truncated negative binomial"

    @property
    def smallest(self) -> int:
        """The smallest K the distribution gives: 0 for Poisson, 1 for the truncated negative binomial."""
        return 0 if self.kind == "poisson" else 1

    @property
    def mean(self) -> float:
        """E[K]."""
        if self.kind == "poisson":
            return self.mu
        g, e = self.gamma, self.eta
        if e == 0:
            return (1 - g) / (g * math.log(1 / g))
        return e * (1 - g) / (g * -math.expm1(e * math.log(g)))

    def _first(self) -> float:
        """P[K = smallest]."""
        if self.kind == "poisson":
            return math.exp(-self.mu)
        g, e = self.gamma, self.eta
        c = 1 / math.log(1 / g) if e == 0 else e / math.expm1(-e * math.log(g))  # η/(γ^{−η} − 1)
        return (1 - g) * c

    def _ratio(self, k: int) -> float:
        """P[K = k + 1] / P[K = k]."""
        if self.kind == "poisson":
            return self.mu / (k + 1)
        return (1 - self.gamma) * (k + self.eta) / (k + 1)

    def _ratio_bound(self, k: int) -> float:
        """An upper bound on P[K = j + 1] / P[K = j] for every j ≥ k."""
        if self.kind == "poisson" or self.eta >= 1:  # the ratio decreases in k
            return self._ratio(k)
        return 1 - self.gamma  # it increases towards 1 − γ

    def pmf(self, k: int) -> float:
        """P[K = k]."""
        if k < self.smallest:
            return 0.0
        p = self._first()
        for j in range(self.smallest, k):
            p *= self._ratio(j)
        return p

    def tail(self, cap: int) -> float:
        """An upper bound on P[K > cap]: the terms summed until what is left is at most 10⁻⁹ of the sum
        (bounded by a geometric series of the largest ratio of consecutive probabilities to come), plus that
        bound."""
        if cap < self.smallest:
            return 1.0
        p = self.pmf(cap + 1)
        k, total = cap + 1, 0.0
        for _ in range(10**6):
            total += p
            r = self._ratio_bound(k)
            if p == 0.0:
                return min(1.0, total)
            if r < 1 and p * r / (1 - r) <= 1e-9 * total:
                return min(1.0, (total + p * r / (1 - r)) * (1 + 1e-9))  # 1e-9: rounding of the sum
            p *= self._ratio(k)
            k += 1
        return 1.0

    def draw(self, u: float, cap: int) -> tuple[int, bool]:
        """(K, truncated) from one uniform ``u`` in [0, 1) by the inverse of the distribution function,
        capped: when the K drawn exceeds ``cap`` the result is (cap, True)."""
        if not 0 <= u < 1:
            raise ConfigError(f"a uniform draw must lie in [0, 1), got {u}")
        k = self.smallest
        p = self._first()
        cdf = p
        while cdf <= u:
            if k >= cap:
                return cap, True
            p *= self._ratio(k)
            k += 1
            cdf += p
        return (k, False) if k <= cap else (cap, True)

    def to_dict(self) -> dict:
        """The distribution's parameters and mean, for tune.json."""
        d: dict = {
            "distribution": self.name,
            "theorem": self.theorem,
            "mean": self.mean,
            "smallest": self.smallest,
        }
        if self.kind == "poisson":
            d["mu"] = self.mu
        else:
            d.update(eta=self.eta, gamma=self.gamma)
        return d


def poisson(mu: float) -> TrialCount:
    """K ~ Poisson(μ), μ ≥ 1 (K = 0 has probability e^{−μ} ≤ 0.37). Below μ = 1, log(μ)/(λ − 1) < 0 and
    Theorem 6's ε' falls below the exact divergence of the best of K (tests/privacy/test_tuning.py shows it at
    μ = 0.5; for μ → 0 it even turns negative, which no divergence is); ``dp_accounting`` also refuses a mean
    below 1."""
    if not (math.isfinite(mu) and mu >= 1):
        raise ConfigError(
            f"the Poisson mean μ must be finite and at least 1 (Theorem 6's bound fails below), got {mu}"
        )
    return TrialCount("poisson", mu=float(mu))


def truncated_negative_binomial(eta: float, gamma: float) -> TrialCount:
    """K ~ D_{η,γ}, the negative binomial conditioned on K ≥ 1: η ∈ (−1, ∞), γ ∈ (0, 1)."""
    if not (math.isfinite(eta) and eta > -1):
        raise ConfigError(f"the truncated negative binomial needs η > −1, got {eta}")
    if not 0 < gamma < 1:
        raise ConfigError(f"the truncated negative binomial needs 0 < γ < 1, got {gamma}")
    return TrialCount("negbin", eta=float(eta), gamma=float(gamma))


def geometric(gamma: float) -> TrialCount:
    """K ~ geometric on {1, 2, …}: P[K = k] = γ(1 − γ)^{k−1} (η = 1), E[K] = 1/γ."""
    return truncated_negative_binomial(1.0, gamma)


def logarithmic(gamma: float) -> TrialCount:
    """K ~ logarithmic: P[K = k] = (1 − γ)^k / (k log(1/γ)) (η = 0), E[K] = (1/γ − 1)/log(1/γ)."""
    return truncated_negative_binomial(0.0, gamma)


def parse_trial_count(spec: str) -> TrialCount:
    """``poisson:MU``, ``negbin:ETA,GAMMA``, ``geometric:GAMMA`` or ``logarithmic:GAMMA`` → a
    :class:`TrialCount`; ConfigError (one line) for anything else."""
    kind, sep, rest = str(spec).partition(":")
    kind = kind.strip().lower()
    want = {
        "poisson": "poisson:MU",
        "negbin": "negbin:ETA,GAMMA",
        "geometric": "geometric:GAMMA",
        "logarithmic": "logarithmic:GAMMA",
    }
    if kind not in want or not sep:
        raise ConfigError(f"random trials are {', '.join(want.values())}; got {spec!r}")
    try:
        values = [float(v) for v in rest.split(",")]
    except ValueError:
        raise ConfigError(f"random trials: {want[kind]} takes numbers; got {spec!r}") from None
    if len(values) != (2 if kind == "negbin" else 1):
        raise ConfigError(f"random trials: write {want[kind]}; got {spec!r}")
    if kind == "poisson":
        return poisson(values[0])
    if kind == "negbin":
        return truncated_negative_binomial(values[0], values[1])
    return geometric(values[0]) if kind == "geometric" else logarithmic(values[0])


def _curve(orders, rdp) -> tuple[np.ndarray, np.ndarray]:
    o = np.asarray(orders, dtype=np.float64)
    r = np.asarray(rdp, dtype=np.float64)
    if o.ndim != 1 or o.shape != r.shape or len(o) == 0:
        raise ConfigError(f"an RDP curve needs as many orders as values, got {o.shape} and {r.shape}")
    if np.isnan(o).any() or (o < 1).any() or np.isnan(r).any() or (r < 0).any():
        raise ConfigError("an RDP curve needs orders ≥ 1 and values ≥ 0")
    if not (o > 1).any():
        raise ConfigError("the tuning bounds need at least one RDP order λ > 1")
    return o, r


def _monotone(orders: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Each order's value lowered to the smallest value at any order at least as large (D_λ grows with λ)."""
    out = values.copy()
    for i, a in enumerate(orders):
        out[i] = values[orders >= a].min()
    return out


def truncated_negative_binomial_rdp(orders, rdp, eta: float, gamma: float) -> np.ndarray:
    """Theorem 2: the RDP curve of the best of K ~ D_{η,γ} independent runs of Q, Q's curve being ``rdp`` at
    ``orders`` (λ̂ minimised over the curve's orders ≥ 1; then made monotone in λ)."""
    o, r = _curve(orders, rdp)
    count = truncated_negative_binomial(eta, gamma)
    finite = np.isfinite(r)
    if not finite.any():
        raise ConfigError("the RDP curve is infinite at every order: no tuning bound")
    c = (1 + eta) * float(np.min((1 - 1 / o[finite]) * r[finite] + math.log(1 / gamma) / o[finite]))
    with np.errstate(divide="ignore"):
        out = np.where(o > 1, r + math.log(count.mean) / (o - 1) + c, np.inf)
    return _monotone(o, out)


def poisson_rdp(orders, rdp, mu: float) -> np.ndarray:
    """Theorem 6: the RDP curve of the best of K ~ Poisson(μ) independent runs of Q (⊥ when K = 0), Q's curve
    being ``rdp`` at ``orders``: at each λ > 1, ε̂ = log(1 + 1/(λ − 1)) and δ̂ = Q's δ at ε̂; then made
    monotone."""
    o, r = _curve(orders, rdp)
    poisson(mu)
    out = np.full(len(o), np.inf)
    for i, a in enumerate(o):
        if a > 1 and math.isfinite(r[i]):
            delta_hat = delta_from_rdp(o, r, math.log1p(1 / (a - 1)))
            out[i] = r[i] + mu * delta_hat + math.log(mu) / (a - 1)
    return _monotone(o, out)


def repeat_and_select_rdp(orders, rdp, count: TrialCount) -> np.ndarray:
    """The RDP curve (at ``orders``) of releasing the best of K ~ ``count`` independent runs of an algorithm
    whose curve is ``rdp`` (Theorem 2 or Theorem 6, see the module doc)."""
    if count.kind == "poisson":
        return poisson_rdp(orders, rdp, count.mu)
    return truncated_negative_binomial_rdp(orders, rdp, count.eta, count.gamma)


def repeat_and_select_epsilon(orders, rdp, count: TrialCount, delta: float, cap: int | None = None) -> dict:
    """ε at ``delta`` of releasing the best of K ~ ``count`` runs of an algorithm with RDP curve ``rdp``, at
    most ``cap`` runs (None: no cap). With a cap, τ = P[K > cap] costs (1 + e^ε)τ of ``delta`` (module doc):
    the ε returned is one at which the tuned curve's δ₀ = ``delta`` − (1 + e^ε)τ gives at most ε. ConfigError
    when the cap leaves no δ for the curve. Returns epsilon, the order that attains it, tail τ, the δ spent on
    the cap (truncation_delta) and the curve's δ₀ (delta_rdp)."""
    if not 0 < delta < 1:
        raise ConfigError(f"δ must lie in (0, 1), got {delta}")
    if cap is not None and cap < max(1, count.smallest):
        raise ConfigError(f"the cap on the number of trials must be at least 1, got {cap}")
    curve = repeat_and_select_rdp(orders, rdp, count)
    tail = 0.0 if cap is None else count.tail(cap)
    eps, order = epsilon_from_rdp(orders, curve, delta)
    slack = 0.0
    if tail > 0:
        for _ in range(200):
            slack = tail * (1 + math.exp(min(eps, 700.0)))
            if slack >= delta:
                raise ConfigError(
                    f"at most {cap} trials cut off P[K > {cap}] = {tail:.3g} of {count.name}, which costs "
                    f"(1 + e^ε)·{tail:.3g} ≥ δ = {delta:g}: raise the cap (a cap costs no trials: E[K] stays "
                    f"{count.mean:.3g})"
                )
            new, order = epsilon_from_rdp(orders, curve, delta - slack)
            if new <= eps:
                break
            eps = new * (1 + 1e-9)
        else:
            raise ConfigError(f"the cost of capping {count.name} at {cap} trials did not settle")
    return {
        "epsilon": float(eps),
        "order": float(order),
        "delta": delta,
        "tail": tail,
        "cap": cap,
        "truncation_delta": slack,
        "delta_rdp": delta - slack,
    }
