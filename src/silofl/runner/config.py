"""Typed run configuration: the settings every run shares, plus the method's own section.

`RunConfig` holds what applies to every method (data, split, privacy mechanism, rounds,
evaluation); ``options`` is the method's own dataclass (`silofl.fl.options`), written under the
method's name in ``config.yaml``, so a FedAvg run's file holds no mutual-learning weights and a ProxyFL
run's no server optimizer. Options may be given flat (``--set self_weight=0.5``, old config files): each
is routed to the method's section, and one the method does not have is a clear error (or, when reading
a finished run's file or a comparison's shared options, ignored).

`RunConfig.resolve` validates and fills what depends on other values — the effective privacy mode
(`silofl.privacy.guarantee.effective_mode`, the one place that decides it), the method's derived
options — and is idempotent. A RunConfig is what the user asked: what a run derives from it and the data (the
split seed, examples per client and batch size left to ``auto``, σ calibrated from a budget, each site's q and
steps) is its `silofl.runner.plan.RunPlan`, saved as plan.json. `check_against_data` checks δ and
the
batch size against the clients' sizes.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from silofl.core.errors import ConfigError
from silofl.core.registry import check_choice
from silofl.data.datasets import DATASETS as DATASET_REGISTRY
from silofl.data.datasets import dataset_meta
from silofl.fl.options import MethodOptions, choice
from silofl.fl.registry import MethodInfo, method_info, methods
from silofl.privacy.analysis import ACCOUNTANTS as ACCOUNTANT_REGISTRY
from silofl.privacy.guarantee import PRIVACY_MODES, Guarantee, effective_mode, guarantee
from silofl.training.metrics import METRICS

DATASETS = DATASET_REGISTRY  # the data sets' registry (silofl.data.datasets): `in`, iteration, .names()
PARTITIONS = ("p_major", "iid", "dirichlet", "site")
ACCOUNTANTS = ACCOUNTANT_REGISTRY  # the accountants' registry (silofl.privacy.analysis)
DEVICES = ("auto", "cpu", "cuda")
EVAL_SPLITS = ("test", "validation")
DEFAULT_SAMPLES_PER_CLIENT, DEFAULT_BATCH_SIZE = 1000, 250
# options of earlier versions: refused (with the reason) when given, dropped when reading an old run's file
REMOVED = {"secure_noise": "secure_noise was removed: noise and sampling are secret unless a --seed is given"}


@dataclass(frozen=True)
class RunConfig:
    # what to run
    method: str = field(
        default="proxyfl", metadata={"panel": "method", "help": "The method to run (a registered one)."}
    )
    dataset: str = field(default="fashion-mnist", metadata={"panel": "data", "help": "The data set."})
    data_dir: str | None = field(
        default=None, metadata={"panel": "data", "help": "Folder (or .npz file) with the data set files."}
    )
    # dataset "folder": images resized to this many pixels per side
    image_size: int = field(
        default=32,
        metadata={"panel": "data", "help": "--dataset folder: images resized to this many pixels per side."},
    )
    # dataset "bags": instances per bag (padded or subsampled)
    max_bag_size: int = field(
        default=64,
        metadata={"panel": "data", "help": "--dataset bags: instances per bag (padded or subsampled)."},
    )
    # per-site sources (silofl.data.sites): one file (dataset "table") or image folder ("folder") per site
    site_data: list[str] | None = field(
        default=None,
        metadata={
            "panel": "data",
            "help": "One source per site, comma-separated: table files (.csv/.parquet, --dataset table) or "
            "image "
            "folders (--dataset folder).",
        },
    )
    # dataset "table": the collaboration's schema (YAML/JSON)
    schema: str | None = field(
        default=None,
        metadata={"panel": "data", "help": "--dataset table: the collaboration's schema (YAML/JSON)."},
    )
    # a shared external test file / folder (default: the sites' held-out rows)
    test_data: str | None = field(
        default=None,
        metadata={
            "panel": "data",
            "help": "With --site-data: a shared external test file or folder (default: the union of the "
            "sites' "
            "held-out rows).",
        },
    )
    # each site's internal test share of its own rows
    test_fraction: float = field(
        default=0.2,
        metadata={
            "panel": "data",
            "help": "With --site-data: each site's internal test share of its own rows.",
        },
    )
    # dataset "table": the column naming each row's person — the privacy unit becomes the person
    # (silofl.privacy.person: persons Poisson-sampled, a person's rows clipped together, splits by person)
    id_column: str | None = field(
        default=None,
        metadata={
            "panel": "privacy",
            "help": "--dataset table: the column naming each row's person; the privacy unit becomes the "
            "person (all of their rows sampled, clipped and held out together; ε per person).",
        },
    )
    clients: int = field(default=8, metadata={"panel": "data", "help": "Number of clients K."})
    rounds: int = field(default=300, metadata={"panel": "method", "help": "Number of rounds R."})
    # a reproducible research run's seed; None: secret randomness (see core.randomness)
    seed: int | None = field(
        default=None,
        metadata={
            "panel": "privacy",
            "help": "A reproducible research run: every party's randomness derives from this seed (the "
            "guarantee then"
            " holds only while it stays secret). Default: secret randomness.",
        },
    )
    # the simulated data split's seed (not a secret); None: the run seed, else fresh
    split_seed: int | None = field(
        default=None,
        metadata={
            "panel": "data",
            "help": "The simulated data split's seed (not a secret). Default: the run seed, else fresh.",
        },
    )
    out: str = field(default="runs/latest", metadata={"panel": "output", "help": "Run folder to write."})
    defaults: str | None = field(
        default=None,
        metadata={
            "panel": "method",
            "help": "The recipe whose settings fill in what is not given ('none': the bare defaults). "
            "Default: chosen from the data (a table with a class target: proxyfl-table).",
        },
    )
    tuning_trials: int | None = field(
        default=None,
        metadata={
            "panel": "method",
            "help": "How many trials the tuning that chose these settings ran (silofl tune writes it into "
            "its recipe.yaml); --vs-alone tunes going alone with as many per site (default 4). Trains "
            "nothing.",
        },
    )
    device: str = field(default="auto", metadata={"panel": "engine", "help": "Where models train."})
    threads: int | None = field(
        default=None, metadata={"panel": "engine", "help": "torch threads per process (default 1)."}
    )
    # privacy
    privacy: str = field(
        default="strict",
        metadata={
            "panel": "privacy",
            "help": "strict (β=0, formal DP) | paper (α=β=0.5, ε not a formal guarantee) | off.",
        },
    )
    noise_multiplier: float = field(
        default=1.0, metadata={"panel": "privacy", "help": "σ, the noise multiplier."}
    )
    # per example (DP-SGD), or per client update (client-level methods)
    clip: float = field(
        default=1.0,
        metadata={
            "panel": "privacy",
            "help": "Clipping norm C (per example; per client update for client-level methods), or "
            "'adaptive' / "
            "'adaptive:C0' (client-level: private quantile estimate, start C0).",
        },
    )
    delta: float = field(default=1e-5, metadata={"panel": "privacy", "help": "δ (must be < 1/n)."})
    accountant: str = field(default="rdp", metadata={"panel": "privacy", "help": "The privacy accountant."})
    target_epsilon: float | None = field(
        default=None,
        metadata={
            "panel": "privacy",
            "help": "Budget ε per site (per unit for client-level methods): σ is set so that --rounds end at "
            "it "
            "(budget-first); with --noise-multiplier also given, σ stays as given and a client leaves before "
            "exceeding it.",
        },
    )
    # one budget per client; overrides target_epsilon
    target_epsilons: list[float] | None = field(
        default=None,
        metadata={"panel": "privacy", "help": "One budget per client, comma-separated (e.g. 20,50,80)."},
    )
    # budget-first: σ is set so that the planned rounds end at the target ε (None: yes when a target is given;
    # False — the default when noise_multiplier is given explicitly — σ as given, the target only stops a
    # client early)
    calibrate_noise: bool | None = field(
        default=None,
        metadata={
            "panel": "privacy",
            "help": "Budget-first: set σ so that the planned rounds end at the target ε (default: yes with a "
            "target, "
            "no when --noise-multiplier is given).",
        },
    )
    # data split
    partition: str = field(
        default="p_major", metadata={"panel": "data", "help": "How the pooled data is split among clients."}
    )
    p_major: float = field(
        default=0.8, metadata={"panel": "data", "help": "Fraction of a client's data from its major class."}
    )
    dirichlet_alpha: float = field(
        default=0.5, metadata={"panel": "data", "help": "--partition dirichlet: the concentration α."}
    )
    # None: min(1000, training examples // clients)
    samples_per_client: int | None = field(
        default=None, metadata={"panel": "data", "help": "Default: min(1000, training examples / clients)."}
    )
    # expected Poisson batch (local SGD batch for client-level); None: n // 4, ≤ 250
    batch_size: int | None = field(
        default=None,
        metadata={
            "panel": "method",
            "help": "Expected Poisson batch size B (q = B/n); default n/4, at most 250.",
        },
    )
    # checkpoints: every N rounds every party's state goes to OUT/checkpoint (resume: `silofl run --resume`)
    checkpoint_every: int | None = field(
        default=None,
        metadata={"panel": "engine", "help": "Save every party's state to OUT/checkpoint every N rounds."},
    )
    # evaluation
    eval_every: int = field(
        default=1, metadata={"panel": "output", "help": "Evaluate every N rounds (and at the last)."}
    )
    test_limit: int | None = field(
        default=None, metadata={"panel": "output", "help": "Evaluate on the first N test examples only."}
    )
    # what the models are scored on: "test" (the data set's test split) or "validation" (validation_size
    # training examples that no client holds, treated as public data: what `silofl tune` selects on — never
    # the test split)
    eval_split: str = field(
        default="test",
        metadata={
            "panel": "output",
            "help": "What models are scored on: test, or validation (training examples no client holds; what "
            "tune "
            "selects on).",
        },
    )
    validation_size: int = field(
        default=2000,
        metadata={
            "panel": "output",
            "help": "--eval-split validation: examples held out as the validation split (per-site tables: "
            "at most this many of each site's training rows).",
        },
    )
    # the headline figure of a run's summary, --vs-alone, compare tables and tune's selection
    # (silofl.training.metrics): accuracy | auroc | balanced_accuracy | f1 | ece; every one of them is
    # computed and written whatever this is
    metric: str = field(
        default="accuracy",
        metadata={
            "panel": "output",
            "help": "The headline figure of the summary, --vs-alone, compare tables and tune's selection "
            "(all are "
            "computed and written to metrics.jsonl and summary.json).",
        },
    )
    # whether sites report figures computed from non-private data (the private model's accuracy, un-noised
    # gradient norms, a server's raw diagnostics); None: yes in the one-process simulator (labelled), no
    # across processes
    report_nonprivate: bool | None = field(
        default=None,
        metadata={
            "panel": "privacy",
            "help": "Whether sites report figures of non-private data (the private model's accuracy, "
            "gradient norms)."
            " Default: yes in one process, no across processes.",
        },
    )
    # a site-side feature stage before the models (silofl.features): none | scatter | backbone:DIR — a fixed
    # function of each example (no budget); scatter_j/scatter_l: the scattering's scales and angles;
    # features_cache: where features are kept by content (None: $SILOFL_CACHE/features or
    # ~/.cache/silofl/features; "off": not kept)
    features: str = field(
        default="none",
        metadata={
            "panel": "data",
            "help": "Site-side feature stage before the models: none | scatter (kymatio ScatterNet + "
            "GroupNorm; "
            "--scatter-j J) | backbone:DIR (a frozen network trained on declared-public data). No budget: see"
            " docs/threat_model.md.",
        },
    )
    scatter_j: int = field(
        default=2, metadata={"panel": "data", "help": "--features scatter: the scattering's scales J."}
    )
    scatter_l: int = field(
        default=8, metadata={"panel": "data", "help": "--features scatter: the scattering's angles L."}
    )
    features_cache: str | None = field(
        default=None,
        metadata={
            "panel": "data",
            "help": "Where features are kept by content (default $SILOFL_CACHE/features or "
            "~/.cache/silofl/features; "
            "off: not kept).",
        },
    )
    # combination at inference (silofl.site.combine): each site fuses its own non-DP model with the DP
    # model(s) it holds on combine_holdout of its own training rows (set aside before training; no model
    # trains on them); none | weights | stack. Reported as combined_acc (non-private); combine_epochs: the own
    # model's epochs where the method has none (None: rounds); combine_l2: the stacker's L2 weight
    combine: str = field(
        default="none",
        metadata={
            "panel": "method",
            "help": "Combination at inference (no budget): each site fuses its own non-DP model with the DP "
            "model(s) "
            "it holds on rows held out from its own training rows. Reported as combined_acc (non-private); "
            "saved for predict/export --model combined.",
        },
    )
    combine_holdout: float = field(
        default=0.2,
        metadata={
            "panel": "method",
            "help": "With --combine: the share of each site's training rows held out for its combiner (no "
            "model "
            "trains on them).",
        },
    )
    combine_epochs: int | None = field(
        default=None,
        metadata={
            "panel": "method",
            "help": "With --combine: the own model's epochs where the method has none (default: --rounds).",
        },
    )
    combine_l2: float = field(
        default=1e-2, metadata={"panel": "method", "help": "With --combine stack: the stacker's L2 weight."}
    )
    # fit the combiner class-balanced (every class of the held-out rows counts equally)
    combine_balance: bool = field(
        default=True, metadata={"panel": "method", "help": "With --combine: fit the combiner class-balanced."}
    )
    # a deployed run (`silofl deploy start`): each site reads its own data and schema, named in its site.json,
    # and announces their shape and classes; the coordinator reads none (no --site-data, --schema or
    # --test-data here)
    data_at_sites: bool = False
    # a deployed run: the task the sites declared for their targets in their hellos (silofl.training.tasks,
    # e.g. survival; None: the data set's), set by the coordinator from them (it reads no schema); no flag
    sites_task: str | None = None
    # experiment tracking (silofl.runner.tracking): (KIND, DIR), KIND tensorboard | mlflow; each evaluated
    # round's figures are logged there with their labels (dp / public / non-private — the last only where
    # the sites release them)
    track: tuple[str, str] | None = None
    # secure aggregation (silofl.secure) with distributed discrete noise added at each site: the client-level
    # methods' ε then holds against the server too (settings: the method's secagg_* options)
    secure_aggregation: bool = field(
        default=False,
        metadata={
            "panel": "privacy",
            "help": "Client-level methods: secure aggregation (SecAgg+) with discrete noise added at each "
            "site, "
            "so the ε holds against the server (settings: --secagg-bits, --secagg-min-survivors, …). "
            "FedAvg/FML: the server sees only the sum of the sites' model moves (--secagg-range).",
        },
    )
    # a survival target's public time bins (inner edges), overriding the schema's ``bins``
    # (silofl.training.survival.encode_target)
    time_bins: list[float] | None = field(
        default=None,
        metadata={
            "panel": "data",
            "help": "--dataset table with a survival target: the public time bins' inner edges of the "
            "piecewise-exponential model (e.g. 30,90,180; default: the schema's bins).",
        },
    )
    # the method's own section (silofl.fl.options)
    options: Any = field(default=None, compare=True)

    def __post_init__(self) -> None:
        for f in fields(self):  # a value of the wrong type is refused where the config is built
            if f.name != "options":
                check_type(f.name, f.type if isinstance(f.type, str) else str(f.type), getattr(self, f.name))
        if self.options is None and isinstance(self.method, str) and self.method in methods():
            object.__setattr__(self, "options", method_info(self.method).options())  # the method's defaults

    # ------------------------------------------------------------------ building
    @classmethod
    def common_fields(cls) -> list[str]:
        """The settings every method shares."""
        return [f.name for f in fields(cls) if f.name != "options"]

    @classmethod
    def from_dict(cls, data: dict[str, Any], strict: bool = True) -> RunConfig:
        """A config from plain data: common settings, and the method's options either nested under its name or
        flat. With ``strict`` an option the method does not have is an error; without, it is dropped."""
        if not isinstance(data, dict):
            raise ConfigError(
                f"a config must be a mapping of option names to values, got {type(data).__name__}"
            )
        known_methods = methods()
        method = data.get("method", cls.method)
        if not isinstance(method, str):
            raise ConfigError(f"method must be a name, got {method!r}")
        info = method_info(method)
        common = set(cls.common_fields())
        section: dict[str, Any] = {}
        flat: dict[str, Any] = {}
        for key, value in data.items():
            if key.replace("-", "_") in REMOVED:
                if strict:
                    raise ConfigError(REMOVED[key.replace("-", "_")])
                continue
            if key in known_methods and isinstance(value, dict):
                if key == method:
                    section.update({k.replace("-", "_"): v for k, v in value.items()})
                elif strict:
                    raise ConfigError(f"the config has a section for method {key!r} but runs {method!r}")
            else:
                flat[key.replace("-", "_")] = value
        own = set(info.options.field_names())
        everyone = _all_option_fields()
        unknown = sorted(k for k in [*flat, *section] if k not in common and k not in everyone)
        if unknown:
            raise ConfigError(
                f"unknown config option(s): {', '.join(unknown)}; known options: "
                f"{', '.join(sorted(common | set(everyone)))}"
            )
        wrong = sorted(k for k in section if k not in own)
        if wrong and strict:
            raise ConfigError(f"option(s) {', '.join(wrong)} do not apply to method {method!r}")
        _site_defaults(flat)
        if "noise_multiplier" in flat and "calibrate_noise" not in flat:
            flat["calibrate_noise"] = False  # σ given explicitly: it wins, a budget only stops clients early
        for k, v in flat.items():
            if k in common:
                continue
            if k in own:
                section.setdefault(k, v)
            elif strict:
                raise ConfigError(
                    f"option {k} does not apply to method {method!r} (its options: {', '.join(sorted(own))})"
                )
        types = {f.name: str(f.type) for f in fields(cls)} | {
            f.name: str(f.type) for f in fields(info.options)
        }
        section = {k: _coerce(k, types[k], v) for k, v in section.items() if k in own}
        flat = {k: _coerce(k, types[k], v) for k, v in flat.items() if k in common}
        try:
            return cls(**flat, options=info.options(**section))
        except TypeError as e:
            raise ConfigError(f"invalid config: {e}") from None

    @classmethod
    def from_yaml(cls, path: str | Path, strict: bool = True) -> RunConfig:
        """A config from a YAML file (see `from_dict`)."""
        return cls.from_dict(load_yaml_mapping(path), strict=strict)

    def to_flat(self) -> dict[str, Any]:
        """Every setting in one mapping (common settings and the method's options side by side)."""
        common = {f: getattr(self, f) for f in self.common_fields()}
        return {**common, **(self.options.to_dict() if self.options is not None else {})}

    def to_dict(self) -> dict[str, Any]:
        """Plain data: the common settings, then the method's options under its name."""
        common = {f: _plain(getattr(self, f)) for f in self.common_fields()}
        if self.options is not None:
            common[self.method] = {k: _plain(v) for k, v in self.options.to_dict().items()}
        return common

    def to_yaml(self) -> str:
        """The config as YAML (what a run folder's ``config.yaml`` holds)."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with ``changes`` (common settings or the method's options, flat; None values are ignored). A
        new method keeps the options it shares with the old one."""
        changes = {k: v for k, v in changes.items() if v is not None}
        flat = {**self.to_flat(), **changes}
        opts_changed = {k: v for k, v in changes.items() if k not in self.common_fields()}
        own = set(method_info(flat["method"]).options.field_names())
        stray = sorted(k for k in opts_changed if k not in own)
        if stray:
            raise ConfigError(f"option(s) {', '.join(stray)} do not apply to method {flat['method']!r}")
        return RunConfig.from_dict(flat, strict=False)

    # ------------------------------------------------------------------ checks
    @property
    def info(self) -> MethodInfo:
        """The registered method."""
        return method_info(self.method)

    def resolve(self) -> RunConfig:
        """Validate and fill derived values; returns a new config. Idempotent."""
        if self.options is None or not isinstance(self.options, MethodOptions):
            raise ConfigError(f"unknown method {self.method!r}")
        cfg = dataclasses.replace(self, **_coerced(self), options=_coerced(self.options, replace=True))
        cfg.validate()
        cfg = dataclasses.replace(cfg, metric=cfg._task_metric())
        cfg = dataclasses.replace(cfg, privacy=effective_mode(cfg.privacy, cfg.info.traits))
        cfg = dataclasses.replace(cfg, options=cfg.options.resolve(cfg))
        cfg.options.validate(cfg)
        return cfg

    def validate(self) -> None:
        """Raise ConfigError for an invalid common setting (the method's own are checked by its options)."""
        method_info(self.method)
        choice("privacy", self.privacy, PRIVACY_MODES)
        check_choice(DATASETS, self.dataset)
        choice("partition", self.partition, PARTITIONS)
        check_choice(ACCOUNTANTS, self.accountant)
        choice("device", self.device, DEVICES)
        choice("eval_split", self.eval_split, EVAL_SPLITS)
        choice("metric", self.metric, tuple(METRICS))
        self._validate_task()
        self._validate_combine()
        self._validate_track()
        if self.secure_aggregation and not getattr(self.options, "supports_secure_aggregation", False):
            able = [m for m in methods().values() if getattr(m.options, "supports_secure_aggregation", False)]
            kinds = [", ".join(m.name for m in able if m.client_level == c) for c in (True, False)]
            pooled = getattr(self.options, "noise_placement", None) == "pooled"  # why not, if the method says
            raise ConfigError(
                (getattr(self.options, "pooled_refusal", None) if pooled else None)
                or f"--secure-aggregation is available for the client-level methods ({kinds[0]}) and the "
                f"example-level {kinds[1]}; not for {self.method}"
            )
        _check_secure_flags(self)
        if self.eval_split == "validation" and (
            (self.site_data and self.dataset != "table") or (not self.site_data and self.partition == "site")
        ):
            raise ConfigError(
                "eval_split 'validation' takes unassigned training examples of a pooled data set, or each "
                "site's own validation rows of per-site tables (--dataset table --site-data); other per-site "
                "sources (partition 'site', image folders) have none"
            )
        for name in ("clients", "rounds", "eval_every", "image_size", "max_bag_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in (
            "samples_per_client",
            "batch_size",
            "test_limit",
            "checkpoint_every",
            "threads",
            "validation_size",
            "tuning_trials",
        ):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ConfigError(f"{name} must be at least 1, got {v}")
        self._validate_sources()
        self._validate_features()
        if not 0.0 <= self.p_major <= 1.0:
            raise ConfigError(f"p_major must lie in [0, 1], got {self.p_major}")
        if not (math.isfinite(self.dirichlet_alpha) and self.dirichlet_alpha > 0):
            raise ConfigError(f"dirichlet_alpha must be positive, got {self.dirichlet_alpha}")
        if self.privacy != "off" and not self.info.traits.nonprivate:
            if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0):
                raise ConfigError(
                    f"noise_multiplier must be positive and finite under DP, got {self.noise_multiplier}"
                )
            if not (math.isfinite(self.clip) and self.clip > 0):
                raise ConfigError(f"clip must be positive and finite, got {self.clip}")
            if not 0.0 < self.delta < 1.0:
                raise ConfigError(f"delta must lie in (0, 1), got {self.delta}")
            if self.target_epsilon is not None and not (
                math.isfinite(self.target_epsilon) and self.target_epsilon > 0
            ):
                raise ConfigError(f"target_epsilon must be positive and finite, got {self.target_epsilon}")
            if self.calibrate_noise and self.target_epsilon is None and self.target_epsilons is None:
                raise ConfigError("calibrate_noise needs a budget: give --target-epsilon E")
            if self.target_epsilons is not None:
                if len(self.target_epsilons) != self.clients:
                    raise ConfigError(
                        f"target_epsilons lists {len(self.target_epsilons)} budgets for {self.clients} "
                        f"clients"
                    )
                if any(not (math.isfinite(e) and e > 0) for e in self.target_epsilons):
                    raise ConfigError(
                        f"every target_epsilons entry must be positive and finite, got {self.target_epsilons}"
                    )

    def _validate_combine(self) -> None:
        from silofl.site.combine import COMBINE_MODES

        choice("combine", self.combine, COMBINE_MODES)
        if not 0.0 < self.combine_holdout < 1.0:
            raise ConfigError(f"combine_holdout must lie in (0, 1), got {self.combine_holdout}")
        if self.combine_epochs is not None and self.combine_epochs < 1:
            raise ConfigError(f"combine_epochs must be at least 1, got {self.combine_epochs}")
        if not (math.isfinite(self.combine_l2) and self.combine_l2 > 0):
            raise ConfigError(f"combine_l2 must be a finite positive number, got {self.combine_l2}")

    def _validate_track(self) -> None:
        if self.track is None:
            return
        from silofl.runner.folder import RUN_DIRS, RUN_FILES, check_out_path
        from silofl.runner.tracking import check_available

        kind, where = self.track
        check_available(kind)  # a known kind whose package is installed
        flag = f"--track {kind} DIR"
        path = check_out_path(where, flag=flag)
        if path.is_dir() and any((path / f).exists() for f in (*RUN_FILES, *RUN_DIRS)):
            raise ConfigError(f"{flag}: {path} holds a silofl run; track into a folder of its own")
        if path.resolve() == Path(self.out).resolve():
            raise ConfigError(f"{flag}: {path} is the run's own --out; track into a folder of its own")

    def _validate_task(self) -> None:
        """--metric against the data set's task (Dice/IoU for masks; AUROC, F1, … for class labels), and the
        methods a segmentation run refuses."""
        from silofl.training.metrics import metric_task

        task = dataset_meta(self.dataset).get("task", "classification")
        wanted = metric_task(self.metric)
        if wanted == "survival" and self.data_task() == "survival":
            return
        if wanted not in ("any", task):
            raise ConfigError(
                f"--metric {self.metric} scores {wanted} runs; dataset {self.dataset!r} is a {task} task"
                + (" (choose accuracy, dice or iou)" if task == "segmentation" else "")
            )
        if task == "segmentation" and self.combine != "none":
            raise ConfigError(
                "--combine fits a classifier over the models' class scores; a segmentation run has none"
            )

    def data_task(self) -> str:
        """The task of this run's targets (silofl.training.tasks): the data set's, or a table schema's
        (``survival`` for a ``{type: survival, …}`` target)."""
        task = dataset_meta(self.dataset).get("task", "classification")
        if self.data_at_sites and self.sites_task is not None:  # what the sites declared (a deployed run)
            from silofl.training.tasks import task as registered

            return registered(self.sites_task).name
        if self.schema and dataset_meta(self.dataset)["schema"] and not self.data_at_sites:
            from silofl.core.errors import DataError
            from silofl.data.schema import Schema

            try:
                kind = Schema.load(self.schema).task
            except DataError:  # reported, with its reason, when the run reads its data
                return task
            if kind == "survival":
                return kind
        return task

    def _task_metric(self) -> str:
        """--metric checked against a survival target (silofl.training.tasks): its headline is the C-index
        (``accuracy``, the default, stands for it); a classification metric, and a method that does not train
        it, refused with one line."""
        from silofl.training.tasks import check_metric, task

        kind = self.data_task()
        if kind != "survival":
            return self.metric
        t = task(kind)
        if t.methods is not None and self.method not in t.methods:
            raise ConfigError(
                f"{self.method} does not train a survival target: {t.refusal} {', '.join(t.methods)}"
            )
        if self.combine != "none":
            raise ConfigError(
                "--combine fits a classifier over the models' class scores; a survival run has none"
            )
        return check_metric(
            kind, self.metric, f"the survival target of {self.schema or 'the sites (their schemas)'}"
        )

    def _validate_sources(self) -> None:
        if not 0.0 < self.test_fraction < 1.0:
            raise ConfigError(f"test_fraction must lie in (0, 1), got {self.test_fraction}")
        if self.data_at_sites:  # the sites read their own sources: the coordinator names none
            given = [
                f
                for f, v in (
                    ("--site-data", self.site_data),
                    ("--schema", self.schema),
                    ("--test-data", self.test_data),
                    ("--id-column", self.id_column),
                )
                if v
            ]
            if given:
                raise ConfigError(
                    f"a deployed run reads each site's own data and schema (its site.json): "
                    f"{', '.join(given)} cannot be given to the coordinator"
                )
            return
        meta = dataset_meta(self.dataset)
        if not meta["pooled"] and not self.site_data:
            raise ConfigError(
                f"dataset {self.dataset!r} needs --site-data (one source per site)"
                + (" and --schema" if meta["schema"] else "")
            )
        if meta["schema"] and not self.schema:
            raise ConfigError(
                f"dataset {self.dataset!r} needs --schema FILE.yaml (feature names and types, target, "
                "levels, bounds)"
            )
        if self.schema and not meta["schema"]:
            raise ConfigError(f"--schema applies to dataset {_takes('schema')}, not {self.dataset!r}")
        if self.site_data:
            if not meta["site_data"]:
                raise ConfigError(
                    f"--site-data takes per-site sources of {_takes('site_data')} (table files, "
                    f"image folders), not dataset {self.dataset!r}"
                )
            if len(self.site_data) != self.clients:
                raise ConfigError(
                    f"--site-data names {len(self.site_data)} sites but clients is {self.clients}: one "
                    "client per site (leave clients out to take the number of sites)"
                )
            if self.partition != "site":
                raise ConfigError(
                    f"--site-data gives each client its own site's data: partition must be 'site', not "
                    f"{self.partition!r}"
                )
        elif self.test_data:
            raise ConfigError(
                "--test-data goes with --site-data (the shared external test set of per-site sources)"
            )
        self._validate_id_column(meta)

    def _validate_id_column(self, meta: dict) -> None:
        """``--id-column`` (person-level DP) names a column of per-site tables, for a method whose sites
        train with example-level DP-SGD (a client-level method's unit is already a hospital or sub-client)."""
        if self.id_column is None:
            return
        if not self.id_column.strip():
            raise ConfigError("--id-column needs a column name")
        if not meta["schema"]:
            raise ConfigError(
                f"--id-column names a column of a table (--dataset table); dataset {self.dataset!r} has no "
                "id column"
            )
        if self.is_client_level:
            raise ConfigError(
                f"--id-column makes the person the unit of example-level DP-SGD; {self.method} is "
                "client-level DP (its unit is a hospital or sub-client, and sub-clients are not drawn by "
                "person): leave --id-column out"
            )
        if self.combine != "none":
            raise ConfigError(
                "--id-column does not yet go with --combine (its held-out rows are not by person)"
            )

    def _validate_features(self) -> None:
        from silofl.features import make_stage
        from silofl.features.registry import parse

        name, arg = parse(self.features)
        for f in ("scatter_j", "scatter_l"):
            if getattr(self, f) < 1:
                raise ConfigError(f"{f} must be at least 1, got {getattr(self, f)}")
        if name != "none" and not dataset_meta(self.dataset)["images"]:
            raise ConfigError(
                f"features {name!r} apply to images; dataset {self.dataset!r} has table rows or bags: use "
                "--features none"
            )
        if name == "backbone":
            from silofl.features.backbone import read_card

            assert arg is not None
            from silofl.site.policy import NAME_RE

            if self.data_at_sites and NAME_RE.fullmatch(arg):
                return  # a deployed run names a backbone each site registered (silofl.site.policy)
            read_card(Path(arg).expanduser())
        elif name not in ("none", "scatter"):
            make_stage(self.features, self)  # a plug-in checks its own parameters

    def with_data(self, n_train: int, smallest: int | None = None, cap: int | None = None) -> RunConfig:
        """The config with the settings left to ``auto`` filled from the data
        (`silofl.runner.plan.auto_sizes`;
        a run keeps them in its plan, not in its config)."""
        from silofl.runner.plan import auto_sizes

        spc, batch = auto_sizes(self, n_train, smallest, cap)
        changes = {
            k: v for k, v in (("samples_per_client", spc), ("batch_size", batch)) if getattr(self, k) is None
        }
        return dataclasses.replace(self, **changes) if changes else self

    # ------------------------------------------------------------------ derived
    @property
    def is_private(self) -> bool:
        """Whether DP is on (after `resolve`)."""
        return self.privacy != "off"

    @property
    def is_client_level(self) -> bool:
        """Whether the method protects whole clients (server noise) rather than examples."""
        return self.info.client_level

    def guarantee(self) -> Guarantee:
        """What the ε this run prints means (`silofl.privacy.guarantee`)."""
        unit = getattr(self.options, "privacy_unit", "hospital")
        return guarantee(
            self.privacy,
            self.info.traits,
            unit,
            seeded=self.seed is not None,
            secure_aggregation=bool(getattr(self, "secure_aggregation", False)),
        )

    @property
    def data_seed(self) -> int | None:
        """The seed of the simulated data split (and of a data set's own seeded train/test split)."""
        return self.split_seed if self.split_seed is not None else self.seed

    @property
    def calibrates(self) -> bool:
        """Whether σ is set from the budget (budget-first) rather than given
        (`silofl.runner.plan.calibrates`)."""
        from silofl.runner.plan import calibrates

        return calibrates(self)

    def calibration_plan(self, site_sizes: list[int]) -> list[dict[str, Any]]:
        """What each party's accountant will see over the planned rounds
        (`silofl.runner.plan.calibration_plan`)."""
        from silofl.runner.plan import calibration_plan

        return calibration_plan(self, site_sizes)

    def calibrated(self, site_sizes: list[int]) -> RunConfig:
        """The config with σ calibrated from its budget when it is budget-first, else self
        (`silofl.runner.plan.calibrated_sigma`; a run keeps σ in its plan, not in its config)."""
        from silofl.runner.plan import calibrated_sigma

        sigma = calibrated_sigma(self, site_sizes)
        return (
            self if sigma is None else dataclasses.replace(self, noise_multiplier=sigma, calibrate_noise=True)
        )

    def target_epsilon_of(self, client: int) -> float | None:
        """Client ``client``'s budget (`silofl.runner.plan.target_epsilon_of`)."""
        from silofl.runner.plan import target_epsilon_of

        return target_epsilon_of(self, client)


