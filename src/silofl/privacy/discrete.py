"""Distributed discrete noise for secure aggregation: the Skellam mechanism and its accountant.

Secure aggregation lets the server learn only the sum of the parties' vectors, in a finite group
Z_{2^bits}. For that sum to be a DP release *against the server*, each party adds its own share of
discrete noise before masking, and the shares add up to the target noise (Kairouz, Liu & Steinke,
"The Distributed Discrete Gaussian Mechanism for Federated Learning with Secure Aggregation", ICML 2021;
Agarwal, Kairouz & Liu, "The Skellam Mechanism for Differentially Private Federated Learning", NeurIPS
2021). One party's :func:`encode`:

1. clip the float vector x (d coordinates) to L2 norm ``clip`` (c);
2. pad to d' = 2^⌈log2 d⌉ and rotate: random signs then the orthonormal Walsh–Hadamard transform, from a
   *public* per-round ``rotation_seed`` shared by every party of the round (the rotation keeps the L2 norm
   and spreads the mass over the coordinates, so no coordinate of the sum overflows the group);
3. scale by γ (``scale``) into integer units;
4. conditional randomised rounding (Kairouz et al., Theorem 1 / Prop. 22): round every coordinate up with
   probability its fractional part, and retry while the rounded vector's L2 norm exceeds
   Δ₂ = min(γc + √d', √((γc)² + d'/4 + √(2 log(1/β))·(γc + √d'/2))) — so every rounded vector has norm ≤ Δ₂
   (and L1 norm ≤ Δ₁ = Δ₂·min(√d', Δ₂), integer coordinates), whatever the data;
5. add the party's Skellam noise Sk(μ/2, μ/2) = Poisson(μ/2) − Poisson(μ/2) per coordinate (variance μ =
   ``local_mu``), drawn from the party's secret randomness (:class:`DiscreteRandom`; a seed is a research
   opt-in);
6. reduce mod 2^bits.

Skellam is closed under summation, so n parties' noise is Sk(nμ/2, nμ/2): the server's view of the sum is
the Skellam mechanism with variance nμ applied to the sum of the rounded vectors. :func:`decode` maps the
modular sum back: centre into [−2^(bits−1), 2^(bits−1)), divide by γ, rotate back, crop the padding.

The analysis (pure functions; :func:`skellam_rdp`, :func:`rdp`, :func:`epsilon`): one release of the sum
is (α, ε(α))-RDP with, V the sum's noise variance in integer units (Agarwal et al., Theorem 3.5, in the
form of google-research/federated's ``distributed_dp/accounting_utils._skellam_rdp``)

    ε(α) = α·Δ₂²/(2V) + min(((2α−1)·Δ₂² + 6·Δ₁)/(4V²), 3·Δ₁/(2V)),

evaluated at integer orders α ≥ 2 (as that reference does). The neighbouring relation is one party's
vector replaced by zero (its data removed; who takes part in a round is public to the server), so the
sensitivities are those of one rounded vector. A party's vector may be the sum of ``per_party`` summands
(the sub-client privacy unit: one per sub-client), each clipped and rounded on its own by
:func:`encode_parts` with the party's noise added once: the unit is then one summand, whose removal moves the
sum by its own rounded vector (the same sensitivities), and the party as a whole has v times them
(``whole_party``). The noise counted is that of the parties who survive the
round: a mechanism is calibrated for ``min_survivors``; fewer survivors mean less noise and a larger ε,
which :func:`epsilon` computes when told. Rounds and the mechanisms of a round (the update, the adaptive
clip's count, …) compose additively in RDP; (ε, δ) comes from
:func:`silofl.privacy.analysis.epsilon_from_rdp`.
No amplification by subsampling is claimed (the server sees which parties take part).

``kind="ddgauss"`` replaces step 5 by a discrete Gaussian N_Z(0, σ²) per party (σ² = ``local_mu``; its
variance is at most σ²) and the analysis by Kairouz et al.'s (:func:`ddgauss_rdp`): a sum of discrete
Gaussians is not one, which costs the τ terms there; Skellam, closed under summation, is the default.

Wrap-around (modular clipping) is post-processing of the integer sum, so it never weakens the guarantee;
it costs accuracy. :func:`calibrate` picks the largest γ whose sum (``parties`` summands) keeps k standard
deviations inside the group, and :meth:`DiscreteMechanism.wrap_probability_bound` gives a rigorous bound
(Chernoff, union over the coordinates) on the probability that any coordinate of the sum wraps.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from silofl.core.errors import ConfigError
from silofl.core.randomness import SecureRandom

KINDS = ("skellam", "ddgauss")
"""The noise kinds: ``skellam`` (the default) and ``ddgauss``, the distributed discrete Gaussian."""
DEFAULT_BETA = math.exp(-0.5)
"""Conditional rounding's β (Kairouz et al.'s default): a try is accepted with probability ≥ 1 − β."""
DEFAULT_K = 4.0
"""Standard deviations of one coordinate of the sum that :func:`calibrate` keeps inside the group."""
DISCRETE_ORDERS: tuple[int, ...] = tuple(range(2, 129)) + (160, 192, 256, 384, 512, 1024)
"""Integer RDP orders of the Skellam bound (google-research/federated's ``RDP_ORDERS``, a few more on top)."""
MIN_BITS, MAX_BITS = 2, 62
MAX_LOCAL_MU = 2.0**40
"""Largest per-party Skellam variance (integer units): Poisson draws of mean ≤ 2^39 stay exact in float64."""
MAX_SCALED_CLIP = 2.0**50
"""Largest γ·c: a scaled coordinate and its fractional part stay exact in float64."""
MAX_DIM = 2**28
"""Largest number of coordinates of one vector (a hostile description cannot make a party allocate more)."""
MAX_PARTIES = 1 << 20
MAX_ROUNDING_TRIES = 1000
"""Conditional rounding accepts a try with probability ≥ 1 − β, so 1000 failures mean a bug, not bad luck."""

_FIELDS = (
    "kind",
    "dim",
    "clip",
    "bits",
    "scale",
    "beta",
    "local_mu",
    "min_survivors",
    "parties",
    "per_party",
)
_OPTIONAL = ("parties", "per_party")


# ----------------------------------------------------------------------------------------------- analysis
def rounded_l2_norm_bound(l2_norm: float, beta: float, dim: int) -> float:
    """The L2 norm bound of a vector of L2 norm ≤ ``l2_norm`` (integer units) after conditional randomised
    rounding to the integers in ``dim`` coordinates (Kairouz, Liu & Steinke 2021, Theorem 1 / Prop. 22):
    min(‖x‖ + √d, √(‖x‖² + d/4 + √(2 log(1/β))·(‖x‖ + √d/2))); with β = 0 (plain randomised rounding) the
    first, which holds for every rounding outcome."""
    if not (math.isfinite(l2_norm) and l2_norm >= 0):
        raise ConfigError(f"the norm bound must be finite and non-negative, got {l2_norm}")
    if not 0 <= beta < 1:
        raise ConfigError(f"β must lie in [0, 1), got {beta}")
    bound1 = l2_norm + math.sqrt(dim)
    if beta == 0:
        return bound1
    squared = (
        l2_norm**2 + 0.25 * dim + math.sqrt(2.0 * math.log(1.0 / beta)) * (l2_norm + 0.5 * math.sqrt(dim))
    )
    return min(bound1, math.sqrt(squared))


def rounded_l1_norm_bound(l2_bound: float, dim: int) -> float:
    """The L1 norm bound of an integer vector of L2 norm ≤ ``l2_bound``: ‖x‖₁ ≤ √d·‖x‖₂, and ‖x‖₁ ≤ ‖x‖₂²
    since every non-zero coordinate has |xᵢ| ≥ 1."""
    return l2_bound * min(math.sqrt(dim), l2_bound)


def _check_orders(orders: Iterable[float]) -> np.ndarray:
    a = np.asarray([float(o) for o in orders], dtype=np.float64)
    if a.ndim != 1 or a.size == 0 or not np.all(np.isfinite(a)) or np.any(a < 2) or np.any(a != np.floor(a)):
        raise ConfigError("the Skellam bound is evaluated at integer RDP orders ≥ 2")
    return a


def skellam_rdp(orders: Iterable[float], *, l1: float, l2: float, variance: float) -> np.ndarray:
    """RDP ε(α) at each integer order α ≥ 2 of the Skellam mechanism whose noise has ``variance`` V per
    coordinate (integer units) on a query of L1 / L2 sensitivity ``l1`` / ``l2`` (integer units):
    α·Δ₂²/(2V) + min(((2α−1)Δ₂² + 6Δ₁)/(4V²), 3Δ₁/(2V)) (Agarwal, Kairouz & Liu 2021, Theorem 3.5, with
    Sk(μ, μ) of variance V = 2μ). Infinite where V = 0."""
    a = _check_orders(orders)
    for name, v in (("l1", l1), ("l2", l2), ("variance", variance)):
        if not (math.isfinite(v) and v >= 0):
            raise ConfigError(f"the Skellam bound needs a finite, non-negative {name}, got {v}")
    if l1 == 0 and l2 == 0:
        return np.zeros_like(a)
    if variance == 0:
        return np.full_like(a, math.inf)
    v = float(variance)
    first = a * l2**2 / (2 * v)
    second = np.minimum(((2 * a - 1) * l2**2 + 6 * l1) / (4 * v**2), 3 * l1 / (2 * v))
    return first + second


def ddgauss_rdp(
    orders: Iterable[float], *, l1: float, l2: float, local_var: float, parties: int, dim: int
) -> np.ndarray:
    """RDP ε(α) at each integer order α ≥ 2 of the distributed discrete Gaussian: the sum of ``parties``
    independent N_Z(0, σ²) per coordinate (σ² = ``local_var``, integer units) on a ``dim``-dimensional query
    of L1 / L2 sensitivity ``l1`` / ``l2`` (Kairouz, Liu & Steinke 2021, Theorem 1 and Proposition 14, as
    google-research/federated's ``compute_rdp_dgaussian``): with Δ̃ᵢ = Δᵢ/(√n·σ) and
    τ = 10·Σ_{k=1}^{n−1} exp(−2π²σ²·k/(k+1)), ε(α) = min(α/2·Δ̃₂² + τd, α/2·(Δ̃₂² + 2Δ̃₁τ + τ²d),
    α/2·(Δ̃₂ + √d·τ)²). Infinite where σ = 0."""
    a = _check_orders(orders)
    for name, v in (("l1", l1), ("l2", l2), ("local_var", local_var)):
        if not (math.isfinite(v) and v >= 0):
            raise ConfigError(f"the discrete Gaussian bound needs a finite, non-negative {name}, got {v}")
    if not _is_int(parties) or parties < 1 or not _is_int(dim) or dim < 1:
        raise ConfigError(f"the discrete Gaussian bound needs parties ≥ 1 and dim ≥ 1, got {parties}, {dim}")
    if l1 == 0 and l2 == 0:
        return np.zeros_like(a)
    if local_var == 0:
        return np.full_like(a, math.inf)
    n, sigma = int(parties), math.sqrt(local_var)
    tau = 10.0 * sum(math.exp(-2.0 * (math.pi * sigma) ** 2 * (k / (k + 1))) for k in range(1, n))
    s1, s2 = l1 / (math.sqrt(n) * sigma), l2 / (math.sqrt(n) * sigma)
    term1 = a / 2 * s2**2 + tau * dim
    term2 = a / 2 * (s2**2 + 2 * s1 * tau + tau**2 * dim)
    term3 = a / 2 * (s2 + math.sqrt(dim) * tau) ** 2
    return np.minimum(np.minimum(term1, term2), term3)


def rdp(
    mech: DiscreteMechanism,
    orders: Iterable[float] = DISCRETE_ORDERS,
    *,
    survivors: int,
    whole_party: bool = False,
) -> np.ndarray:
    """RDP of one release of the sum of ``survivors`` parties' encodings under ``mech`` (one summand's
    rounded vector replaced by zero — a party's whole vector when ``per_party`` is 1; with
    ``whole_party`` all ``per_party`` summands of one party at once, sensitivities times ``per_party``), at
    integer ``orders`` ≥ 2: :func:`skellam_rdp` of variance survivors·μ, or :func:`ddgauss_rdp` of
    ``survivors`` discrete Gaussians of σ² = μ."""
    if isinstance(survivors, bool) or not isinstance(survivors, int | np.integer) or survivors < 1:
        raise ConfigError(f"survivors must be a positive integer, got {_show(survivors)}")
    g = mech.per_party if whole_party else 1
    if mech.kind == "ddgauss":
        return ddgauss_rdp(
            orders,
            l1=g * mech.l1_sensitivity(),
            l2=g * mech.l2_sensitivity(),
            local_var=mech.local_mu,
            parties=int(survivors),
            dim=mech.padded_dim(),
        )
    return skellam_rdp(
        orders,
        l1=g * mech.l1_sensitivity(),
        l2=g * mech.l2_sensitivity(),
        variance=int(survivors) * mech.local_mu,
    )


def epsilon(
    mechs_per_round: Sequence[DiscreteMechanism],
    *,
    rounds: int,
    delta: float,
    survivors: int | None = None,
    whole_party: bool = False,
    colluders: int = 0,
) -> float:
    """ε at ``delta`` of ``rounds`` rounds, each releasing every mechanism of ``mechs_per_round`` once (RDP
    composes additively over the mechanisms and the rounds), with ``survivors`` parties' noise in each sum
    (default: each mechanism's own ``min_survivors``); the unit is one summand, or with ``whole_party`` one
    party's ``per_party`` summands together (:func:`rdp`). ``colluders`` c: the ε against the server plus c
    colluding parties, who know (or never added) their own noise shares — only the survivors − c honest
    parties' shares count (:func:`honest_survivors`; inf when none is left). 0 for no release; inf when a
    release has no noise."""
    from silofl.privacy.analysis import epsilon_from_rdp

    if isinstance(rounds, bool) or not isinstance(rounds, int | np.integer) or rounds < 0:
        raise ConfigError(f"rounds must be a non-negative integer, got {_show(rounds)}")
    if not 0 < delta < 1:
        raise ConfigError(f"δ must lie in (0, 1), got {delta}")
    mechs = list(mechs_per_round)
    if rounds == 0 or not mechs:
        return 0.0
    total = np.zeros(len(DISCRETE_ORDERS), dtype=np.float64)
    for m in mechs:
        if not isinstance(m, DiscreteMechanism):
            raise ConfigError(f"not a DiscreteMechanism: {type(m).__name__}")
        honest = honest_survivors(m.min_survivors if survivors is None else survivors, colluders)
        if honest == 0:
            return math.inf
        total = total + rdp(m, DISCRETE_ORDERS, survivors=honest, whole_party=whole_party)
    total = total * int(rounds)
    if not np.any(np.isfinite(total)):
        return math.inf
    if not np.any(total > 0):
        return 0.0
    return epsilon_from_rdp(DISCRETE_ORDERS, total, delta)[0]


def honest_survivors(survivors: int, colluders: int) -> int:
    """The parties whose noise shares are unknown to the server plus ``colluders`` colluding parties when
    ``survivors`` parties' shares reach the sum: survivors − c, at least 0 (the colluders are assumed to be
    among the survivors: the worst case for the honest ones)."""
    for name, v in (("survivors", survivors), ("colluders", colluders)):
        if not _is_int(v) or v < 0:
            raise ConfigError(f"{name} must be a non-negative integer, got {_show(v)}")
    return max(0, int(survivors) - int(colluders))


THREATS = ("outsiders", "server", "colluders")
"""Whom a secure sum's ε holds against: everyone outside (they see at most what the server sees), the server
(the whole noise of the survivors floor), the server plus c colluding parties (the honest survivors'
shares only)."""


def epsilon_per_threat(
    mechs_per_round: Sequence[DiscreteMechanism],
    *,
    rounds: int,
    delta: float,
    colluders: int,
    whole_party: bool = False,
) -> dict[str, float]:
    """ε at ``delta`` of ``rounds`` releases of every mechanism of ``mechs_per_round``, per threat
    (:data:`THREATS`): ``outsiders`` and ``server`` with each mechanism's ``min_survivors`` parties' noise
    (the server decodes only the sum; an outsider sees at most the server's view), ``colluders`` with the
    min_survivors − ``colluders`` honest parties' noise (:func:`epsilon`)."""
    server = epsilon(mechs_per_round, rounds=rounds, delta=delta, whole_party=whole_party)
    return {
        "outsiders": server,
        "server": server,
        "colluders": epsilon(
            mechs_per_round, rounds=rounds, delta=delta, whole_party=whole_party, colluders=colluders
        ),
    }


def _chernoff_tail(a: float, subgauss_var: float, skellam_var: float) -> float:
    """A bound on P(Y ≥ a) for Y = S + N, S sub-Gaussian with variance proxy ``subgauss_var`` and N ~
    Sk(V/2, V/2), V = ``skellam_var``: min over t > 0 of exp(−ta + t²s/2 + V(cosh t − 1)) (the two moment
    generating functions)."""
    if a <= 0:
        return 1.0
    s, v = subgauss_var, skellam_var

    def log_bound(t: float) -> float:
        return -t * a + 0.5 * t * t * s + v * (math.cosh(t) - 1.0)

    # the exponent is convex in t; its minimiser lies in (0, t_hi] with t_hi the minimiser without either term
    t_hi = min(a / s if s > 0 else math.inf, math.asinh(a / v) if v > 0 else math.inf)
    if not math.isfinite(t_hi):  # no randomness at all: the deterministic part alone stays below a
        return 0.0
    lo, hi = 0.0, t_hi
    for _ in range(200):  # golden-section search of the convex exponent
        m1, m2 = lo + (hi - lo) * 0.382, lo + (hi - lo) * 0.618
        if log_bound(m1) <= log_bound(m2):
            hi = m2
        else:
            lo = m1
    return min(1.0, math.exp(min(0.0, log_bound((lo + hi) / 2))))


# ----------------------------------------------------------------------------------------------- mechanism
def _is_int(v: Any) -> bool:
    return isinstance(v, int | np.integer) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    """A finite real number (a huge int that no float holds is not)."""
    if not isinstance(v, int | float | np.integer | np.floating) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def _show(v: Any) -> str:
    """A value for an error message, bounded (it may come from a hostile peer)."""
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@dataclass(frozen=True)
class DiscreteMechanism:
    """One party's encoding and the sum's analysis (see the module doc). Everything here is public: the
    server and every party know it. ``local_mu``: one party's noise variance in integer units (Skellam's
    variance; σ² of the discrete Gaussian). ``parties``: the number of parties γ was calibrated for (0: not
    recorded). ``per_party``: the summands of one party's vector — each clipped to ``clip`` and rounded on its
    own (:func:`encode_parts`), the party's noise added once to their sum (the sub-client privacy unit: one
    summand per sub-client); the sensitivities are one summand's."""

    kind: str
    dim: int
    clip: float
    bits: int
    scale: float
    beta: float
    local_mu: float
    min_survivors: int
    parties: int = 0
    per_party: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or self.kind not in KINDS:
            raise ConfigError(
                f"unknown discrete noise kind {_show(self.kind)}; choose one of: {', '.join(KINDS)}"
            )
        for name, lo, hi in (
            ("dim", 1, MAX_DIM),
            ("bits", MIN_BITS, MAX_BITS),
            ("min_survivors", 1, MAX_PARTIES),
            ("parties", 0, MAX_PARTIES),
            ("per_party", 1, MAX_PARTIES),
        ):
            v = getattr(self, name)
            if not _is_int(v) or not lo <= v <= hi:
                raise ConfigError(f"{name} must be an integer in [{lo}, {hi}], got {_show(v)}")
            object.__setattr__(self, name, int(v))
        for name in ("clip", "scale", "beta", "local_mu"):
            v = getattr(self, name)
            if not _is_real(v):
                raise ConfigError(f"{name} must be a finite number, got {_show(v)}")
            object.__setattr__(self, name, float(v))
        if not self.clip > 0 or not self.scale > 0:
            raise ConfigError(f"clip and scale must be positive, got {self.clip!r} and {self.scale!r}")
        if self.scale * self.clip > MAX_SCALED_CLIP:
            raise ConfigError(f"scale·clip = {self.scale * self.clip:g} exceeds {MAX_SCALED_CLIP:g}")
        if not 0 <= self.beta < 1:
            raise ConfigError(f"beta must lie in [0, 1), got {self.beta!r}")
        if not 0 <= self.local_mu <= MAX_LOCAL_MU:
            raise ConfigError(f"local_mu must lie in [0, {MAX_LOCAL_MU:g}], got {self.local_mu!r}")
        if self.parties and self.parties < self.min_survivors:
            raise ConfigError(f"min_survivors {self.min_survivors} exceeds the {self.parties} parties")

    def padded_dim(self) -> int:
        """d padded to a power of 2 for the Hadamard rotation: the length of an encoding."""
        return _next_pow2(self.dim)

    def l2_sensitivity(self) -> float:
        """The L2 norm bound of one party's rounded vector (integer units): the conditional rounding bound of
        γ·c in the padded dimension (rotation keeps the norm)."""
        return rounded_l2_norm_bound(self.scale * self.clip, self.beta, self.padded_dim())

    def l1_sensitivity(self) -> float:
        """The L1 norm bound of one party's rounded vector (integer units)."""
        return rounded_l1_norm_bound(self.l2_sensitivity(), self.padded_dim())

    def central_std(self, parties: int) -> float:
        """Standard deviation per coordinate of the noise in the sum of ``parties`` encodings, float units
        (for ``ddgauss`` the σ of the discrete Gaussians, an upper bound on their standard deviation)."""
        if not _is_int(parties) or parties < 0:
            raise ConfigError(f"parties must be a non-negative integer, got {_show(parties)}")
        return math.sqrt(int(parties) * self.local_mu) / self.scale

    def noise_multiplier(self, parties: int | None = None) -> float:
        """The sum's noise std over the clip norm (the central Gaussian's z) with ``parties`` (default
        ``min_survivors``) parties' noise."""
        return self.central_std(self.min_survivors if parties is None else parties) / self.clip

    def coordinate_wrap_probability(self, parties: int) -> float:
        """A bound on the probability that one coordinate of the sum of ``parties`` encodings leaves
        [−2^(bits−1), 2^(bits−1)) and so wraps: the rotated sum of the clipped vectors is sub-Gaussian with
        variance proxy (n·γc)²/d' (random signs; ‖Σx‖ ≤ n·c), each rounding moves a coordinate by less than
        1, the noise is Sk(nμ/2, nμ/2) (or n discrete Gaussians, each σ²-sub-Gaussian)."""
        if not _is_int(parties) or parties < 1:
            raise ConfigError(f"parties must be a positive integer, got {_show(parties)}")
        n, v = int(parties), self.per_party
        a = 2.0 ** (self.bits - 1) - n * v  # the rounding errors' deterministic share
        s = (n * v * self.scale * self.clip) ** 2 / self.padded_dim()
        if self.kind == "ddgauss":  # N_Z(0, σ²) is σ²-sub-Gaussian (Canonne, Kamath & Steinke 2020)
            return min(1.0, 2.0 * _chernoff_tail(a, s + n * self.local_mu, 0.0))
        return min(1.0, 2.0 * _chernoff_tail(a, s, n * self.local_mu))

    def wrap_probability_bound(self, parties: int) -> float:
        """A bound on the probability that any coordinate of the sum of ``parties`` encodings wraps around
        (the union bound over the padded coordinates; at most 1). Wrapping costs accuracy, never privacy."""
        return min(1.0, self.padded_dim() * self.coordinate_wrap_probability(parties))

    def expected_wrapped_coordinates(self, parties: int) -> float:
        """A bound on the expected number of coordinates of the sum of ``parties`` encodings that wrap around
        in one round (d' times :meth:`coordinate_wrap_probability`): the accuracy figure behind the bits."""
        return self.padded_dim() * self.coordinate_wrap_probability(parties)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON: every field."""
        d = asdict(self)
        return {k: (v.item() if isinstance(v, np.generic) else v) for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: Any) -> DiscreteMechanism:
        """Rebuild from :meth:`to_dict` output received from anywhere: exactly the known keys (``parties`` and
        ``per_party`` optional), each validated; anything else raises ConfigError."""
        if not isinstance(d, dict):
            raise ConfigError(f"a discrete mechanism must be a JSON object, got {type(d).__name__}")
        unknown = set(d) - set(_FIELDS)
        missing = set(_FIELDS) - set(_OPTIONAL) - set(d)
        if unknown or missing:
            shown = sorted(str(k)[:40] for k in unknown)[:5]  # hostile keys: bounded in the message
            raise ConfigError(f"discrete mechanism: unknown keys {shown}, missing keys {sorted(missing)}")
        return cls(**{k: d[k] for k in _FIELDS if k in d})


def calibrate(
    *,
    dim: int,
    clip: float,
    bits: int,
    parties: int,
    min_survivors: int,
    noise_multiplier: float,
    kind: str = "skellam",
    beta: float = DEFAULT_BETA,
    k: float = DEFAULT_K,
    per_party: int = 1,
) -> DiscreteMechanism:
    """The mechanism for ``parties`` summands in Z_{2^bits} whose ``min_survivors`` parties' noise alone has
    variance ≥ (z·c·γ)² in integer units — the central Gaussian's noise std z·c in float units (z =
    ``noise_multiplier``; 0 adds no noise, for secure aggregation without DP).

    γ is the largest scale whose sum keeps ``k`` standard deviations of a coordinate inside the group:
    k²·(γ²c²·(n²/d' + n·z²/m) + n/4) ≤ 4^(bits−1) (google-research/federated's ``skellam_params`` closed
    form: worst-case signal n·c spread by the rotation, rounding variance ≤ 1/4 and noise per party), capped
    so that γ·c ≤ 2^50 and μ ≤ 2^40 (beyond which finer steps buy nothing). Raises ConfigError when the bits
    are too few: the group cannot hold the sum, or rounding would more than double the sensitivity (then
    ε would exceed the central Gaussian's by far more than the discretisation is worth).

    With ``per_party`` = v > 1 every party's vector is the sum of v summands, each clipped to c and rounded
    on its own (:func:`encode_parts`; the sub-client privacy unit), the party's noise added once: the noise
    still meets (z·c·γ)² with ``min_survivors`` parties — c is one summand's bound, the unit's sensitivity —
    and the group holds n·v summands: k²·(γ²c²·((nv)²/d' + n·z²/m) + nv/4) ≤ 4^(bits−1)."""
    if not _is_int(per_party) or not 1 <= per_party <= MAX_PARTIES:
        raise ConfigError(f"per_party must be an integer in [1, {MAX_PARTIES}], got {_show(per_party)}")
    if not _is_int(parties) or not 1 <= parties <= MAX_PARTIES:
        raise ConfigError(f"parties must be an integer in [1, {MAX_PARTIES}], got {_show(parties)}")
    if not _is_int(min_survivors) or not 1 <= min_survivors <= parties:
        raise ConfigError(
            f"min_survivors must be an integer in [1, parties = {parties}], got {_show(min_survivors)}"
        )
    if not _is_real(noise_multiplier) or not noise_multiplier >= 0:
        raise ConfigError(f"noise_multiplier must be finite and non-negative, got {_show(noise_multiplier)}")
    if not _is_real(k) or not k > 0:
        raise ConfigError(f"k must be positive, got {_show(k)}")
    if not _is_real(clip) or not clip > 0:
        raise ConfigError(f"clip must be positive and finite, got {_show(clip)}")
    if not _is_int(bits) or not MIN_BITS <= bits <= MAX_BITS:
        raise ConfigError(f"bits must be an integer in [{MIN_BITS}, {MAX_BITS}], got {_show(bits)}")
    if not _is_int(dim) or not 1 <= dim <= MAX_DIM:
        raise ConfigError(f"dim must be an integer in [1, {MAX_DIM}], got {_show(dim)}")
    n, m, z, c = int(parties), int(min_survivors), float(noise_multiplier), float(clip)
    v = int(per_party)
    d = _next_pow2(dim)
    room = 4.0 ** (bits - 1) / (k * k) - n * v / 4.0
    if room <= 0:
        raise ConfigError(
            f"{bits} bits are too few for the sum of {n} parties (k = {k:g} standard deviations)"
        )
    gamma = math.sqrt(room / (c * c * ((n * v) ** 2 / d + n * z * z / m)))
    gamma = min(gamma, MAX_SCALED_CLIP / c)
    if z > 0:
        gamma = min(gamma, math.sqrt(MAX_LOCAL_MU * m) / (z * c) * (1 - 1e-9))
    local_mu = (z * c * gamma) ** 2 / m
    while m * local_mu < (z * c * gamma) ** 2:  # float rounding: the target is a floor
        local_mu = math.nextafter(local_mu, math.inf)
    mech = DiscreteMechanism(
        kind=kind,
        dim=int(dim),
        clip=c,
        bits=int(bits),
        scale=gamma,
        beta=float(beta),
        local_mu=local_mu,
        min_survivors=m,
        parties=n,
        per_party=v,
    )
    if gamma * c < 1 or mech.l2_sensitivity() > 2 * gamma * c:
        raise ConfigError(
            f"{bits} bits are too few for {n} parties and {dim} coordinates: the clip norm spans "
            f"{gamma * c:.3g} integer steps and rounding would inflate the sensitivity to "
            f"{mech.l2_sensitivity():.3g}; raise the bits"
        )
    return mech


def calibrate_pooled(
    *,
    dim: int,
    clip: float,
    bits: int,
    parties: int,
    min_survivors: int,
    noise_multiplier: float,
    rows: int,
    kind: str = "skellam",
    k: float = DEFAULT_K,
) -> DiscreteMechanism:
    """The pooled example-level mechanism (issue 44; Heikkilä et al. 2020 with the discrete noise of Agarwal,
    Kairouz & Liu 2021): each of ``parties`` parties sums its (at most ``rows``) examples' vectors, each
    clipped to ``clip`` = C, and encodes the float sum with :func:`encode_sum` — rotated, scaled by γ,
    *plainly* randomised rounding (β = 0), plus its noise share — so that ``min_survivors`` parties'
    shares carry the central noise (z·C·γ)² of one pooled DP-(S)GD step (z = ``noise_multiplier``).

    The unit is one example. Removing it moves the party's float sum S by Δ, ‖Δ‖ ≤ C, so the rotated, scaled
    sum by γΔ. Randomised rounding is ⌊s + U⌋ for U uniform per coordinate; coupled through the same U, the
    rounded vectors of two neighbouring sums differ by an integer vector whose coordinates are at most
    |γΔ_j| + 1, of L2 norm ≤ γC + √d′ — :func:`rounded_l2_norm_bound` with β = 0, this mechanism's
    :meth:`~DiscreteMechanism.l2_sensitivity` (and L1 ≤ L2·min(√d′, L2), integers). The release is a mixture
    over U of Skellam mechanisms on integer vectors at that distance, and Rényi divergence is jointly
    quasi-convex (van Erven & Harremoës 2014, Theorem 13), so the Skellam bound (:func:`skellam_rdp`) of those
    sensitivities holds for the mixture: :func:`rdp` and :func:`epsilon` apply unchanged (per_party 1: one
    example is the summand). γ is :func:`calibrate`'s with the group holding ``parties``·``rows`` summands of
    norm ≤ C (the k-standard-deviation capacity; wrap-around is post-processing). Raises ConfigError when
    the bits are too few for the model (γC below √d′, where rounding would double the sensitivity)."""
    if not _is_int(rows) or not 1 <= rows <= MAX_PARTIES:
        raise ConfigError(f"rows must be an integer in [1, {MAX_PARTIES}], got {_show(rows)}")
    mech = calibrate(
        dim=dim,
        clip=clip,
        bits=bits,
        parties=parties,
        min_survivors=min_survivors,
        noise_multiplier=noise_multiplier,
        kind=kind,
        beta=0.0,
        k=k,
        per_party=int(rows),
    )
    return replace(mech, per_party=1)


def pooled_sum_bound(mech: DiscreteMechanism, rows: int, parties: int) -> float:
    """An L2 bound on the decoded sum of ``parties`` pooled encodings of at most ``rows`` examples each under
    ``mech`` (:func:`calibrate_pooled`): every example at C, every rounding at its largest, eight standard
    deviations of the noise norm on top (as :func:`silofl.fl.exchange.secure_round.plausible` does)."""
    d = mech.padded_dim()
    std = mech.central_std(int(parties))
    return parties * (rows * mech.clip + math.sqrt(d) / mech.scale) + std * (math.sqrt(d) + 8)


def exact_range(
    *, dim: int, clip: float, bits: int, parties: int, min_survivors: int = 1
) -> DiscreteMechanism:
    """The noiseless mechanism whose sum of ``parties`` encodings can never wrap around the group (secure
    aggregation of uploads that are DP already, e.g. FedAvg's example-level DP-SGD models): every rotated
    coordinate of a vector of norm ≤ c is at most c, so after scaling and rounding at most γc + 1, and n of
    them at most n(γc + 1) ≤ 2^(bits−1) − 1 with γ = (2^(bits−1) − 1 − n)/(n·c) — inside the centred range
    whatever the data (no k-standard-deviation bet as in :func:`calibrate`). A vector longer than c is
    clipped to c by :func:`encode` (the site's documented range bound). Raises ConfigError when the bits are
    too few for one integer step per c."""
    if not _is_int(parties) or not 1 <= parties <= MAX_PARTIES:
        raise ConfigError(f"parties must be an integer in [1, {MAX_PARTIES}], got {_show(parties)}")
    if not _is_real(clip) or not clip > 0:
        raise ConfigError(f"the range bound must be positive and finite, got {_show(clip)}")
    if not _is_int(bits) or not MIN_BITS <= bits <= MAX_BITS:
        raise ConfigError(f"bits must be an integer in [{MIN_BITS}, {MAX_BITS}], got {_show(bits)}")
    n, c = int(parties), float(clip)
    room = (1 << (bits - 1)) - 1 - n
    gamma = min(room / (n * c) * (1 - 1e-12), MAX_SCALED_CLIP / c) if room > 0 else 0.0
    if gamma * c < 1:
        raise ConfigError(
            f"{bits} bits are too few to sum {n} vectors of norm ≤ {c:g} without wrap-around; raise the bits"
        )
    return DiscreteMechanism(
        kind="skellam",
        dim=int(dim),
        clip=c,
        bits=int(bits),
        scale=gamma,
        beta=DEFAULT_BETA,
        local_mu=0.0,
        min_survivors=int(min(max(1, min_survivors), n)),
        parties=n,
    )


MAX_CALIBRATED_Z = 1e4


def calibrate_for_epsilon(
    target_epsilon: float,
    *,
    delta: float,
    rounds: int,
    dim: int,
    clip: float,
    bits: int,
    parties: int,
    min_survivors: int,
    kind: str = "skellam",
    beta: float = DEFAULT_BETA,
    k: float = DEFAULT_K,
    others: Sequence[DiscreteMechanism] = (),
    tolerance: float = 1e-3,
    rows: int | None = None,
) -> DiscreteMechanism:
    """Budget-first :func:`calibrate`: the mechanism with (to within ``tolerance``, relative) the smallest
    noise multiplier z for which ``rounds`` rounds of it — together with ``others``, the round's other
    releases — spend at most ``target_epsilon`` at ``delta`` against the server with ``min_survivors``
    parties' noise. ``rows``: the pooled example-level mechanism of :func:`calibrate_pooled` (β = 0, every
    party summing at most that many examples). Raises ConfigError when no z up to 10⁴ meets the target or
    the bits are too few."""
    if not _is_real(target_epsilon) or not target_epsilon > 0:
        raise ConfigError(f"target_epsilon must be positive and finite, got {_show(target_epsilon)}")
    if not _is_int(rounds) or rounds < 1:
        raise ConfigError(f"rounds must be a positive integer, got {_show(rounds)}")

    def build(z: float) -> DiscreteMechanism:
        if rows is not None:
            return calibrate_pooled(
                dim=dim,
                clip=clip,
                bits=bits,
                parties=parties,
                min_survivors=min_survivors,
                noise_multiplier=z,
                rows=rows,
                kind=kind,
                k=k,
            )
        return calibrate(
            dim=dim,
            clip=clip,
            bits=bits,
            parties=parties,
            min_survivors=min_survivors,
            noise_multiplier=z,
            kind=kind,
            beta=beta,
            k=k,
        )

    def spends(m: DiscreteMechanism) -> float:
        return epsilon([m, *others], rounds=rounds, delta=delta, survivors=min_survivors)

    hi = 1.0
    mech = build(hi)
    while spends(mech) > target_epsilon:
        hi *= 2
        if hi > MAX_CALIBRATED_Z:
            raise ConfigError(
                f"target_epsilon {target_epsilon:g} (δ={delta:g}) is unreachable in {rounds} rounds with "
                f"{min_survivors} surviving parties' discrete noise, even at noise multiplier "
                f"{MAX_CALIBRATED_Z:g}"
            )
        mech = build(hi)
    lo = hi / 2 if hi > 1 else 0.0
    while hi - lo > tolerance * hi:
        mid = (lo + hi) / 2
        m = build(mid)
        if spends(m) <= target_epsilon:
            hi, mech = mid, m
        else:
            lo = mid
    return mech


# ----------------------------------------------------------------------------------------------- randomness
class DiscreteRandom:
    """A party's randomness for rounding and Skellam noise. No seed (the default): uniforms from
    :class:`~silofl.core.randomness.SecureRandom` (AES-256-CTR keyed from ``os.urandom``), never saved. A seed
    is a research opt-in: numpy's PCG64, reproducible, its state saved with :meth:`state_dict` (the
    guarantee then holds only while the seed is secret). The Poisson sampler is the same for both."""

    def __init__(self, seed: int | None = None):
        self.secure = seed is None
        self._secure: SecureRandom | None = SecureRandom() if seed is None else None
        self._gen: np.random.Generator | None = None
        if seed is not None:
            if not _is_int(seed) or seed < 0:
                raise ConfigError(f"a discrete noise seed must be a non-negative integer, got {_show(seed)}")
            self._gen = np.random.Generator(np.random.PCG64(int(seed)))

    def uniform(self, n: int) -> np.ndarray:
        """``n`` float64 uniforms in [0, 1) (53 random bits each)."""
        if self._secure is not None:
            return self._secure.uniform(int(n)).numpy()
        assert self._gen is not None
        return self._gen.random(int(n))

    def poisson(self, n: int, lam: float) -> np.ndarray:
        """``n`` Poisson(``lam``) draws (int64): the multiplication method for λ < 10, Hörmann's PTRS
        transformed rejection (as numpy's) above, its acceptance test on a log-pmf evaluated without
        cancellation (Loader's saddle-point form), from this source's uniforms."""
        if not (math.isfinite(lam) and 0 <= lam <= MAX_LOCAL_MU):
            raise ConfigError(f"Poisson mean must lie in [0, {MAX_LOCAL_MU:g}], got {lam}")
        out = np.zeros(int(n), dtype=np.int64)
        if lam == 0 or n == 0:
            return out
        if lam < 10:
            return self._poisson_mult(out, lam)
        return self._poisson_ptrs(out, lam)

    def _poisson_mult(self, out: np.ndarray, lam: float) -> np.ndarray:
        limit = math.exp(-lam)
        prod = np.ones(out.size)
        todo = np.arange(out.size)
        while todo.size:
            prod[todo] *= self.uniform(todo.size)
            more = prod[todo] > limit
            out[todo[more]] += 1
            todo = todo[more]
        return out

    def _poisson_ptrs(self, out: np.ndarray, lam: float) -> np.ndarray:
        slam = math.sqrt(lam)
        b = 0.931 + 2.53 * slam
        a = -0.059 + 0.02483 * b
        invalpha = 1.1239 + 1.1328 / (b - 3.4)
        vr = 0.9277 - 3.6224 / (b - 2)
        todo = np.arange(out.size)
        while todo.size:
            u = self.uniform(todo.size) - 0.5
            v = self.uniform(todo.size)
            us = 0.5 - np.abs(u)
            with np.errstate(divide="ignore", invalid="ignore"):
                k = np.floor((2 * a / us + b) * u + lam + 0.43)
                fast = (us >= 0.07) & (v <= vr)
                slow = ~fast & np.isfinite(k) & (k >= 0) & ~((us < 0.013) & (v > us))
                lhs = np.log(v[slow]) + math.log(invalpha) - np.log(a / (us[slow] * us[slow]) + b)
            accept = fast.copy()
            accept[slow] = lhs <= _poisson_logpmf(k[slow], lam)
            out[todo[accept]] = k[accept].astype(np.int64)
            todo = todo[~accept]
        return out

    def skellam(self, n: int, mu: float) -> np.ndarray:
        """``n`` draws of Sk(μ/2, μ/2) = Poisson(μ/2) − Poisson(μ/2): integer, mean 0, variance ``mu``."""
        return self.poisson(n, mu / 2) - self.poisson(n, mu / 2)

    def discrete_gaussian(self, n: int, sigma2: float) -> np.ndarray:
        """``n`` draws of the discrete Gaussian N_Z(0, σ²) (P(x) ∝ exp(−x²/2σ²) on the integers; int64):
        Canonne, Kamath & Steinke (2020), Algorithm 3 — a discrete Laplace of scale t = ⌊σ⌋ + 1 (the
        difference of two geometrics), accepted with probability exp(−(|y| − σ²/t)²/2σ²) — in floating
        point on this source's uniforms."""
        if not (math.isfinite(sigma2) and 0 <= sigma2 <= MAX_LOCAL_MU):
            raise ConfigError(f"discrete Gaussian σ² must lie in [0, {MAX_LOCAL_MU:g}], got {sigma2}")
        out = np.zeros(int(n), dtype=np.int64)
        if sigma2 == 0 or n == 0:
            return out
        t = math.floor(math.sqrt(sigma2)) + 1
        todo = np.arange(out.size)
        while todo.size:
            m = todo.size
            # geometric on {0, 1, …} with P(k) ∝ e^{−k/t}: ⌊−t·log U⌋ for U uniform in (0, 1]
            g1 = np.floor(-t * np.log1p(-self.uniform(m)))
            g2 = np.floor(-t * np.log1p(-self.uniform(m)))
            y = g1 - g2
            accept = self.uniform(m) < np.exp(-((np.abs(y) - sigma2 / t) ** 2) / (2 * sigma2))
            out[todo[accept]] = y[accept].astype(np.int64)
            todo = todo[~accept]
        return out

    def state_dict(self) -> dict:
        """A seeded source's generator state (plain JSON); a secure source has none to save."""
        if self._gen is None:
            return {"secure": True}
        return {"secure": False, "generator": self._gen.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (a secure source starts afresh)."""
        if not isinstance(state, dict) or bool(state.get("secure")) != self.secure:
            raise ValueError("discrete noise state and discrete noise source disagree on 'secure'")
        if self._gen is not None:
            self._gen.bit_generator.state = state["generator"]


_STIRLING_EXACT = 16


def _stirlerr(k: np.ndarray) -> np.ndarray:
    """log k! − (k log k − k + ½ log 2πk), for k ≥ 1: exact below 16, the Stirling series above."""
    from scipy.special import gammaln

    out = np.empty_like(k)
    small = k < _STIRLING_EXACT
    ks = k[small]
    out[small] = gammaln(ks + 1) - (ks * np.log(ks) - ks + 0.5 * np.log(2 * math.pi * ks))
    kl = k[~small]
    k2 = kl * kl
    out[~small] = (1.0 / 12 - (1.0 / 360 - (1.0 / 1260 - 1.0 / (1680 * k2)) / k2) / k2) / kl
    return out


def _poisson_logpmf(k: np.ndarray, lam: float) -> np.ndarray:
    """log P(Poisson(λ) = k) for integer k ≥ 0 as −bd0(k, λ) − ½ log 2πk − stirlerr(k) (Loader 2000), with
    bd0 = k log(k/λ) + λ − k = λ·((1+t) log1p(t) − t), t = (k − λ)/λ: no cancellation of large terms."""
    out = np.full(k.shape, -lam, dtype=np.float64)  # k = 0
    pos = k > 0
    kp = k[pos]
    t = (kp - lam) / lam
    bd0 = lam * ((1 + t) * np.log1p(t) - t)
    out[pos] = -bd0 - 0.5 * np.log(2 * math.pi * kp) - _stirlerr(kp)
    return out


# ----------------------------------------------------------------------------------------------- encoding
def _rotation_signs(rotation_seed: int, n: int) -> np.ndarray:
    """±1 signs of the randomised Hadamard rotation from the public seed: SHAKE-256 of the seed, the same
    on every machine and every numpy version (all parties of a round must agree bit for bit)."""
    if not _is_int(rotation_seed) or not 0 <= rotation_seed < 2**256:
        raise ConfigError(f"the rotation seed must be an integer in [0, 2^256), got {_show(rotation_seed)}")
    digest = hashlib.shake_256(b"silofl.discrete.rotation\x00" + int(rotation_seed).to_bytes(32, "big"))
    bits = np.unpackbits(np.frombuffer(digest.digest((n + 7) // 8), dtype=np.uint8))[:n]
    return 1.0 - 2.0 * bits.astype(np.float64)


def _hadamard(x: np.ndarray) -> np.ndarray:
    """The orthonormal Walsh–Hadamard transform H·x/√n of a power-of-2 length vector (its own inverse)."""
    n = x.size
    y = x.astype(np.float64, copy=True)
    h = 1
    while h < n:
        y = y.reshape(-1, 2, h)
        y = np.stack((y[:, 0] + y[:, 1], y[:, 0] - y[:, 1]), axis=1)
        h *= 2
    return y.reshape(n) / math.sqrt(n)


def rotate(x: np.ndarray, mech: DiscreteMechanism, *, rotation_seed: int) -> np.ndarray:
    """Pad ``x`` (dim,) to (padded_dim,), flip signs from the public seed, apply the Hadamard transform."""
    d = mech.padded_dim()
    padded = np.zeros(d, dtype=np.float64)
    padded[: mech.dim] = x
    return _hadamard(padded * _rotation_signs(rotation_seed, d))


def unrotate(y: np.ndarray, mech: DiscreteMechanism, *, rotation_seed: int) -> np.ndarray:
    """The inverse of :func:`rotate`: the Hadamard transform, the signs again, crop the padding."""
    d = mech.padded_dim()
    return (_hadamard(y) * _rotation_signs(rotation_seed, d))[: mech.dim]


def conditional_round(x: np.ndarray, bound: float, rng: DiscreteRandom) -> np.ndarray:
    """Randomised rounding of ``x`` to integers (up with probability the fractional part), retried until
    the rounded vector's L2 norm is ≤ ``bound`` (Kairouz et al.'s conditional rounding); int64."""
    floor = np.floor(x)
    frac = x - floor
    for _ in range(MAX_ROUNDING_TRIES):
        rounded = floor + (rng.uniform(x.size) < frac)
        if float(np.linalg.norm(rounded)) <= bound:
            return rounded.astype(np.int64)
    raise RuntimeError(f"conditional rounding failed {MAX_ROUNDING_TRIES} times (norm bound {bound:g})")


def _check_vector(x: Any, n: int, what: str) -> np.ndarray:
    if not isinstance(x, np.ndarray) or x.shape != (n,):
        raise ValueError(f"{what} must be a numpy array of shape ({n},), got {getattr(x, 'shape', type(x))}")
    return x


def encode(x: np.ndarray, mech: DiscreteMechanism, *, rotation_seed: int, rng: DiscreteRandom) -> np.ndarray:
    """One party's float vector (dim,) → its encoding (padded_dim,) uint64 in [0, 2^bits): clip to c, rotate
    (public seed), scale by γ, conditional randomised rounding, add Skellam(local_mu) noise, reduce mod
    2^bits (see the module doc). A mechanism of ``per_party`` > 1 summands takes :func:`encode_parts`."""
    if mech.per_party != 1:
        raise ValueError(f"the mechanism sums {mech.per_party} summands per party: use encode_parts")
    return encode_parts([x], mech, rotation_seed=rotation_seed, rng=rng)


def _rounded(x: Any, mech: DiscreteMechanism, rotation_seed: int, rng: DiscreteRandom) -> np.ndarray:
    """One summand (dim,) clipped to c, rotated, scaled by γ and conditionally rounded (int64, padded)."""
    x = _check_vector(x, mech.dim, "the vector to encode")
    if not np.issubdtype(x.dtype, np.floating) and not np.issubdtype(x.dtype, np.integer):
        raise ValueError(f"the vector to encode must be numeric, got {x.dtype}")
    x = x.astype(np.float64)
    if not np.all(np.isfinite(x)):
        raise ValueError("the vector to encode has non-finite values")
    peak = float(np.max(np.abs(x)))
    if peak > 0:  # ‖x‖ = peak·‖x/peak‖: no overflow for huge finite values
        unit = x / peak
        unit_norm = float(np.linalg.norm(unit))
        if peak * unit_norm > mech.clip:
            x = unit * (mech.clip / unit_norm)
    scaled = rotate(x, mech, rotation_seed=rotation_seed) * mech.scale
    return conditional_round(scaled, mech.l2_sensitivity(), rng)


def encode_parts(
    parts: Sequence[np.ndarray], mech: DiscreteMechanism, *, rotation_seed: int, rng: DiscreteRandom
) -> np.ndarray:
    """One party's ``per_party`` summands, each a float vector (dim,) → the party's encoding (padded_dim,)
    uint64 in [0, 2^bits): each summand clipped to c, rotated, scaled and conditionally rounded on its own
    (so one summand moves the party's integer sum by its own rounded vector, of norm ≤ the L2 sensitivity),
    the rounded summands added, the party's noise added once, reduced mod 2^bits."""
    if not isinstance(parts, list | tuple) or len(parts) != mech.per_party:
        got = len(parts) if isinstance(parts, list | tuple) else type(parts).__name__
        raise ValueError(f"the mechanism takes {mech.per_party} summands per party, got {got}")
    rounded = np.zeros(mech.padded_dim(), dtype=np.int64)
    for x in parts:
        rounded += _rounded(x, mech, rotation_seed, rng)
    return _noised(rounded, mech, rng)


def _noised(rounded: np.ndarray, mech: DiscreteMechanism, rng: DiscreteRandom) -> np.ndarray:
    """A party's rounded integer vector plus its noise share, reduced mod 2^bits (uint64)."""
    if mech.kind == "ddgauss":
        noisy = rounded + rng.discrete_gaussian(rounded.size, mech.local_mu)
    else:
        noisy = rounded + rng.skellam(rounded.size, mech.local_mu)
    return (noisy & np.int64((1 << mech.bits) - 1)).astype(np.uint64)


def encode_sum(
    x: np.ndarray, mech: DiscreteMechanism, *, rotation_seed: int, rng: DiscreteRandom, bound: float
) -> np.ndarray:
    """Pooled example-level noise (:func:`calibrate_pooled`): one party's float vector (dim,) — the sum of its
    examples' vectors, each clipped to ``mech.clip`` by the caller, so of L2 norm ≤ ``bound`` (refused
    above: the group was sized for it) — → its encoding (padded_dim,) uint64: rotate (public seed), scale by
    γ, *plain* randomised rounding of the sum (the mechanism's β is 0), add the party's noise share, reduce
    mod 2^bits. The sum is not clipped here: clipping it would break the per-example sensitivity."""
    if mech.beta != 0 or mech.per_party != 1:
        raise ValueError("encode_sum takes a pooled mechanism (calibrate_pooled: β = 0, one summand)")
    x = _check_vector(x, mech.dim, "the vector to encode")
    x = x.astype(np.float64)
    if not np.all(np.isfinite(x)):
        raise ValueError("the vector to encode has non-finite values")
    norm = float(np.linalg.norm(x))
    if not norm <= bound * (1 + 1e-9):
        raise ValueError(f"the sum's norm {norm:.6g} exceeds its bound {bound:.6g} (rows × clip)")
    scaled = rotate(x, mech, rotation_seed=rotation_seed) * mech.scale
    return _noised(conditional_round(scaled, math.inf, rng), mech, rng)


def _check_group(a: Any, bits: int, what: str) -> np.ndarray:
    if not isinstance(a, np.ndarray) or a.ndim != 1 or a.dtype != np.uint64:
        raise ValueError(f"{what} must be a 1-D uint64 numpy array")
    if a.size and int(a.max()) >= 1 << bits:
        raise ValueError(f"{what} has values outside [0, 2^{bits})")
    return a


def add_mod(a: np.ndarray, b: np.ndarray, bits: int) -> np.ndarray:
    """a + b in Z_{2^bits} (uint64 arrays of equal shape with values in [0, 2^bits))."""
    if not _is_int(bits) or not MIN_BITS <= bits <= MAX_BITS:
        raise ValueError(f"bits must be an integer in [{MIN_BITS}, {MAX_BITS}], got {_show(bits)}")
    a, b = _check_group(a, bits, "a"), _check_group(b, bits, "b")
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} and {b.shape}")
    return (a + b) & np.uint64((1 << bits) - 1)  # uint64 arithmetic wraps mod 2^64, a multiple of 2^bits


def centre(total: np.ndarray, bits: int) -> np.ndarray:
    """Group elements (uint64 in [0, 2^bits)) as the integers in [−2^(bits−1), 2^(bits−1)) they stand for
    (int64)."""
    if not _is_int(bits) or not MIN_BITS <= bits <= MAX_BITS:
        raise ValueError(f"bits must be an integer in [{MIN_BITS}, {MAX_BITS}], got {_show(bits)}")
    signed = _check_group(total, bits, "the group elements").astype(np.int64)
    return np.where(signed >= 1 << (bits - 1), signed - (1 << bits), signed)


def decode(total: np.ndarray, mech: DiscreteMechanism, *, rotation_seed: int) -> np.ndarray:
    """The modular sum of the parties' encodings (padded_dim,) uint64 → the float sum (dim,): centre into
    [−2^(bits−1), 2^(bits−1)), divide by γ, rotate back, crop the padding."""
    total = _check_group(_check_vector(total, mech.padded_dim(), "the sum to decode"), mech.bits, "the sum")
    return unrotate(
        centre(total, mech.bits).astype(np.float64) / mech.scale, mech, rotation_seed=rotation_seed
    )


def fresh_rotation_seed() -> int:
    """A fresh 128-bit rotation seed (the coordinator draws one per round and sends it to every party; it
    is public, but must not be known before the parties' vectors are fixed)."""
    return secrets.randbits(128)
