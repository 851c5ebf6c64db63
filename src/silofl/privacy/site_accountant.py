"""One accountant per site: every mechanism its ledger records, composed in one representation, checked
against the one lifetime budget before a step, whatever the protocol.

A site's ledger (:mod:`silofl.privacy.ledger`) holds every release of its records, one entry per release,
kind naming the mechanism. The :class:`SiteAccountant` turns each entry into a :class:`Spend` (pure
converters, one per kind, in the :data:`LEDGER_KINDS` registry) and composes them:

* **RDP over one fixed grid of orders** (:data:`ORDERS`: Opacus' orders and the discrete accountant's
  integer orders) for every mechanism whose Rényi curve is known — the Poisson-subsampled Gaussian of
  DP-SGD (``dp-sgd``: Mironov et al., the curve :func:`silofl.privacy.analysis.rdp_curve` computes), the
  Skellam and distributed discrete Gaussian sums of secure rounds (``secagg-discrete``:
  :func:`silofl.privacy.discrete.rdp`; the discrete bounds are stated at integer orders, and since Rényi
  divergence never decreases with the order, a fractional order λ takes the bound at ⌈λ⌉ — an upper bound),
  client-level rounds (``client-level``: the subsampled Gaussian of the hospital's noise multiplier) and
  tuning trials (``tuning``: every trial's subsampled Gaussian composed, or Papernot & Steinke's curve of the
  best of K random trials, :mod:`silofl.privacy.tuning`, the cap on K in δ).
  RDP composes by adding the curves; (ε, δ) comes from the one conversion every ε of silofl's RDP
  accountant uses (:func:`silofl.privacy.analysis.epsilon_from_rdp`).
* **(ε, δ) given** — PubSub-ML releases (``release``: the largest spend of any record over the releases
  that contain it, :func:`silofl.privacy.ledger.release_spend`) and the prior spend a restore declares
  (``restore``) — composed on top by basic composition: ε_total(δ) = ε_RDP(δ − Σδᵢ) + Σεᵢ, so the whole is
  (ε_total, δ)-DP (Dwork & Roth, Theorem 3.16, applied to the RDP part as one (ε_RDP, δ − Σδᵢ) mechanism).

**Per threat.** ``outsiders`` see what leaves the protocol (models, publications), ``server`` sees what the
server of the protocol sees, ``colluders`` is the server together with ``c`` colluding sites (c from the
site's policy, :attr:`silofl.site.policy.SitePolicy.colluders`). Noise a site adds itself (DP-SGD, a
publication) protects against all three alike. A secure sum is seen by the server with the noise shares of
the honest survivors only: against the server the mechanism's ``min_survivors`` shares (the protocol
releases nothing below that floor), against server + c colluders the min_survivors − c shares the
colluders cannot subtract (none left: no guarantee; a site's policy keeps its floor at c + 2 or more). A
client-level round whose server adds the noise protects nothing against that server (∞).

**Units.** A ``dp-sgd`` block protects one row (``unit: row``) or one person (``person (column X)``); a secure
client-level round the whole hospital (``whole_party``). A guarantee for a larger unit holds for every smaller
one, so the composed ε holds for the *smallest* unit any block names; a row-level block protects a person with
k rows only at group-privacy level (k·ε), which :meth:`SiteAccountant.report` says (``caveat``). The lifetime
check (:meth:`SiteAccountant.require`) compares the composed ε against the strongest threat the site assumes
(server + c colluders) at the lifetime δ, *before* the step, with the planned mechanisms of the run added
(:func:`planned_dpsgd`, :func:`planned_secure`, :func:`planned_release`, :func:`planned_tuning`: ledger-shaped
dicts, so planned and recorded spend take one path).

:func:`ledger_events` turns a ledger into dp-accounting ``DpEvent``\\ s (the discrete sums, which
dp-accounting lacks, as their RDP curves; the (ε, δ) parts as given), and :func:`recompute` composes them
with dp-accounting's own RDP accountant — the independent recomputation an auditor runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from silofl.core.errors import BudgetExhausted, ConfigError
from silofl.core.registry import Registry
from silofl.privacy.analysis import DEFAULT_ORDERS, epsilon_from_rdp, rdp_curve
from silofl.privacy.discrete import DISCRETE_ORDERS, DiscreteMechanism
from silofl.privacy.discrete import rdp as discrete_rdp_at
from silofl.privacy.ledger import Ledger, lifetime_of, release_spend

THREATS: tuple[str, ...] = ("outsiders", "server", "colluders")
"""Who an ε holds against: whoever sees the released models; the protocol's server; the server plus c
colluding sites."""
ORDERS: tuple[float, ...] = tuple(
    sorted({float(a) for a in DEFAULT_ORDERS} | {float(a) for a in DISCRETE_ORDERS})
)
"""The one grid of RDP orders every mechanism of a site is composed on."""
NOT_SPENDING = frozenset({"genesis", "budget", "cancel"})
"""Ledger kinds that release nothing (``cancel`` withdraws a release: :func:`release_spend` reads it)."""
PER_RECORD = frozenset({"release"})
"""Ledger kinds composed per record (:func:`release_spend`), not per site."""
ACCOUNTANT_NAME = "silofl.site (RDP over one grid of orders + basic composition of (ε, δ) releases)"
_UNIT_RANK = {"row": 0, "record": 0, "person": 1, "subclient": 1, "hospital": 2}


def threat_label(threat: str, colluders: int = 0) -> str:
    """The parties an ε for ``threat`` holds against, in words."""
    check_threat(threat)
    return {
        "outsiders": "outsiders (whoever sees what the site releases)",
        "server": "the server and outsiders",
        "colluders": (
            f"the server plus {colluders} colluding site{'s' if colluders != 1 else ''}"
            if colluders
            else "the server (no colluding sites assumed)"
        ),
    }[threat]


def check_threat(threat: str) -> str:
    """ConfigError unless ``threat`` is one of :data:`THREATS`."""
    if threat not in THREATS:
        raise ConfigError(f"unknown threat {threat!r}; choose one of: {', '.join(THREATS)}")
    return threat


def check_colluders(colluders: Any) -> int:
    """ConfigError unless ``colluders`` is a non-negative integer."""
    if isinstance(colluders, bool) or not isinstance(colluders, int | np.integer) or colluders < 0:
        raise ConfigError(f"colluders must be a non-negative integer, got {colluders!r}")
    return int(colluders)


# ---------------------------------------------------------------------------------------------- pure math
@dataclass(frozen=True)
class Spend:
    """One mechanism of a site's books in the accountant's representation: its RDP curve over
    :data:`ORDERS` per threat (None: none known) and an (ε, δ) composed on top by basic composition."""

    kind: str
    unit: str
    rdp: Mapping[str, np.ndarray] | None = None
    approx: tuple[float, float] = (0.0, 0.0)
    seq: int | None = None  # the ledger entry (None: planned)
    tail: float = 0.0  # a chance τ the mechanism differs from its RDP curve's: costs (1 + e^ε)τ of δ


def honest_survivors(survivors: int, colluders: int) -> int:
    """The noise shares of a secure sum that ``colluders`` colluding parties cannot subtract: survivors − c,
    at least 0 (the colluders are taken to be among the survivors, the worst case; 0 leaves no guarantee) —
    the rule of ``silofl.privacy.discrete.honest_survivors`` on the pooled-noise branch, which this one
    should call once both are merged."""
    return max(0, int(survivors) - check_colluders(colluders))


def discrete_rdp(
    mech: DiscreteMechanism, *, survivors: int, whole_party: bool = True, orders: Sequence[float] = ORDERS
) -> np.ndarray:
    """RDP of one release of a discrete secure sum (:func:`silofl.privacy.discrete.rdp`) at ``orders``: an
    order λ takes the bound at the integer max(2, ⌈λ⌉) ≥ λ (Rényi divergence is non-decreasing in the order,
    so this is an upper bound)."""
    if survivors == 0:  # no honest share: nothing protects the sum
        return np.full(len(orders), math.inf)
    ints = np.maximum(2, np.ceil(np.asarray(orders, dtype=np.float64))).astype(np.int64)
    uniq = np.unique(ints)
    vals = discrete_rdp_at(mech, [int(a) for a in uniq], survivors=int(survivors), whole_party=whole_party)
    return np.asarray(vals, dtype=np.float64)[np.searchsorted(uniq, ints)]


def compose(spends: Iterable[Spend], threat: str) -> tuple[np.ndarray, float, float, float]:
    """(the RDP curve over :data:`ORDERS`, Σεᵢ, Σδᵢ, Στᵢ) of ``spends`` against ``threat``."""
    check_threat(threat)
    curve = np.zeros(len(ORDERS), dtype=np.float64)
    eps = dlt = tail = 0.0
    for s in spends:
        if s.rdp is not None:
            curve = curve + s.rdp[threat]
        eps, dlt, tail = eps + s.approx[0], dlt + s.approx[1], tail + s.tail
    return curve, eps, dlt, tail


def with_tail(epsilon: Callable[[float], float], delta: float, tail: float) -> float:
    """ε of a mechanism that differs, with chance at most ``tail`` τ independent of the data, from one whose ε
    at δ' is ``epsilon(δ')``: the ε at which δ' + (1 + e^ε)τ = ``delta`` (coupling,
    :mod:`silofl.privacy.tuning`); inf when τ leaves no δ."""
    eps = epsilon(delta)
    if tail <= 0 or not math.isfinite(eps):
        return eps
    for _ in range(200):
        slack = tail * (1 + math.exp(min(eps, 700.0)))
        if slack >= delta:
            return math.inf
        new = epsilon(delta - slack)
        if new <= eps:
            return eps
        eps = new * (1 + 1e-9)
    return math.inf


def epsilon_at(curve: np.ndarray, approx: tuple[float, float], delta: float) -> float:
    """ε at total ``delta`` of an RDP curve composed with an (ε, δ) part: ε_RDP(δ − Σδᵢ) + Σεᵢ; inf when the
    (ε, δ) part alone takes δ (or the curve is infinite)."""
    if not 0 < delta < 1:
        raise ConfigError(f"δ must lie in (0, 1), got {delta}")
    eps_a, d_a = approx
    if not np.any(curve > 0):
        return eps_a if d_a <= delta * (1 + 1e-12) else math.inf
    if d_a >= delta or not np.any(np.isfinite(curve)):
        return math.inf
    return epsilon_from_rdp(ORDERS, curve, delta - d_a)[0] + eps_a


def weakest_unit(units: Iterable[str]) -> str | None:
    """The smallest unit among ``units`` (row < person < hospital): the one a composed ε holds for."""
    known = [u for u in units if _rank(u) is not None]
    return min(known, key=lambda u: _rank(u) or 0) if known else None


def _rank(unit: str) -> int | None:
    return _UNIT_RANK.get(unit.split(" ")[0])


# ---------------------------------------------------------------------------------------------- ledger kinds
LEDGER_KINDS: Registry[Callable[[dict, int], Spend]] = Registry("ledger entry kind", "silofl.ledger_kinds")
"""How each spending ledger kind becomes a :class:`Spend` (``f(entry, colluders)``): a package that records a
new kind registers its converter here (``LEDGER_KINDS.register("kind", f)``); a ledger holding a kind no
converter knows is refused, never silently left out."""


def _same(curve: np.ndarray) -> dict[str, np.ndarray]:
    return {t: curve for t in THREATS}


def _number(entry: dict, key: str, lo: float = 0.0) -> float:
    v = entry.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < lo:
        raise ConfigError(f"ledger entry {entry.get('seq')} ({entry.get('kind')}): bad {key} {v!r}")
    return float(v)


@LEDGER_KINDS.register("dp-sgd")
def dpsgd_spend(entry: dict, colluders: int) -> Spend:
    """A block of DP-SGD steps (σ, q, steps): the site adds the noise itself, so one curve for every
    threat."""
    steps = entry.get("steps")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ConfigError(f"ledger entry {entry.get('seq')} (dp-sgd): bad steps {steps!r}")
    hist = ((_number(entry, "noise_multiplier"), _number(entry, "sample_rate"), steps),)
    return Spend(
        "dp-sgd", str(entry.get("unit", "row")), _same(rdp_curve(hist, ORDERS)), seq=entry.get("seq")
    )


def _survivors(entry: dict, mech: DiscreteMechanism) -> int:
    """The noise shares a recorded secure sum holds: the mechanism's floor, or fewer if the entry says so."""
    n = entry.get("survivors")
    ok = isinstance(n, int) and not isinstance(n, bool) and 1 <= n < mech.min_survivors
    return int(n) if ok else mech.min_survivors  # type: ignore[arg-type]


