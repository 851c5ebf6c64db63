"""What a run derived from its config and its data, computed once: `silofl.fl.plan.RunPlan`.

`silofl.runner.config.RunConfig` holds what the user asked (resolved: defaults and the effective privacy mode
filled in), frozen; a `silofl.fl.plan.RunPlan` holds it (``plan.config``) and what was derived from it and the
data before the first round — the simulated split's seed, the examples per client and batch size left to
``auto``, each site's size, σ (given, or calibrated from the budget: `calibrated_sigma`), each party's Poisson
rate q, DP steps per round and target ε (`party_plans`, with the sites' own
`silofl.site.dpsgd.round_schedule`), and the feature stage. This module computes it; the dataclass lives in
`silofl.fl.plan`, below the run layer, because methods are built from it (``Method(plan)``) and read it typed:
asked values as ``plan.config.X``, derived ones as ``plan.X``.

The plan is written next to ``config.yaml`` as ``plan.json`` (`write_plan`; `read_plan`,
`as_run` read a run folder back). `config_with_plan` writes the derived values into a flat config
for the few consumers outside the methods that read one config; methods never see it.

Everything here is a pure function of its arguments (no data loading, no randomness: the split seed is drawn
by `silofl.runner.data` and handed in).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from silofl.core.errors import ConfigError
from silofl.fl.plan import FORMAT, PartyPlan, RunPlan, as_plan
from silofl.runner.config import DEFAULT_BATCH_SIZE, DEFAULT_SAMPLES_PER_CLIENT, RunConfig

if TYPE_CHECKING:
    from silofl.site.policy import PlanRequest

__all__ = [
    "DERIVED",
    "FORMAT",
    "PLAN_FILE",
    "PartyPlan",
    "RunPlan",
    "as_plan",
    "as_run",
    "auto_sizes",
    "calibrated_sigma",
    "calibrates",
    "calibration_plan",
    "calibration_report",
    "check_site_policies",
    "config_with_plan",
    "given",
    "party_plans",
    "plan",
    "policy_request",
    "read_plan",
    "sizes_of_sites",
    "target_epsilon_of",
    "write_plan",
]

PLAN_FILE = "plan.json"
# the config's settings a plan fills (config.yaml keeps them as asked; plan.json holds what ran)
DERIVED = ("split_seed", "samples_per_client", "batch_size", "noise_multiplier", "calibrate_noise")


# ---------------------------------------------------------------------------------------------------- pure
# functions
def auto_sizes(
    cfg: RunConfig, n_train: int, smallest: int | None = None, cap: int | None = None
) -> tuple[int, int]:
    """(examples per client, batch size) with those left to ``auto`` filled from the data: examples per client
    at most 1000, no more than an equal share of the ``n_train`` training examples, nor than ``cap`` (what the
    partition can serve); the batch a quarter of a client's examples — the papers' q = 0.25 — at most 250.
    ``smallest``: the smallest client's size where sizes are given by the data (partition ``site``)."""
    spc = cfg.samples_per_client
    if spc is None:
        spc = min(DEFAULT_SAMPLES_PER_CLIENT, max(1, n_train // cfg.clients), cap or n_train)
    batch = cfg.batch_size
    if batch is None:
        n = smallest if smallest is not None else spc
        if cfg.combine != "none":  # the rows that train (the combiner's held-out share trains nothing)
            n -= int(round(cfg.combine_holdout * n))
        batch = max(1, min(DEFAULT_BATCH_SIZE, n // 4))
    return spc, batch


def target_epsilon_of(cfg: RunConfig, client: int) -> float | None:
    """Client ``client``'s budget: its own entry of ``target_epsilons``, else ``target_epsilon``."""
    return cfg.target_epsilons[client] if cfg.target_epsilons else cfg.target_epsilon


def calibrates(cfg: RunConfig) -> bool:
    """Whether σ is set from the budget (budget-first) rather than given."""
    if not cfg.is_private or cfg.info.traits.nonprivate:
        return False
    has_target = cfg.target_epsilon is not None or cfg.target_epsilons is not None
    return has_target and cfg.calibrate_noise is not False


def party_plans(cfg: RunConfig, site_sizes: list[int], batch_size: int | None = None) -> list[PartyPlan]:
    """What each party's accountant will see over the planned rounds: per party its target ε, sampling rate q
    and steps (example level: a site of n examples takes n // B steps a round at q = B/n, or the method's own
    ``sample_rate``/``local_steps``; client level: the server's one mechanism a round at the client rate)."""
    if cfg.is_client_level:
        # secure aggregation: the server picks the sample, so no amplification by sampling is claimed
        rate = 1.0 if getattr(cfg, "secure_aggregation", False) else float(cfg.options.client_rate)
        return [PartyPlan("server", rate, 1, cfg.rounds, cfg.target_epsilon)]
    batch = batch_size if batch_size is not None else cfg.batch_size
    if batch is None:
        raise ConfigError("a plan of the DP steps needs the batch size (fill it from the data first)")
    from silofl.site.dpsgd import round_schedule  # the sites' own (q, steps per round)

    out = []
    for k, n in enumerate(site_sizes):
        q, steps = round_schedule(
            n, batch, getattr(cfg.options, "sample_rate", None), getattr(cfg.options, "local_steps", None)
        )
        out.append(PartyPlan(f"client{k}", q, steps, cfg.rounds, target_epsilon_of(cfg, k), n))
    return out


def calibration_plan(
    cfg: RunConfig, site_sizes: list[int], batch_size: int | None = None
) -> list[dict[str, Any]]:
    """`party_plans` as plain records {party, target_epsilon, sample_rate, steps} (steps: of the planned
    rounds)."""
    return [
        {"party": p.party, "target_epsilon": p.target_epsilon, "sample_rate": p.sample_rate, "steps": p.steps}
        for p in party_plans(cfg, site_sizes, batch_size)
    ]


def calibrated_sigma(cfg: RunConfig, site_sizes: list[int], batch_size: int | None = None) -> float | None:
    """With a budget-first config: σ such that every party's planned rounds end at ε ≤ its target (the largest
    σ any party needs — the run has one σ — so every party ends at or below its target and the party that
    needs most ends at it, within the calibration's tolerance). None when σ is given."""
    from silofl.privacy.analysis import calibrate_sigma

    if not calibrates(cfg):
        return None
    plan = calibration_plan(cfg, site_sizes, batch_size)
    sigmas = {(p["target_epsilon"], p["sample_rate"], p["steps"]) for p in plan}
    return max(calibrate_sigma(e, cfg.delta, q, n, cfg.accountant) for e, q, n in sigmas)


def calibration_report(
    cfg: RunConfig, sigma: float, parties: list[PartyPlan] | tuple[PartyPlan, ...]
) -> dict[str, Any]:
    """How a budget-first run chose σ: the target, the planned rounds, each party's sampling rate and steps
    and the ε
    its accountant will reach at the end of the plan."""
    from silofl.privacy.analysis import ACCOUNTANT_NAMES, CALIBRATION_TOLERANCE, epsilon_of

    rows = [
        {
            "party": p.party,
            "target_epsilon": p.target_epsilon,
            "sample_rate": p.sample_rate,
            "steps": p.steps,
            "planned_epsilon": epsilon_of(cfg.accountant, ((sigma, p.sample_rate, p.steps),), cfg.delta),
        }
        for p in parties
    ]
    return {
        "noise_multiplier": sigma,
        "rounds_planned": cfg.rounds,
        "delta": cfg.delta,
        "accountant": ACCOUNTANT_NAMES[cfg.accountant],
        "method": "opacus.accountants.utils.get_noise_multiplier",
        "tolerance": CALIBRATION_TOLERANCE,
        "parties": rows,
    }


def plan(
    cfg: RunConfig,
    data: Any,
    split_seed: int | None,
    samples_per_client: int | None,
    batch_size: int | None,
    site_sizes: list[int] | None = None,
) -> RunPlan:
    """The plan of ``cfg`` (resolved: what the user asked) on ``data`` (a `silofl.data.SplitData`, or None
    when the sites hold their data elsewhere), given what the data step chose to draw the split with: its seed
    and the examples per client and batch size. ``site_sizes``: each site's training examples (default: from
    the split's partitions, as the method builds its sites, less the combiner's held-out rows)."""
    if site_sizes is None:
        site_sizes = sizes_of_sites(cfg, data.parts) if data is not None else []
    private = cfg.is_private and not cfg.info.traits.nonprivate
    parties: list[PartyPlan] = []
    if private and site_sizes and min(site_sizes) >= 1 and (batch_size is not None or cfg.is_client_level):
        parties = party_plans(cfg, site_sizes, batch_size)
    sigma = calibrated_sigma(cfg, site_sizes, batch_size) if site_sizes or cfg.is_client_level else None
    calibration = calibration_report(cfg, sigma, parties) if sigma is not None else None
    shape = getattr(data, "feature_shape", None) if data is not None else None
    return RunPlan(
        config=cfg,
        split_seed=split_seed,
        samples_per_client=samples_per_client,
        batch_size=batch_size,
        site_sizes=tuple(site_sizes),
        noise_multiplier=sigma if sigma is not None else cfg.noise_multiplier,
        noise_calibrated=sigma is not None,
        privacy=cfg.privacy,
        parties=tuple(parties),
        features=cfg.features,
        feature_shape=tuple(shape) if shape is not None else None,
        calibration=calibration,
    )


def given(cfg: RunConfig) -> RunPlan:
    """The plan of a config whose derived values are already filled in (a checkpoint's, an old run folder's,
    or a deployed run's whose sites hold the data): every value as the config has it."""
    from silofl.fl.plan import given as given_plan

    return given_plan(cfg)


def write_plan(p: RunPlan, folder: str | Path) -> Path:
    """Write ``folder/plan.json``."""
    out = Path(folder) / PLAN_FILE
    out.write_text(json.dumps(p.to_dict(), indent=2) + "\n")
    return out


def config_with_plan(p: RunPlan) -> RunConfig:
    """A flat RunConfig with the plan's derived values written in — for the consumers outside the methods that
    read one config (an experiment that shares one split between runs, the audit's own training loops, the
    torch.distributed worker's site factory). Methods never get this: they get the plan."""
    cfg = cast(RunConfig, p.config)  # a run's plan holds its RunConfig
    changes: dict[str, Any] = {
        "split_seed": p.split_seed,
        "samples_per_client": p.samples_per_client,
        "batch_size": p.batch_size,
        "noise_multiplier": p.noise_multiplier,
    }
    if p.noise_calibrated:
        changes["calibrate_noise"] = True
    changes = {k: v for k, v in changes.items() if getattr(cfg, k) != v}
    return dataclasses.replace(cfg, **changes) if changes else cfg


def sizes_of_sites(cfg: RunConfig, parts: list) -> list[int]:
    """The number of training examples of each site the method builds from the clients' partitions (less the
    rows each site holds out for its combiner)."""
    sizes = [len(y) for _, y in cfg.info.cls(cfg).site_data(parts)]
    if cfg.combine != "none":
        sizes = [n - int(round(cfg.combine_holdout * n)) for n in sizes]
    return sizes


def read_plan(folder: str | Path) -> dict[str, Any] | None:
    """A run folder's plan.json (None for a folder written before plans were: its config.yaml holds the
    derived values). A ConfigError when the file is there but unreadable."""
    p = Path(folder) / PLAN_FILE
    if not p.is_file():
        return None
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p} is unreadable: {e}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(f"{p} is not a silofl plan ({FORMAT})")
    return data


def as_run(config: dict[str, Any], plan_data: dict[str, Any] | None) -> dict[str, Any]:
    """A run's config.yaml mapping with its plan's derived values filled in (unchanged without a plan)."""
    if plan_data is None:
        return config
    out = dict(config)
    for k in ("split_seed", "samples_per_client", "batch_size", "noise_multiplier"):
        if k in plan_data:
            out[k] = plan_data[k]
    if plan_data.get("noise_calibrated"):
        out["calibrate_noise"] = True
    return out


def policy_request(run: RunConfig | RunPlan, k: int) -> PlanRequest:
    """What run ``run`` (a resolved config, or its plan: then its σ is the plan's) asks of site ``k``, for
    that site's policy (`silofl.site.policy.SitePolicy.check`): the noise placement, the privacy unit,
    σ, rounds, features, seed and the secure sums' survivors, sample and noise."""
    from silofl.privacy.guarantee import guarantee
    from silofl.site.policy import PlanRequest

    cfg = cast(RunConfig, run.config) if isinstance(run, RunPlan) else run
    opts = cfg.options
    secure = bool(getattr(cfg, "secure_aggregation", False))
    private = cfg.is_private and not cfg.info.traits.nonprivate
    pooled = getattr(opts, "noise_placement", None) in ("pooled", "secure")  # example-level noise shares
    if not private:
        placement = "none"
    elif cfg.is_client_level:
        placement = "secure" if secure else "server"
    else:
        placement = "secure" if secure and pooled else "local"
    if placement == "none":
        unit = "none"
    elif cfg.is_client_level:
        unit = str(getattr(opts, "privacy_unit", "hospital"))
    else:
        unit = "person" if getattr(cfg, "id_column", None) else "row"
    z = run.noise_multiplier if isinstance(run, RunPlan) else cfg.noise_multiplier
    rate = float(getattr(opts, "client_rate", 1.0))
    sample = cfg.clients if rate >= 1.0 else max(1, round(rate * cfg.clients))
    survivors = opts.min_survivors(cfg) if secure and hasattr(opts, "min_survivors") else None
    update_noise = getattr(opts, "update_noise", None)
    return PlanRequest(
        method=cfg.method,
        unit=unit,
        placement=placement,
        noise_multiplier=z if private else None,
        rounds=cfg.rounds,
        features=cfg.features,
        seeded=cfg.seed is not None,
        secure_min_survivors=survivors,
        sample_size=sample if secure else None,
        secure_noise=(update_noise(cfg) if update_noise is not None else z) if private and secure else None,
        non_formal=private and not guarantee(cfg.privacy, cfg.info.traits, unit, False, secure).formal,
    )


def check_site_policies(sites_hook: Any, run: RunPlan) -> None:
    """Check ``run`` against the policy of every site folder a ``sites`` hook charges
    (`silofl.site.folder.with_site_folders`), before any site is built: PolicyRefused naming the
    site."""
    from silofl.site.policy import PolicyRefused

    for k, folder in sorted((getattr(sites_hook, "folders", None) or {}).items()):
        try:
            folder.policy.check(policy_request(run, k))
        except PolicyRefused as e:
            raise PolicyRefused(f"site {folder.name} refuses the run: {e}") from None
