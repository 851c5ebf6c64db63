"""Pure privacy analysis: ε of a mechanism history, σ for a target ε, steps within a budget, and the
client-level calibration arithmetic. No state lives here (the stateful accountants and budgets that
record what ran are in :mod:`silofl.privacy.accountant`), as Opacus keeps ``accountants/analysis``
apart from its accountants.

A *history* is a tuple of ``(noise_multiplier σ, sample_rate q, steps)`` of the Poisson-subsampled
Gaussian mechanism. ε is computed from it by Opacus:

* ``rdp``: ``opacus.accountants.analysis.rdp`` (Mironov et al.) with the orders of
  ``opacus.accountants.RDPAccountant``. RDP composes additively over steps, so the per-step RDP vector
  is computed once per (q, σ) and scaled by the step count — the same numbers ``RDPAccountant`` gives
  (tested), at a fraction of the cost.
* ``prv``: ``opacus.accountants.PRVAccountant`` (Gopi et al.), tighter, slower.

Results are cached, so 8 sites with the same history cost one computation.

Client-level DP (McMahan et al. 2018; Andrew et al. 2021). One round releases three blocks, each a
Gaussian mechanism:

* the sum of the clipped updates plus N(0, (z_Δ·C)² I);
* optionally (adaptive clipping) the count of unclipped updates, centred, plus N(0, σ_b²);
* optionally (adaptive intermediaries) the sum of the clipped update norms plus N(0, (z_n·C)²).

Scaling each block by 1/noise std turns the joint release into one Gaussian mechanism whose noise
multiplier for a unit u is z_u with z_u⁻² = Σ_blocks (Δ_u,block / noise std_block)², Δ_u,block being how
far adding or removing one u moves that block (Andrew et al., §3). The user chooses the total z of the
*calibrated* unit and :func:`update_noise_multiplier` solves for z_Δ. With v sub-clients per hospital:

| block | calibrated per hospital (sub-clients clipped to C/v) | calibrated per sub-client (clipped to C) |
|---|---|---|
| update sum | hospital C, sub-client C/v | sub-client C, hospital v·C |
| unclipped count | hospital ½ (it sends its fraction in [0, 1], centred by ½), sub-client 1/v | sub-client
**1** (v is public and fixed, so the centring stays when one is absent), hospital v/2 |
| norm sum | hospital C, sub-client C/v | sub-client C, hospital v·C |

:func:`unit_noise_multipliers` composes the blocks per unit exactly (group privacy of the Gaussian
mechanism by the triangle inequality, tighter than the generic (kε, k·e^{kε}·δ) bound). ε_hospital
bounds everything a hospital holds — any of its records, any set of them. ε_subclient bounds one
sub-client's shard as the hospital split it that round; it is not a bound for one record, since
removing a record re-splits the hospital's data and changes every shard.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from silofl.core.errors import ConfigError
from silofl.core.registry import Registry

DEFAULT_ORDERS: tuple[float, ...] = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))
UNITS = ("hospital", "subclient")

History = tuple[tuple[float, float, int], ...]


# ---------------------------------------------------------------------------------------------- accountants
@dataclass(frozen=True)
class AccountantSpec:
    """How an accountant is built and asked for ε (an entry of :data:`ACCOUNTANTS`).

    ``reported``: its name in summaries and ledgers (``opacus.rdp``). ``build()``: a fresh accountant object
    in the Opacus interface (``.history`` a list of (σ, q, steps), ``.get_epsilon(delta)``), e.g. Opacus'
    ``PRVAccountant`` or a wrapper of a dp-accounting one.
    ``epsilon(history, delta, orders) -> (ε, order or None)``: an optional faster route to the same numbers
    (the RDP accountant's per-step curve, scaled by the steps). ``opacus``: the mechanism name Opacus'
    ``get_noise_multiplier`` takes for σ calibration; None calibrates by the same bisection over this
    accountant's own ε (:func:`noise_multiplier_for`)."""

    reported: str
    build: Callable[[], Any]
    epsilon: Callable[[History, float, tuple[float, ...]], tuple[float, float | None]] | None = None
    opacus: str | None = None
    description: str = ""


ACCOUNTANTS: Registry[AccountantSpec] = Registry("accountant", "silofl.accountants")
"""Every accountant by name (group ``silofl.accountants``): ``rdp`` and ``prv``; another package adds one with
``ACCOUNTANTS.register(name, AccountantSpec(...))`` in a module it names in that entry-point group."""


def _rdp_epsilon(history: History, delta: float, orders: tuple[float, ...]) -> tuple[float, float | None]:
    from opacus.accountants.analysis.rdp import get_privacy_spent

    rdp = sum(steps * _rdp_per_step(q, sigma, orders) for sigma, q, steps in history)
    eps, best = get_privacy_spent(orders=list(orders), rdp=rdp, delta=delta)
    return float(eps), float(best)


def _opacus(name: str) -> Callable[[], Any]:
    def build() -> Any:
        from opacus.accountants import create_accountant

        return create_accountant(mechanism=name)  # RDPAccountant() / PRVAccountant()

    build.__qualname__ = f"build_opacus_{name}"
    return build


ACCOUNTANTS.register(
    "rdp",
    AccountantSpec(
        "opacus.rdp",
        _opacus("rdp"),
        _rdp_epsilon,
        opacus="rdp",
        description="Rényi DP of the subsampled Gaussian (Mironov et al.), Opacus",
    ),
)
ACCOUNTANTS.register(
    "prv",
    AccountantSpec(
        "opacus.prv",
        _opacus("prv"),
        opacus="prv",
        description="privacy random variables (Gopi et al.), Opacus; tighter",
    ),
)


class _ReportedNames(Mapping[str, str]):
    """``{name: reported name}`` of every registered accountant, read from :data:`ACCOUNTANTS` when asked."""

    def __getitem__(self, name: str) -> str:
        if name not in ACCOUNTANTS:
            raise KeyError(name)
        return ACCOUNTANTS.get(name).reported

    def __iter__(self) -> Iterator[str]:
        return iter(ACCOUNTANTS.names())

    def __len__(self) -> int:
        return len(ACCOUNTANTS)

    def __repr__(self) -> str:
        return repr(dict(self))


ACCOUNTANT_NAMES: Mapping[str, str] = _ReportedNames()


@lru_cache(maxsize=256)
def _rdp_per_step(q: float, sigma: float, orders: tuple[float, ...]) -> np.ndarray:
    from opacus.accountants.analysis.rdp import compute_rdp

    return np.asarray(
        compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=list(orders)), dtype=np.float64
    )


