"""Stateful accountants and budgets: they record the mechanisms that actually ran and ask the pure
analysis (:mod:`silofl.privacy.analysis`) for ε.

An :class:`Accountant` holds one party's history of (σ, q, steps) of the Poisson-subsampled Gaussian
mechanism; it is fed from a mechanism's own report of what it ran (:meth:`Accountant.record`), never
from a configured number. Its state serialises to plain JSON and can only grow: a checkpoint that
would shrink it is refused. A :class:`Budget` says whether more steps fit under a target ε.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from silofl.core.errors import BudgetExhausted, ConfigError
from silofl.privacy.analysis import (
    ACCOUNTANT_NAMES,
    ACCOUNTANTS,
    DEFAULT_ORDERS,
    History,
    check_mechanism,
    epsilon_of,
    max_steps_within,
)

__all__ = [
    "ACCOUNTANTS",
    "ACCOUNTANT_NAMES",
    "DEFAULT_ORDERS",
    "Accountant",
    "Budget",
    "MechanismRun",
    "epsilon_of",
    "max_steps_within",
]


@dataclass(frozen=True)
class MechanismRun:
    """What a Gaussian mechanism ran since its last report: ``steps`` steps at noise multiplier σ and
    Poisson sampling rate q."""

    noise_multiplier: float
    sample_rate: float
    steps: int


class Accountant:
    """Tracks one party's privacy spend. ``record``/``step`` add what ran; ``epsilon`` asks Opacus."""

    def __init__(self, kind: str = "rdp"):
        ACCOUNTANTS.get(kind)  # ConfigError naming the choices if there is none
        self.kind = kind
        self._history: list[list] = []  # [sigma, q, steps], consecutive equal mechanisms merged

    @property
    def name(self) -> str:
        """The accountant's name as reported (``opacus.rdp``, ``opacus.prv``: its entry's ``reported``)."""
        return ACCOUNTANTS.get(self.kind).reported

    @property
    def history(self) -> History:
        """The recorded (σ, q, steps) of every mechanism that ran, consecutive equal ones merged."""
        return tuple((float(s), float(q), int(n)) for s, q, n in self._history)

    def step(self, noise_multiplier: float, sample_rate: float, steps: int = 1) -> None:
        """Record ``steps`` steps of the subsampled Gaussian mechanism with (σ, q)."""
        if steps <= 0:
            return
        check_mechanism(noise_multiplier, sample_rate, steps)
        if self._history and self._history[-1][0] == noise_multiplier and self._history[-1][1] == sample_rate:
            self._history[-1][2] += steps
        else:
            self._history.append([float(noise_multiplier), float(sample_rate), int(steps)])

    def replay(self, history) -> None:
        """Replace what this accountant holds by ``history`` of (σ, q, steps), recorded elsewhere — the site's
        ledger, which is append-only, so a replay never loses spend that was recorded."""
        self._history = []
        for sigma, q, steps in history:
            self.step(sigma, q, steps)

    def record(self, run: MechanismRun) -> None:
        """Record a mechanism's own report of what it ran."""
        self.step(run.noise_multiplier, run.sample_rate, run.steps)

    @property
    def steps(self) -> int:
        """Steps recorded so far."""
        return sum(n for _, _, n in self._history)

    def epsilon(self, delta: float) -> float:
        """ε at δ of everything recorded."""
        return epsilon_of(self.kind, self.history, delta)

    def epsilon_after(self, noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
        """ε if ``steps`` more steps of the given mechanism were run (the history is unchanged)."""
        hist = list(self.history)
        if hist and hist[-1][:2] == (noise_multiplier, sample_rate):
            hist[-1] = (noise_multiplier, sample_rate, hist[-1][2] + steps)
        else:
            hist.append((noise_multiplier, sample_rate, steps))
        return epsilon_of(self.kind, tuple(hist), delta)

    def state_dict(self) -> dict:
        """Plain JSON: the accountant kind and its full history (for checkpoints)."""
        return {"kind": self.kind, "history": [list(h) for h in self.history]}

    def load_state_dict(self, state: dict) -> None:
        """Restore a history; it may only extend what this accountant has recorded, never shrink it."""
        try:
            kind = state["kind"]
            hist = [[float(s), float(q), int(n)] for s, q, n in state["history"]]
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"invalid accountant state: {e}") from None
        if kind != self.kind:
            raise ConfigError(f"accountant state is for {kind!r}, this accountant is {self.kind!r}")
        if sum(n for _, _, n in hist) < self.steps:
            raise ConfigError(
                f"accountant state has {sum(n for _, _, n in hist)} steps, fewer than the {self.steps} "
                "already recorded: a privacy spend is never reset"
            )
        for s_, q, n in hist:
            if not (s_ > 0 and 0 < q <= 1 and n > 0):
                raise ConfigError(f"invalid mechanism in accountant state: {(s_, q, n)}")
        self._history = hist

    def report(self, delta: float) -> dict:
        """The accountant's exact inputs and output, for summary.json."""
        h = self.history
        single = len(h) == 1
        return {
            "accountant": self.name,
            "noise_multiplier": h[0][0] if single else None,
            "sample_rate": h[0][1] if single else None,
            "steps": self.steps,
            "history": [list(x) for x in h],
            "delta": delta,
            "epsilon": self.epsilon(delta),
        }


class Budget:
    """A target ε at δ: says whether more steps may run without exceeding it. ``lifetime``, when set, is the
    site's lifetime check over every mechanism of its ledger (``f(σ, q, steps) -> bool``:
    :meth:`silofl.privacy.site_accountant.SiteAccountant.dpsgd_guard`), asked before every step too."""

    def __init__(self, accountant: Accountant, target_epsilon: float | None, delta: float):
        self.accountant = accountant
        self.target_epsilon = target_epsilon
        self.delta = delta
        self.lifetime: Callable[[float, float, int], bool] | None = None

    def allows(self, noise_multiplier: float, sample_rate: float, steps: int) -> bool:
        """Whether ``steps`` more steps of (σ, q) keep ε within the target (and the site's lifetime)."""
        if self.lifetime is not None and not self.lifetime(noise_multiplier, sample_rate, steps):
            return False
        if self.target_epsilon is None:
            return True
        return (
            self.accountant.epsilon_after(noise_multiplier, sample_rate, steps, self.delta)
            <= self.target_epsilon
        )

    def require(self, noise_multiplier: float, sample_rate: float, steps: int) -> None:
        """Raise BudgetExhausted unless :meth:`allows`."""
        if self.lifetime is not None and not self.lifetime(noise_multiplier, sample_rate, steps):
            raise BudgetExhausted(
                f"{steps} more steps would take the site past its lifetime budget (every mechanism of its "
                "ledger composed): refused"
            )
        if not self.allows(noise_multiplier, sample_rate, steps):
            spent = self.accountant.epsilon(self.delta)
            raise BudgetExhausted(
                f"budget ε={self.target_epsilon:g} (δ={self.delta:g}) does not allow {steps} more steps: "
                f"spent ε={spent:.3f} so far"
            )
