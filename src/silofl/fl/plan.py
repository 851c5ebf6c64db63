"""What a method reads of its run: the `RunPlan` — the config the user asked (``plan.config``, frozen,
never rewritten) and the values the run derived from it and the data before the first round (plan fields).

A method is built from the plan (``Method(plan)``, `silofl.fl.coordinator.Method`), its sites' settings
come from it (`silofl.fl.methods.common.dpsgd_settings`) and its coordinator is handed it:

* asked, ``plan.config.X``: the seed, the clip C, δ, the accountant, the number of clients and rounds, each
  client's budget, the method's own options (``plan.config.options``), the privacy mode as asked;
* derived, ``plan.X``: the batch size and examples per client left to ``auto``, the simulated split's seed,
  each site's training examples, σ (given, or calibrated from the budget: ``plan.noise_calibrated``), and per
  party (`PartyPlan`, ``plan.party(k)``) its Poisson rate q, DP steps per round and budget.

The plan is computed by `silofl.runner.plan.plan` (the run layer, which knows the data) and saved next
to ``config.yaml`` as ``plan.json``. It lives here, below the run layer, so that methods can be typed against
it (imports point down: run → fl). The asked config is typed by the `AskedRun` protocol, which
`silofl.runner.config.RunConfig` satisfies.

A coordinator written before plans read the run's common settings off one object; the plan keeps the few a
coordinator needs as read-only properties with the same names (`RunPlan.seed`, `RunPlan.delta`…:
each is exactly ``plan.config``'s), so ``Centralized(plan, …)`` and a plug-in's ``dpsgd_settings(self.cfg,
k)`` keep working. There is no config "as run": nothing copies the config with derived values written into it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

FORMAT = "silofl.plan/1"


class AskedRun(Protocol):
    """What a method reads of the config the user asked (`silofl.runner.config.RunConfig`,
    resolved)."""

    @property
    def method(self) -> str:
        """The method's registered name."""
        ...

    @property
    def seed(self) -> int | None:
        """The research seed (None: secret randomness)."""
        ...

    @property
    def clients(self) -> int:
        """The number of clients K."""
        ...

    @property
    def rounds(self) -> int:
        """The rounds asked."""
        ...

    @property
    def clip(self) -> float:
        """The clip C."""
        ...

    @property
    def delta(self) -> float:
        """δ."""
        ...

    @property
    def accountant(self) -> str:
        """The accountant's name."""
        ...

    @property
    def privacy(self) -> str:
        """The privacy mode (resolved: the effective one)."""
        ...

    @property
    def target_epsilon(self) -> float | None:
        """The budget of every client without its own."""
        ...

    @property
    def target_epsilons(self) -> list[float] | None:
        """One budget per client, or None."""
        ...

    @property
    def options(self) -> Any:
        """The method's own options."""
        ...

    @property
    def is_private(self) -> bool:
        """Whether DP is on."""
        ...


@dataclass(frozen=True)
class PartyPlan:
    """What one party's accountant will see: example level, a site of ``examples`` training examples taking
    ``steps_per_round`` DP steps at rate ``sample_rate`` a round; client level, the server's one mechanism a
    round at the client rate."""

    party: str  # "client<k>" or "server"
    sample_rate: float
    steps_per_round: int
    rounds: int
    target_epsilon: float | None
    examples: int | None = None

    @property
    def steps(self) -> int:
        """The DP steps of the planned rounds."""
        return self.rounds * self.steps_per_round