@LEDGER_KINDS.register("secagg-discrete")
def secure_spend(entry: dict, colluders: int) -> Spend:
    """The discrete mechanisms of ``rounds`` (default 1) secure rounds the site masked: against outsiders and
    the server the ``min_survivors`` shares of each (or ``survivors`` if the entry records fewer), against
    server + c colluders the honest ones (:func:`honest_survivors`); the unit is the whole party (all its
    summands)."""
    mechs = entry.get("mechanisms")
    if not isinstance(mechs, list) or not mechs:
        raise ConfigError(f"ledger entry {entry.get('seq')} (secagg-discrete): no mechanisms")
    rounds = entry.get("rounds", 1)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise ConfigError(f"ledger entry {entry.get('seq')} (secagg-discrete): bad rounds {rounds!r}")
    server = np.zeros(len(ORDERS))
    colluding = np.zeros(len(ORDERS))
    for m in (DiscreteMechanism.from_dict(d) for d in mechs):
        n = _survivors(entry, m)
        server = server + discrete_rdp(m, survivors=n)
        colluding = colluding + discrete_rdp(m, survivors=honest_survivors(n, colluders))
    curves = {"outsiders": rounds * server, "server": rounds * server, "colluders": rounds * colluding}
    return Spend("secagg-discrete", str(entry.get("unit", "hospital")), curves, seq=entry.get("seq"))