@lru_cache(maxsize=4096)
def _epsilon(
    kind: str, history: History, delta: float, orders: tuple[float, ...] = DEFAULT_ORDERS
) -> tuple[float, float | None]:
    if not history:
        return 0.0, None
    spec = ACCOUNTANTS.get(kind)
    if spec.epsilon is not None:
        return spec.epsilon(history, delta, orders)
    acc = spec.build()
    acc.history = list(history)
    return float(acc.get_epsilon(delta=delta)), None


def rdp_curve(history: History, orders: tuple[float, ...] = DEFAULT_ORDERS) -> np.ndarray:
    """The RDP curve ε(λ) at ``orders`` of a Poisson-subsampled Gaussian history (Mironov et al., as the
    ``rdp`` accountant computes it; zeros for an empty history)."""
    curve = np.zeros(len(orders), dtype=np.float64)
    for sigma, q, steps in history:
        check_mechanism(sigma, q, steps)
        curve = curve + steps * _rdp_per_step(float(q), float(sigma), tuple(orders))
    return curve


def epsilon_from_rdp(orders, rdp, delta: float) -> tuple[float, float]:
    """(ε, order) at δ of an RDP curve: the conversion every ε of silofl's ``rdp`` accountant goes through
    (``opacus.accountants.analysis.rdp.get_privacy_spent``: Balle et al. 2020, Theorem 21)."""
    from opacus.accountants.analysis.rdp import get_privacy_spent

    if not 0 < delta < 1:
        raise ConfigError(f"δ must lie in (0, 1), got {delta}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eps, order = get_privacy_spent(
            orders=[float(a) for a in orders], rdp=[float(r) for r in rdp], delta=delta
        )
    return float(eps), float(order)


def delta_from_rdp(orders, rdp, epsilon: float) -> float:
    """The smallest δ the RDP curve gives at ``epsilon`` ≥ 0: per order λ, the conversion of
    :func:`epsilon_from_rdp` solved for δ, log δ = (λ−1)(ε(λ) − ε + log(1 − 1/λ)) − log λ (Canonne, Kamath &
    Steinke 2020, Prop. 12; Balle et al. 2020), and the total-variation bound δ ≤ √(1 − e^{−ε(λ)}) (KL ≤ D_λ,
    Bretagnolle–Huber), the same two bounds as ``dp_accounting``'s ``compute_delta``. At most 1."""
    if not epsilon >= 0:
        raise ConfigError(f"ε must be non-negative, got {epsilon}")
    best = 0.0  # log δ; δ ≤ 1 always
    for a, r in zip(orders, rdp, strict=True):
        a, r = float(a), float(r)
        if a < 1 or math.isnan(r) or r < 0:
            raise ConfigError(f"invalid RDP point (order {a}, ε {r})")
        if math.isinf(r):
            continue
        log_delta = -math.inf if r == 0 else 0.5 * math.log1p(-math.exp(-r))
        if a > 1.01:  # the conversion is numerically unstable as λ → 1, and useless there
            log_delta = min(log_delta, (a - 1) * (r - epsilon + math.log1p(-1 / a)) - math.log(a))
        best = min(best, log_delta)
    return math.exp(best)