@dataclass(frozen=True)
class RunPlan:
    """What a run derived from its (resolved) config and its data (see the module doc)."""

    config: AskedRun  # what the user asked, resolved (silofl.runner.config.RunConfig)
    split_seed: (
        int | None
    )  # the simulated split's seed (not a secret; drawn fresh when neither seed was given)
    samples_per_client: int | None
    batch_size: int | None
    site_sizes: tuple[
        int, ...
    ]  # training examples of each site the method builds (the combiner's rows aside)
    noise_multiplier: float  # σ: given, or calibrated from the budget
    noise_calibrated: bool
    privacy: str  # the effective privacy mode (silofl.privacy.guarantee.effective_mode)
    parties: tuple[PartyPlan, ...] = ()  # under DP (example level: one per site; client level: the server)
    features: str = "none"  # the feature stage (silofl.features)
    feature_shape: tuple[int, ...] | None = None
    calibration: dict | None = (
        None  # how a budget-first run chose σ (summary.json's privacy.noise_calibration)
    )

    # ------------------------------------------------------------------ derived, per party
    def target_epsilon_of(self, client: int) -> float | None:
        """Client ``client``'s budget: its own entry of ``target_epsilons``, else ``target_epsilon``."""
        cfg = self.config
        return cfg.target_epsilons[client] if cfg.target_epsilons else cfg.target_epsilon

    def party(self, client: int) -> PartyPlan | None:
        """Client ``client``'s planned accounting (example level, under DP), or None."""
        name = f"client{client}"
        return next((p for p in self.parties if p.party == name), None)

    # ------------------------------------------------------------- the asked settings a coordinator reads
    # (read-only, each exactly plan.config's: see the module doc)
    @property
    def options(self) -> Any:
        """The method's own options (``plan.config.options``)."""
        return self.config.options

    @property
    def seed(self) -> int | None:
        """The research seed (``plan.config.seed``)."""
        return self.config.seed

    @property
    def clients(self) -> int:
        """The number of clients (``plan.config.clients``)."""
        return self.config.clients

    @property
    def rounds(self) -> int:
        """The rounds asked (``plan.config.rounds``)."""
        return self.config.rounds

    @property
    def clip(self) -> float:
        """The clip C (``plan.config.clip``)."""
        return self.config.clip

    @property
    def delta(self) -> float:
        """δ (``plan.config.delta``)."""
        return self.config.delta

    @property
    def accountant(self) -> str:
        """The accountant (``plan.config.accountant``)."""
        return self.config.accountant

    @property
    def target_epsilon(self) -> float | None:
        """The budget of every client without its own (``plan.config.target_epsilon``)."""
        return self.config.target_epsilon

    @property
    def is_private(self) -> bool:
        """Whether DP is on (``plan.config.is_private``)."""
        return bool(self.config.is_private)

    @property
    def secure_aggregation(self) -> bool:
        """Whether the client-level sum is securely aggregated (``plan.config.secure_aggregation``)."""
        return bool(getattr(self.config, "secure_aggregation", False))

    # ------------------------------------------------------------------ plan.json
    def to_dict(self) -> dict[str, Any]:
        """plan.json's content (the derived values; the config is config.yaml's)."""
        return {
            "format": FORMAT,
            "method": self.config.method,
            "split_seed": self.split_seed,
            "samples_per_client": self.samples_per_client,
            "batch_size": self.batch_size,
            "site_sizes": list(self.site_sizes),
            "noise_multiplier": self.noise_multiplier,
            "noise_calibrated": self.noise_calibrated,
            "privacy": self.privacy,
            "parties": [{**dataclasses.asdict(p), "steps": p.steps} for p in self.parties],
            "features": self.features,
            "feature_shape": list(self.feature_shape) if self.feature_shape else None,
            "calibration": self.calibration,
        }


def given(cfg: Any) -> RunPlan:
    """The plan of a config whose derived values are already filled in (a checkpoint's, an old run folder's, a
    deployed run's whose sites hold the data, or a config written out in full by hand): every value as the
    config has it."""
    return RunPlan(
        config=cfg,
        split_seed=cfg.split_seed,
        samples_per_client=cfg.samples_per_client,
        batch_size=cfg.batch_size,
        site_sizes=(),
        noise_multiplier=cfg.noise_multiplier,
        noise_calibrated=False,
        privacy=cfg.privacy,
        features=getattr(cfg, "features", "none"),
    )


def as_plan(run: Any) -> RunPlan:
    """``run`` itself when it is a plan, else the plan of a config given in full (`given`)."""
    return run if isinstance(run, RunPlan) else given(run)