@LEDGER_KINDS.register("client-level")
def client_level_spend(entry: dict, colluders: int) -> Spend:
    """A client-level round whose server adds the noise: the hospital's Gaussian (its multiplier, sampled at
    the entry's rate) against outsiders; nothing against the server, which saw the un-noised sum."""
    zs = entry.get("multipliers")
    if not isinstance(zs, dict) or not zs:
        raise ConfigError(f"ledger entry {entry.get('seq')} (client-level): no multipliers")
    z = _number(zs, "hospital") if "hospital" in zs else min(_number(zs, k) for k in zs)
    curve = rdp_curve(((z, _number(entry, "sample_rate"), 1),), ORDERS)
    inf = np.full(len(ORDERS), math.inf)
    return Spend(
        "client-level",
        "hospital",
        {"outsiders": curve, "server": inf, "colluders": inf},
        seq=entry.get("seq"),
    )


def _trial_settings(entry: dict, key: str) -> list[tuple[float, float, int]]:
    """The (σ, q, steps) of each trial (``trials``) or grid setting (``grid``) a ``tuning`` entry records."""
    rows = entry.get(key)
    if not isinstance(rows, list) or not rows:
        raise ConfigError(f"ledger entry {entry.get('seq')} (tuning): no {key}")
    out = []
    for r in rows:
        ok = isinstance(r, list | tuple) and len(r) == 3
        if ok:
            s, q, n = r
            num = [isinstance(v, int | float) and not isinstance(v, bool) for v in (s, q)]
            ok = all(num) and math.isfinite(s) and s >= 0 and 0 <= q <= 1
            ok = ok and isinstance(n, int) and not isinstance(n, bool) and n >= 0
        if not ok:
            raise ConfigError(f"ledger entry {entry.get('seq')} (tuning): bad {key} row {str(r)[:60]}")
        out.append((float(r[0]), float(r[1]), int(r[2])))
    return out