def check_mechanism(noise_multiplier: float, sample_rate: float, steps: int = 1) -> None:
    """Raise ConfigError unless (σ, q, steps) describe a subsampled Gaussian mechanism the accountants
    can analyse: 0 < σ < ∞, 0 < q ≤ 1, steps ≥ 0 (an infinite σ would make Opacus search forever)."""
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0 and 0 < sample_rate <= 1 and steps >= 0):
        raise ConfigError(
            f"invalid mechanism: noise_multiplier={noise_multiplier}, sample_rate={sample_rate}, "
            f"steps={steps}"
        )


def epsilon_of(kind: str, history: History, delta: float) -> float:
    """ε(δ) of a Poisson-subsampled Gaussian history under accountant ``kind``."""
    return _epsilon(kind, tuple(history), float(delta))[0]


def best_order(history: History, delta: float) -> float | None:
    """The RDP order that attains the RDP accountant's ε for ``history`` (None for an empty history)."""
    return _epsilon("rdp", tuple(history), float(delta))[1]


def max_steps_within(
    kind: str,
    noise_multiplier: float,
    sample_rate: float,
    delta: float,
    target_epsilon: float,
    step_block: int = 1,
) -> int:
    """Largest multiple of ``step_block`` steps whose ε stays ≤ target (binary search on the accountant)."""

    def eps(blocks: int) -> float:
        return (
            epsilon_of(kind, ((noise_multiplier, sample_rate, blocks * step_block),), delta)
            if blocks
            else 0.0
        )

    if eps(1) > target_epsilon:
        return 0
    hi = 1
    while eps(hi * 2) <= target_epsilon:
        hi *= 2
        if hi > 2**40:
            return math.inf  # type: ignore[return-value]
    lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if eps(mid) <= target_epsilon else (lo, mid)
    return lo * step_block


CALIBRATION_TOLERANCE = 0.005  # a calibrated run ends within this much below its target ε
MAX_CALIBRATED_SIGMA = 1e4  # beyond this no useful model trains: the budget is treated as unreachable


def noise_multiplier_for(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    accountant: str = "rdp",
    tolerance: float = 0.01,
) -> float:
    """The noise multiplier σ at which ``steps`` steps at rate ``sample_rate`` end at ``target_epsilon``
    (Opacus' ``get_noise_multiplier``: a binary search on its accountant; the ε it returns lies in
    [target − tolerance, target]). Raises ValueError when no σ meets the target."""
    from opacus.accountants.utils import get_noise_multiplier

    spec = ACCOUNTANTS.get(accountant)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if spec.opacus is not None:
            return float(
                get_noise_multiplier(
                    target_epsilon=target_epsilon,
                    target_delta=delta,
                    sample_rate=sample_rate,
                    steps=steps,
                    accountant=spec.opacus,
                    epsilon_tolerance=tolerance,
                )
            )
        return _bisect_sigma(accountant, target_epsilon, delta, sample_rate, steps, tolerance)


def _bisect_sigma(
    kind: str, target_epsilon: float, delta: float, sample_rate: float, steps: int, tolerance: float
) -> float:
    """Opacus' ``get_noise_multiplier`` search (double σ from 20 until ε ≤ target, then bisect until ε lies
    within ``tolerance`` below it) over accountant ``kind``'s ε: σ calibration for an accountant Opacus does
    not know."""
    from opacus.accountants.utils import MAX_SIGMA

    def eps(sigma: float) -> float:
        return epsilon_of(kind, ((sigma, sample_rate, steps),), delta)

    eps_high, sigma_low, sigma_high = math.inf, 0.0, 10.0
    while eps_high > target_epsilon:
        sigma_high *= 2
        eps_high = eps(sigma_high)
        if sigma_high > MAX_SIGMA:
            raise ValueError("The privacy budget is too low.")
    while target_epsilon - eps_high > tolerance:
        sigma = (sigma_low + sigma_high) / 2
        e = eps(sigma)
        if e < target_epsilon:
            sigma_high, eps_high = sigma, e
        else:
            sigma_low = sigma
    return sigma_high