class ConfigTypeError(ConfigError, TypeError):
    """A setting of the wrong type given to `RunConfig` (``RunConfig(delta="1e-5")``): a TypeError
    that is also a one-line ConfigError."""


def check_type(name: str, t: str, v: Any) -> None:
    """Raise a one-line `ConfigTypeError` unless ``v`` has the declared type ``t`` (an int passes
    for a float; text read from YAML or a command line is converted by `RunConfig.from_dict`, not
    here)."""
    if v is None or t == "Any":
        return
    kind = t.split("|")[0].strip().replace(" ", "")
    ok = {
        "int": lambda: isinstance(v, numbers.Integral) and not isinstance(v, bool),
        "float": lambda: isinstance(v, numbers.Real) and not isinstance(v, bool),
        "bool": lambda: isinstance(v, bool),
        "str": lambda: isinstance(v, str),
        "list[float]": lambda: isinstance(v, (list, tuple)),
        "list[str]": lambda: isinstance(v, (list, tuple)),
        "tuple[str,str]": lambda: isinstance(v, (list, tuple)),
    }.get(kind)
    if ok is not None and not ok():
        raise ConfigTypeError(f"{name} must be of type {t}, got {type(v).__name__} {v!r}")


_dataclass_init = RunConfig.__init__


@functools.wraps(_dataclass_init)
def _init_with_options(self: RunConfig, *args: Any, **kw: Any) -> None:
    """``RunConfig(method="fedavg", lr=0.01)``: the method's options may be given flat, by the same names as
    the command line's flags (an option the method does not have is a one-line ConfigError)."""
    given = {k: kw.pop(k) for k in list(kw) if k not in _FIELD_NAMES}
    _dataclass_init(self, *args, **kw)
    if not given:
        return
    if self.options is None:
        raise ConfigError(f"unknown method {self.method!r}")
    own = {f.name: str(f.type) for f in fields(self.options)}
    unknown = sorted(k for k in given if k not in _all_option_fields())
    if unknown:
        raise ConfigError(f"RunConfig has no option(s) {', '.join(unknown)}")
    stray = sorted(k for k in given if k not in own)
    if stray:
        raise ConfigError(
            f"option(s) {', '.join(stray)} do not apply to method {self.method!r} (its options: "
            f"{', '.join(sorted(own))})"
        )
    for k, v in given.items():
        check_type(k, own[k], v)
    object.__setattr__(self, "options", dataclasses.replace(self.options, **given))