def trial_count_of(entry: dict):
    """The distribution of the number of trials a repeat-and-select ``tuning`` entry records."""
    from silofl.privacy.tuning import poisson, truncated_negative_binomial

    kind = entry.get("distribution")
    if kind == "poisson":
        return poisson(_number(entry, "mu", 1.0))
    if kind == "negbin":
        return truncated_negative_binomial(_number(entry, "eta", -1.0), _number(entry, "gamma"))
    raise ConfigError(f"ledger entry {entry.get('seq')} (tuning): unknown distribution {str(kind)[:40]!r}")


def tuning_trial_curve(entry: dict, orders: Sequence[float] = ORDERS) -> np.ndarray:
    """RDP of one random trial of a repeat-and-select ``tuning`` entry: the pointwise maximum of every grid
    setting's curve (the mixture over the grid, :mod:`silofl.privacy.tuning`)."""
    curves = [rdp_curve((h,), tuple(orders)) for h in _trial_settings(entry, "grid")]
    return np.max(np.vstack(curves), axis=0)


def repeat_and_select_curve(entry: dict, orders: Sequence[float] = ORDERS) -> np.ndarray:
    """Papernot & Steinke's RDP curve (at ``orders``) of a repeat-and-select ``tuning`` entry's best trial
    (:func:`silofl.privacy.tuning.repeat_and_select_rdp` of :func:`tuning_trial_curve`)."""
    from silofl.privacy.tuning import repeat_and_select_rdp

    rdp = repeat_and_select_rdp(orders, tuning_trial_curve(entry, orders), trial_count_of(entry))
    return np.asarray(rdp, dtype=np.float64)


@LEDGER_KINDS.register("tuning")
def tuning_spend(entry: dict, colluders: int) -> Spend:
    """The DP-SGD trials of a tuning run (``silofl tune`` with site folders), the site adding the noise itself
    (one curve for every threat). ``selection: composition`` — every trial released: its ``trials``' (σ, q,
    steps) composed. ``selection: repeat-and-select`` — K ~ ``distribution`` (``mu`` | ``eta``, ``gamma``)
    trials, settings drawn from ``grid``, only the best released: Papernot & Steinke's curve of one trial
    (:func:`tuning_trial_curve`, :func:`silofl.privacy.tuning.repeat_and_select_rdp`), and the cap at ``cap``
    trials as the chance τ = P[K > cap] that the capped tuning differs from the uncapped one (it costs
    (1 + e^ε)τ of δ at the site's composed ε: :func:`with_tail`)."""
    unit, seq = str(entry.get("unit", "row")), entry.get("seq")
    selection = entry.get("selection")
    if selection == "composition":
        return Spend(
            "tuning", unit, _same(rdp_curve(tuple(_trial_settings(entry, "trials")), ORDERS)), seq=seq
        )
    if selection != "repeat-and-select":
        raise ConfigError(f"ledger entry {seq} (tuning): unknown selection {str(selection)[:40]!r}")
    count = trial_count_of(entry)
    curve = repeat_and_select_curve(entry)
    cap = entry.get("cap")
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < max(1, count.smallest):
        raise ConfigError(f"ledger entry {seq} (tuning): bad cap {cap!r}")
    return Spend("tuning", unit, _same(curve), seq=seq, tail=count.tail(cap))