@lru_cache(maxsize=256)
def calibrate_sigma(
    target_epsilon: float, delta: float, sample_rate: float, steps: int, accountant: str = "rdp"
) -> float:
    """Budget-first σ: the noise multiplier with which ``steps`` steps of the Poisson-subsampled Gaussian
    mechanism at rate ``sample_rate`` end at ε ≤ ``target_epsilon`` (within :data:`CALIBRATION_TOLERANCE` of
    it) under the run's own accountant. Raises ConfigError, in one line, when the target cannot be met. Cached
    (a pure function; Opacus' search takes seconds): tuning trials that differ only in, say, the learning rate
    calibrate once."""
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise ConfigError(f"target_epsilon must be positive and finite, got {target_epsilon}")
    if steps < 1 or not 0 < sample_rate <= 1:
        raise ConfigError(f"cannot calibrate σ for {steps} steps at sample rate {sample_rate}")
    try:
        sigma = noise_multiplier_for(
            target_epsilon, delta, sample_rate, steps, accountant, tolerance=CALIBRATION_TOLERANCE
        )
    except (ValueError, OverflowError, ZeroDivisionError):
        sigma = math.inf
    if not math.isfinite(sigma) or sigma > MAX_CALIBRATED_SIGMA:
        raise ConfigError(
            f"target_epsilon {target_epsilon:g} (δ={delta:g}) is unreachable for {steps} steps at "
            f"sample rate {sample_rate:.4g}: even σ = {MAX_CALIBRATED_SIGMA:g} spends more; raise the "
            "budget or lower the rounds or the sampling rate"
        )
    if (
        epsilon_of(accountant, ((sigma, sample_rate, steps),), delta) > target_epsilon
    ):  # never trust the search blindly
        raise ConfigError(f"σ calibration for target_epsilon {target_epsilon:g} did not meet the target")
    return sigma


# ---------------------------------------------------------------------------------------------- client level
COUNT_SENSITIVITY = {"hospital": 0.5, "subclient": 1.0}  # of the calibrated unit (see the module doc)


def update_noise_multiplier(
    z_total: float,
    count_std: float | None = None,
    norm_z: float | None = None,
    count_sensitivity: float = 0.5,
) -> float:
    """z_Δ such that the update sum, the noised unclipped count (std σ_b, the calibrated unit's sensitivity
    ``count_sensitivity``) and the noised norm sum (noise multiplier z_n) together form a Gaussian mechanism
    of multiplier z_total."""
    if z_total <= 0:
        raise ConfigError(f"noise multiplier must be positive, got {z_total}")
    inv = z_total**-2
    if count_std is not None:
        if count_std <= 0:
            raise ConfigError(f"the clip-count noise std must be positive, got {count_std}")
        inv -= (count_sensitivity / count_std) ** 2
    if norm_z is not None:
        if norm_z <= 0:
            raise ConfigError(f"the norm-sum noise multiplier must be positive, got {norm_z}")
        inv -= norm_z**-2
    if inv <= 0:
        raise ConfigError(
            f"the auxiliary releases (clip count noise std {count_std}, norm-sum noise multiplier {norm_z}) "
            f"already "
            f"use the whole noise budget of z = {z_total:g}; raise their noise or z"
        )
    return inv**-0.5


def unit_noise_multipliers(
    z: float, v: int, calibrated_for: str, count_std: float | None = None, norm_z: float | None = None
) -> dict[str, float]:
    """The noise multiplier of one round's mechanism for each privacy unit (see the module doc's table).

    ``z`` is the calibrated unit's total multiplier (it is that unit's entry, exactly); ``count_std`` and
    ``norm_z`` describe the auxiliary blocks when they are released. Without them the other unit's multiplier
    is z/v (hospital of a sub-client calibrated run) or z·v (sub-client of a hospital calibrated run).
    """
    if calibrated_for not in UNITS:
        raise ConfigError(f"unknown privacy unit {calibrated_for!r}; choose one of: {', '.join(UNITS)}")
    if v < 1:
        raise ConfigError(f"need at least one sub-client per hospital, got {v}")
    other = "subclient" if calibrated_for == "hospital" else "hospital"
    z_update = update_noise_multiplier(z, count_std, norm_z, COUNT_SENSITIVITY[calibrated_for])
    # the other unit's sensitivity of each block, relative to the calibrated unit's bound C
    scale = 1.0 / v if calibrated_for == "hospital" else float(v)
    count_sens = 1.0 / v if calibrated_for == "hospital" else v / 2.0
    inv = (scale / z_update) ** 2
    if count_std is not None:
        inv += (count_sens / count_std) ** 2
    if norm_z is not None:
        inv += (scale / norm_z) ** 2
    zs = {calibrated_for: z, other: inv**-0.5}
    if count_std is None and norm_z is None:  # the plain mechanism: exactly z·v or z/v
        zs[other] = z * v if calibrated_for == "hospital" else z / v
    return zs


def subclient_clip(clip: float, v: int, unit: str) -> float:
    """The bound each sub-client update is clipped to so that one ``unit`` has sensitivity ``clip``."""
    return clip / v if unit == "hospital" else clip