_FIELD_NAMES = frozenset(f.name for f in fields(RunConfig))
RunConfig.__init__ = _init_with_options  # type: ignore[method-assign]


def _site_defaults(flat: dict[str, Any]) -> None:
    """With per-site sources: a comma-separated list is split, and unless given, one client per site and
    partition 'site'."""
    sites = flat.get("site_data")
    if isinstance(sites, str):
        sites = flat["site_data"] = [s.strip() for s in sites.split(",") if s.strip()]
    if sites:
        flat.setdefault("clients", len(sites))
        flat.setdefault("partition", "site")


def _all_option_fields() -> dict[str, Any]:
    """Every method's option names with their defaults (the first definition's)."""
    out: dict[str, Any] = {}
    for info in methods().values():
        for k, v in info.options.defaults().items():
            out.setdefault(k, v)
    return out


def _coerced(obj: Any, replace: bool = False) -> Any:
    """``obj``'s fields (the method's section aside) as their declared types (from YAML or the command line),
    or a ConfigError; with ``replace``, a copy of ``obj`` holding them."""
    values = {
        f.name: _coerce(f.name, f.type if isinstance(f.type, str) else str(f.type), getattr(obj, f.name))
        for f in fields(obj)
        if f.name != "options"
    }
    return dataclasses.replace(obj, **values) if replace else values