def planned_tuning(
    trials: Sequence[tuple[float, float, int]] | None = None,
    *,
    grid: Sequence[tuple[float, float, int]] | None = None,
    count: Any = None,
    cap: int | None = None,
    unit: str = "row",
) -> dict:
    """A planned tuning run at one site, shaped as its ledger entry: every trial's (σ, q, steps) composed
    (``trials``), or the best of K ~ ``count`` (a :class:`silofl.privacy.tuning.TrialCount`) trials drawn
    from ``grid``, at most ``cap`` (:func:`tuning_spend`)."""
    rows = lambda hs: [[float(s), float(q), int(n)] for s, q, n in hs]  # noqa: E731
    if trials is not None:
        return {"kind": "tuning", "selection": "composition", "trials": rows(trials), "unit": unit}
    if grid is None or count is None or cap is None:
        raise ConfigError("a planned repeat-and-select tuning needs its grid, count and cap")
    dist = (
        {"distribution": "poisson", "mu": count.mu}
        if count.kind == "poisson"
        else {"distribution": "negbin", "eta": count.eta, "gamma": count.gamma}
    )
    return {
        "kind": "tuning",
        "selection": "repeat-and-select",
        "grid": rows(grid),
        **dist,
        "cap": int(cap),
        "unit": unit,
    }


@LEDGER_KINDS.register("restore")
def restore_spend(entry: dict, colluders: int) -> Spend:
    """The prior spend a restored ledger declares, (ε, δ) against everyone."""
    return Spend(
        "restore",
        "declared",
        approx=(_number(entry, "epsilon"), _number(entry, "delta")),
        seq=entry.get("seq"),
    )


def spend_of(entry: dict, colluders: int = 0) -> Spend | None:
    """The :class:`Spend` of one ledger entry (None for kinds that release nothing or are composed per
    record); ConfigError for a kind no accountant composes."""
    kind = entry.get("kind")
    if kind in NOT_SPENDING or kind in PER_RECORD:
        return None
    if not isinstance(kind, str) or kind not in LEDGER_KINDS:
        raise ConfigError(
            f"the ledger holds entry {entry.get('seq')} of kind {str(kind)[:40]!r}, which no accountant "
            f"composes (known: {', '.join([*LEDGER_KINDS.names(), *sorted(PER_RECORD)])}): refused"
        )
    return LEDGER_KINDS.get(kind)(entry, colluders)


# ---------------------------------------------------------------------------------------------- planned spend
def planned_dpsgd(noise_multiplier: float, sample_rate: float, steps: int, unit: str = "row") -> dict:
    """A planned block of DP-SGD steps, shaped as its ledger entry."""
    return {
        "kind": "dp-sgd",
        "noise_multiplier": float(noise_multiplier),
        "sample_rate": float(sample_rate),
        "steps": int(steps),
        "unit": unit,
    }


def planned_secure(mechanisms: Sequence[DiscreteMechanism], rounds: int = 1, unit: str | None = None) -> dict:
    """``rounds`` planned secure rounds of ``mechanisms`` each, shaped as their ledger entry."""
    out = {"kind": "secagg-discrete", "mechanisms": [m.to_dict() for m in mechanisms], "rounds": int(rounds)}
    return {**out, "unit": unit} if unit is not None else out


def planned_release(digests: Iterable[str], epsilon: float, delta: float) -> dict:
    """A planned release of the records ``digests`` at (ε, δ), shaped as its ledger entry."""
    return {"kind": "release", "records": sorted(digests), "epsilon": float(epsilon), "delta": float(delta)}


# ------------------------------------------------------------------------------------------ the accountant
@dataclass
class SiteAccountant:
    """A site's one accountant over its ledger (see the module doc). It reads the ledger's entries when asked
    (the ledger only grows; converted entries are kept), so a step recorded by any protocol counts at once.
    ``colluders``: the c the site's policy assumes."""

    ledger: Ledger | None
    colluders: int = 0
    _spends: list[Spend] = field(default_factory=list, init=False, repr=False)
    _seen: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        self.colluders = check_colluders(self.colluders)

    @property
    def entries(self) -> list[dict]:
        """The ledger's entries (none without a ledger)."""
        return self.ledger.entries if self.ledger is not None else []

    @property
    def lifetime(self) -> tuple[float, float] | None:
        """The lifetime (ε, δ) the ledger's last budget entry sets (None: the ledger sets none)."""
        return lifetime_of(self.ledger) if self.ledger is not None else None

    def spends(self, planned: Sequence[dict] = ()) -> list[Spend]:
        """Every recorded mechanism (and the ``planned`` ones) as :class:`Spend` s (per-record releases
        aside)."""
        entries = self.entries
        if len(entries) < self._seen:
            raise ConfigError("the ledger shrank under its accountant")
        for e in entries[self._seen :]:
            s = spend_of(e, self.colluders)
            if s is not None:
                self._spends.append(s)
        self._seen = len(entries)
        extra = [s for s in (spend_of(p, self.colluders) for p in planned) if s is not None]
        return [*self._spends, *extra]

    def _release(self, planned: Sequence[dict], records: set[str] | None) -> Spend:
        rel = [p for p in planned if p.get("kind") in PER_RECORD]
        return Spend("release", "record", approx=release_spend([*self.entries, *rel], records))

    def spent(
        self,
        delta: float,
        threat: str = "server",
        planned: Sequence[dict] = (),
        records: set[str] | None = None,
    ) -> tuple[float, float]:
        """(ε, δ) of everything the ledger records (and ``planned``) against ``threat``, at total ``delta``
        (just the releases' and restores' Σδᵢ when nothing composes in RDP); the releases count the most any
        record spent (of ``records``, when given)."""
        curve, eps, dlt, tail = compose([*self.spends(planned), self._release(planned, records)], threat)
        got = with_tail(lambda d: epsilon_at(curve, (eps, dlt), d), delta, tail)
        return got, (float(delta) if np.any(curve > 0) or tail > 0 else dlt)

    def epsilon(
        self,
        delta: float,
        threat: str = "server",
        planned: Sequence[dict] = (),
        records: set[str] | None = None,
    ) -> float:
        """ε at total ``delta`` of everything the ledger records (and ``planned``), against ``threat``
        (:meth:`spent`)."""
        return self.spent(delta, threat, planned, records)[0]

    def epsilons(self, delta: float, planned: Sequence[dict] = ()) -> dict[str, float]:
        """ε at ``delta`` against every threat."""
        return {t: self.epsilon(delta, t, planned) for t in THREATS}

    def report(self, delta: float, planned: Sequence[dict] = ()) -> dict:
        """Per threat ε at ``delta`` (None where none holds: listed in ``no_guarantee_against``), the
        parties each holds against, the unit and its caveat, what composed it: plain JSON for a summary or
        console."""
        spends = self.spends(planned)
        rel = self._release(planned, None)
        units = sorted({s.unit for s in spends} | ({"record"} if rel.approx != (0.0, 0.0) else set()))
        unit = weakest_unit(units)
        caveat = None
        if unit in ("row", "record") and any((_rank(u) or 0) > 0 for u in units):
            caveat = (
                "the composed ε holds for one row: row-level blocks protect a person with k rows only at "
                "group-privacy level (k·ε)"
            )
        kinds: dict[str, int] = {}
        for s in [*spends, *([rel] if rel.approx != (0.0, 0.0) else [])]:
            kinds[s.kind] = kinds.get(s.kind, 0) + 1
        eps = self.epsilons(delta, planned)
        return {
            "accountant": ACCOUNTANT_NAME,
            "delta": float(delta),
            "epsilon": {t: (e if math.isfinite(e) else None) for t, e in eps.items()},
            "no_guarantee_against": [t for t, e in eps.items() if not math.isfinite(e)],
            "against": {t: threat_label(t, self.colluders) for t in THREATS},
            "colluders": self.colluders,
            "unit": unit,
            "units": units,
            "caveat": caveat,
            "mechanisms": kinds,
            "lifetime": list(self.lifetime) if self.lifetime else None,
        }

    def _check(self, planned: Sequence[dict], lifetime, threat: str, records) -> tuple[float, tuple]:
        life = lifetime if lifetime is not None else self.lifetime
        if life is None:
            raise ConfigError("the site's ledger sets no lifetime budget to check against")
        return self.epsilon(float(life[1]), threat, planned, records), (float(life[0]), float(life[1]))

    def allows(
        self,
        planned: Sequence[dict],
        lifetime: tuple[float, float] | None = None,
        threat: str = "colluders",
        records: set[str] | None = None,
    ) -> bool:
        """Whether the recorded and ``planned`` spend together stay within ``lifetime`` (default the ledger's)
        at its δ, against ``threat`` (default the strongest the site assumes)."""
        eps, life = self._check(planned, lifetime, threat, records)
        return eps <= life[0] * (1 + 1e-12)

    def require(
        self,
        planned: Sequence[dict],
        lifetime: tuple[float, float] | None = None,
        threat: str = "colluders",
        records: set[str] | None = None,
        what: str = "this step",
        who: str = "the site",
    ) -> float:
        """Raise BudgetExhausted (one line) BEFORE a step whose ``planned`` spend would take the site past its
        lifetime budget (:meth:`allows`); else the ε at the lifetime δ it would reach."""
        eps, life = self._check(planned, lifetime, threat, records)
        if eps <= life[0] * (1 + 1e-12):
            return eps
        now = self.epsilon(life[1], threat, (), records)
        kinds = ", ".join(f"{k} ×{n}" for k, n in self.report(life[1])["mechanisms"].items()) or "nothing"
        raise BudgetExhausted(
            f"{what} would bring {who} to ε {eps:.4g} against {threat_label(threat, self.colluders)} "
            f"(δ {life[1]:g}; every mechanism of its ledger composed — {kinds} — ε {now:.4g} before it), "
            f"above its lifetime budget ε {life[0]:g}: refused"
        )

    def dpsgd_guard(self, unit: str = "row", lifetime: tuple[float, float] | None = None):
        """A lifetime check for :class:`silofl.privacy.accountant.Budget`: ``f(σ, q, steps)`` is True when
        that many more DP-SGD steps keep the whole ledger within the lifetime budget."""

        def allows(noise_multiplier: float, sample_rate: float, steps: int) -> bool:
            return self.allows([planned_dpsgd(noise_multiplier, sample_rate, steps, unit)], lifetime)

        return allows