def _plain(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def _coerce(name: str, t: str, v: Any) -> Any:
    """``v`` as the declared type ``t`` (from YAML or the command line), or a ConfigError."""
    if v is None:
        return None
    try:
        if t.startswith("int"):
            if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
                raise ValueError
            if abs(int(v)) > INT_LIMIT:
                raise ConfigError(
                    f"option {name!r} must be an integer of magnitude at most {INT_LIMIT}, got {v!r}"
                )
            return int(v)
        if t.startswith("float"):
            if isinstance(v, bool):
                raise ValueError
            x = float(v)
            if not math.isnan(x):
                check_float_range(name, x)
                return x
        if t.startswith("bool"):
            if not isinstance(v, bool):
                raise ValueError
            return v
        if t.startswith("list[float]"):
            check_float_range(name, [float(x) for x in v])
            return [float(x) for x in v]
        if t.startswith("tuple[str, str]"):
            if not isinstance(v, (list, tuple)) or len(v) != 2:
                raise ValueError
            return (str(v[0]), str(v[1]))
        if t.startswith("list[str]"):
            if isinstance(v, str):
                raise ValueError
            return [str(x) for x in v]
        if t.startswith("str") and not isinstance(v, str):
            return str(v)
    except ConfigError:
        raise
    except (TypeError, ValueError):
        raise ConfigError(f"option {name!r} must be of type {t}, got {v!r}") from None
    if t.startswith("float"):
        raise ConfigError(f"option {name!r} must be a number, got nan")
    return v


INT_LIMIT = (
    2**63 - 1
)  # int64 (torch, numpy, seeds): a count or seed beyond it is refused, not planned for ever
FLOAT_LIMIT = 3.4e38  # the largest float32: every tensor silofl trains or accounts with is float32


def _check_secure_flags(cfg: RunConfig) -> None:
    """--secure-aggregation needs 3 sites or more (of two, each learns the other's update from the sum less
    its own: below any site's survivors floor, `silofl.site.policy`); a --secagg-* option set without
    it would silently change nothing."""
    if cfg.secure_aggregation and cfg.clients < 3:
        raise ConfigError(
            f"--secure-aggregation needs at least 3 sites: with {cfg.clients}, a site learns the others' "
            "update from the sum less its own"
        )
    opts = cfg.options
    if not cfg.secure_aggregation and dataclasses.is_dataclass(opts):
        set_ = [
            f"--{f.name.replace('_', '-')}"
            for f in dataclasses.fields(opts)
            if f.name.startswith("secagg_") and getattr(opts, f.name) != f.default
        ]
        if set_:
            raise ConfigError(f"{', '.join(set_)} only apply with --secure-aggregation")


def check_float_range(name: str, v: Any) -> None:
    """Raise a one-line ConfigError if a finite number in ``v`` (a float or a list of floats) exceeds
    FLOAT_LIMIT in magnitude: beyond it a learning rate, σ or clip overflows the float32 tensors it meets."""
    for x in v if isinstance(v, list) else [v]:
        if (
            math.isfinite(x) and abs(x) > FLOAT_LIMIT
        ):  # ±inf is left to each option's own check (its own words)
            raise ConfigError(
                f"option {name!r} must be a finite number of magnitude at most {FLOAT_LIMIT:g} (float32), "
                f"got {x!r}"
            )


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe YAML loader that refuses a key given twice in one mapping (the plain loader keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:  # type: ignore[override]
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def safe_load_unique(text: str) -> Any:
    """``yaml.safe_load`` that refuses a mapping key given twice (a yaml.YAMLError naming it and its line)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def load_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """A YAML file's top-level mapping, or a ConfigError saying what is wrong with the file (a key given
    twice included)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        data = safe_load_unique(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {p} is not valid YAML: {e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {p} is not a text file (not UTF-8): give a YAML file") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {p}: {e.strerror}") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {p} must hold a mapping of option names to values, got {type(data).__name__}"
        )
    return data


def merge_options(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` (flat options, flags, --set) over a config's or recipe's mapping ``base``: the base's
    section of the run's method is lifted to flat options first, so an override of a method option the base
    nests under the method's name wins instead of being shadowed by it."""
    method = overrides.get("method", base.get("method", RunConfig.method))
    section = base.get(method) if isinstance(method, str) else None
    if isinstance(section, dict):
        base = {**{k: v for k, v in base.items() if k != method}, **section}
    return {**base, **overrides}


def check_against_data(cfg: RunConfig, client_sizes: list[int]) -> None:
    """Checks that need the partitioned data: δ < 1/n for every client, batch not above n."""
    for k, n in enumerate(client_sizes):
        # client-level methods protect whole clients: their δ bound (1 / number of units) is checked by the
        # server
        if cfg.is_private and not cfg.is_client_level and cfg.delta >= 1.0 / n:
            raise ConfigError(
                f"delta {cfg.delta:g} must be below 1/n = {1.0 / n:.3g} for client {k} with n = {n} examples"
            )
        if cfg.batch_size is not None and cfg.batch_size > n:
            raise ConfigError(f"batch_size {cfg.batch_size} exceeds client {k}'s {n} examples")


def _takes(key: str) -> str:
    """The registered data sets whose metadata ``key`` is true, as an error message names them."""
    return " or ".join(repr(n) for n in DATASETS.names() if dataset_meta(n)[key])