# ---------------------------------------------------------------------------------------------- the auditor's
@dataclass
class LedgerEvents:
    """A ledger for an independent accountant: dp-accounting events of the Gaussian mechanisms, the discrete
    sums as (mechanism, survivors, rounds) (dp-accounting has no Skellam event), and the (ε, δ) part."""

    event: Any
    discrete: list[tuple[DiscreteMechanism, int, int]]
    approx: tuple[float, float]
    own: list[tuple[str, dict]] = field(default_factory=list)
    tail: float = 0.0  # Στ of capped repeat-and-select tunings (:func:`with_tail`)
    """Entries whose mechanism dp-accounting cannot express (a repeat-and-select over a grid no one setting
    of which dominates), by kind: :func:`recompute` takes silofl's own curve for them, not an independent
    one."""

    @property
    def not_independent(self) -> list[str]:
        """The kinds whose part of :func:`recompute` is silofl's own math, not dp-accounting's."""
        return sorted({"secagg-discrete" for _ in self.discrete[:1]} | {k for k, _ in self.own})


def ledger_events(entries: Sequence[dict], threat: str = "server", colluders: int = 0) -> LedgerEvents:
    """The DpEvents of every mechanism ``entries`` record, against ``threat`` (see the module doc)."""
    import dp_accounting as dpa

    check_threat(threat)
    events: list = []
    discrete: list[tuple[DiscreteMechanism, int, int]] = []
    own: list[tuple[str, dict]] = []
    slack = 0.0

    def gaussian(s: float, q: float, n: int):
        g = dpa.GaussianDpEvent(s)
        return dpa.SelfComposedDpEvent(g if q == 1 else dpa.PoissonSampledDpEvent(q, g), n)

    for e in entries:
        if e.get("kind") == "tuning" and e.get("selection") == "composition":
            events.extend(gaussian(*h) for h in _trial_settings(e, "trials"))
        elif e.get("kind") == "tuning":
            ev, cap_delta = _repeat_and_select_event(e)
            slack += cap_delta
            if ev is None:
                own.append(("tuning", e))
            else:
                events.append(ev)
        kind = e.get("kind")
        if kind == "dp-sgd":
            g = dpa.GaussianDpEvent(e["noise_multiplier"])
            q = e["sample_rate"]
            events.append(
                dpa.SelfComposedDpEvent(g if q == 1 else dpa.PoissonSampledDpEvent(q, g), e["steps"])
            )
        elif kind == "client-level":
            z = e["multipliers"].get("hospital", min(e["multipliers"].values()))
            g = dpa.GaussianDpEvent(z)
            q = e["sample_rate"]
            ok = threat == "outsiders"
            events.append(
                (g if q == 1 else dpa.PoissonSampledDpEvent(q, g)) if ok else dpa.NonPrivateDpEvent()
            )
        elif kind == "secagg-discrete":
            for d in e["mechanisms"]:
                m = DiscreteMechanism.from_dict(d)
                n = _survivors(e, m)
                n = honest_survivors(n, colluders) if threat == "colluders" else n
                discrete.append((m, n, int(e.get("rounds", 1))))
    restored = [e for e in entries if e.get("kind") == "restore"]
    rel = release_spend(list(entries))
    approx = (rel[0] + sum(e["epsilon"] for e in restored), rel[1] + sum(e["delta"] for e in restored))
    return LedgerEvents(dpa.ComposedDpEvent(events), discrete, approx, own, slack)


def _repeat_and_select_event(entry: dict) -> tuple[Any, float]:
    """(dp-accounting's RepeatAndSelectDpEvent of a repeat-and-select ``tuning`` entry — None when no one
    grid setting's curve dominates the others at :data:`ORDERS`, so that the mixture is no dp-accounting
    event —, the cap's τ = P[K > cap])."""
    from dp_accounting import dp_event as de

    count = trial_count_of(entry)
    grid = _trial_settings(entry, "grid")
    top = tuning_trial_curve(entry)
    slack = count.tail(int(entry["cap"]))
    for s, q, n in grid:
        if np.array_equal(rdp_curve(((s, q, n),), ORDERS), top):
            g = de.GaussianDpEvent(s)
            inner = de.SelfComposedDpEvent(g if q == 1 else de.PoissonSampledDpEvent(q, g), n)
            shape = math.inf if count.kind == "poisson" else count.eta
            return de.RepeatAndSelectDpEvent(inner, count.mean, shape), slack
    return None, slack


def recompute(
    entries: Sequence[dict], delta: float, threat: str = "server", colluders: int = 0, orders=ORDERS
) -> float:
    """ε at ``delta`` of ``entries`` by dp-accounting's RDP accountant (its subsampled Gaussian and its
    conversion), the discrete sums' curves added at the same orders: an auditor's recomputation."""
    from dp_accounting.rdp import RdpAccountant
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    ev = ledger_events(entries, threat, colluders)
    acc = RdpAccountant(list(orders))
    acc.compose(ev.event)
    curve = np.asarray(acc._rdp, dtype=np.float64)  # noqa: SLF001 - dp-accounting keeps the curve here
    for m, n, rounds in ev.discrete:
        curve = curve + rounds * discrete_rdp(m, survivors=n, orders=orders)
    for _, entry in ev.own:
        curve = curve + repeat_and_select_curve(entry, orders)
    eps_a, d_a = ev.approx

    def eps_at(d: float) -> float:
        if not np.any(curve > 0):
            return eps_a if d_a <= d else math.inf
        if d_a >= d:
            return math.inf
        return float(compute_epsilon(list(orders), list(curve), d - d_a)[0]) + eps_a

    return with_tail(eps_at, delta, ev.tail)


# ------------------------------------------------------------------------------------ the site's statement
BOOKKEEPING = frozenset({"format", "seq", "prev", "kind", "time", "mac", "unit", "run", "round", "v", "note"})
"""Ledger fields that say where and when, not which mechanism (left out of :func:`entry_parameters`)."""
AS_RECORDED = frozenset({"release", "restore"})
"""Kinds whose (ε, δ) is composed as the ledger records it: no mechanism to recompute."""


def entry_parameters(entry: dict) -> dict:
    """The mechanism parameters of a ledger entry, for a person to read: bookkeeping aside, the records of a
    release counted, a secure round's mechanisms shortened to what sets their noise."""
    out: dict = {}
    for key, v in entry.items():
        if key in BOOKKEEPING:
            continue
        if key == "records" and isinstance(v, list):
            out["records"] = len(v)
        elif key == "mechanisms" and isinstance(v, list):
            keep = ("kind", "noise_multiplier", "scale", "bits", "min_survivors", "parties")
            out[key] = [{k: m[k] for k in keep if k in m} if isinstance(m, dict) else m for m in v]
        else:
            out[key] = v
    return out


def statement(books: SiteAccountant, delta: float, independent: bool = False) -> dict:
    """A site's ledger for an auditor (``silofl site ledger``): every entry (seq, kind, unit, mechanism
    parameters), the composed ε per threat at ``delta`` by this accountant and, with ``independent``, the same
    figures by dp-accounting's RDP accountant (:func:`recompute`) — for the whole ledger and for the part
    dp-accounting expresses on its own — with the kinds whose part is silofl's own math or taken as
    recorded named."""
    entries = books.entries
    rows = [
        {
            "seq": e.get("seq"),
            "kind": e.get("kind"),
            "unit": _unit_of(e, books.colluders),
            "parameters": entry_parameters(e),
        }
        for e in entries
    ]
    report = books.report(delta)
    out: dict = {**report, "entries": rows}
    if not independent:
        return out
    ev = ledger_events(entries, "server", books.colluders)
    recorded = sorted({str(e.get("kind")) for e in entries} & AS_RECORDED)
    skip = AS_RECORDED | NOT_SPENDING | {"secagg-discrete"}  # dp-accounting has no discrete-sum event
    pure = [e for e in entries if e.get("kind") not in skip and not _repeat_and_select_own(e)]
    kept = [e for e in entries if e.get("kind") in NOT_SPENDING]
    part = SiteAccountant(_Entries([*kept, *pure]), books.colluders)  # type: ignore[arg-type]

    def fig(x: float) -> float | None:
        return x if math.isfinite(x) else None

    out["recomputed"] = {
        "accountant": "dp_accounting.rdp.RdpAccountant (PoissonSampledDpEvent(GaussianDpEvent) composed)",
        "whole": {
            t: {
                "silofl": fig(books.epsilon(delta, t)),
                "dp_accounting": fig(recompute(entries, delta, t, books.colluders)),
            }
            for t in THREATS
        },
        "independent_part": {
            t: {
                "silofl": fig(part.epsilon(delta, t)),
                "dp_accounting": fig(recompute(pure, delta, t, books.colluders)),
            }
            for t in THREATS
        },
        "independent_kinds": sorted({str(e.get("kind")) for e in pure}),
        "not_independent": ev.not_independent,
        "as_recorded": recorded,
    }
    return out


def _unit_of(entry: dict, colluders: int) -> str | None:
    """The unit an entry's spend protects (None for entries that release nothing)."""
    if entry.get("kind") in NOT_SPENDING:
        return None
    if entry.get("kind") in PER_RECORD:
        return "record"
    spend = spend_of(entry, colluders)
    return spend.unit if spend is not None else None


def _repeat_and_select_own(entry: dict) -> bool:
    """Whether a repeat-and-select tuning entry is a grid mixture dp-accounting cannot express."""
    return entry.get("selection") == "repeat-and-select" and _repeat_and_select_event(entry)[0] is None


@dataclass
class _Entries:
    """A ledger-shaped view of some entries (what :class:`SiteAccountant` reads)."""

    entries: list[dict]
