"""What an audit is asked to do (besides the run it audits)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from silofl.core.errors import ConfigError
from silofl.core.registry import Registry

AUDIT_ATTACKS: Registry = Registry(
    "audit attack", "silofl.audit_attacks", builtins=("silofl.auditing.inversion",)
)
"""Attacks an audit runs on request (``--attack NAME``) besides its canaries and membership inference. An
entry's object is a class built with the :class:`AuditSettings`; it has ``check(cfg, settings, kind)`` (a
one-line ConfigError before the run where it does not apply; ``kind``: client-level, example-level, pubsub),
``observers(server)`` (observers at the engine seam during the run), ``run(ctx)`` (after it, with an
:class:`AttackContext`: audit.json's entry under its name), ``markdown(result)`` (audit.md's lines),
``summary(result)`` (the CLI's line) and ``files`` (what it writes into the audit folder); its metadata
``kinds`` says which audits take it."""


@dataclass
class AttackContext:
    """What an audit attack gets after the run: the resolved run config, its split, the audited client, the
    audit folder and the accountant's ε of the audited unit (None without DP)."""

    cfg: Any
    split: Any
    site: int
    out: Any
    epsilon: float | None


RESEARCH_NOTE = (
    "seeded research run (seed {seed}): the canaries, their coins, the reference models, the run's noise "
    "and sampling are drawn from this seed so the audit can be repeated; the run's ε then holds only while "
    "the seed stays secret (a deployment draws them from a secret source)"
)
SECRET_NOTE = (
    "secret randomness: the run's noise and sampling come from a cryptographically secure source, the "
    "canaries, their coins and the reference models from fresh secret seeds (none recorded); the audit "
    "measures the mechanism a deployment runs and cannot be repeated draw for draw (--seed for that)"
)


PLACEMENTS = ("quiet", "random")


@dataclass
class AuditSettings:
    canaries: int = 1000  # m: each included in the audited site's data (or as a client) with probability ½
    canary_kind: str = (
        "mislabelled"  # example canaries: "mislabelled" | "noise" (out-of-distribution inputs);
    )
    # gradient canaries (white-box, silofl.auditing.gradient): "dirac" | "random"
    site: int = 0  # the audited site (client index)
    reference_models: int = 4  # per attacked architecture, trained on data disjoint from every candidate
    nonmembers: int | None = None  # default: as many as the audited site's real examples
    confidence: float = 0.95
    seed: int | None = (
        None  # a seeded research audit; None: secret randomness everywhere (the default of silofl)
    )
    pubsub_model: str | None = None  # audit a PubSub-ML published model of this kind instead of a run
    epsilon: float | None = None  # the published model's ε (PubSub)
    pubsub_epochs: int = 20  # dp-nn epochs (PubSub)
    attacks: tuple[str, ...] = ()  # extra attacks by name (AUDIT_ATTACKS), e.g. ("inversion",)
    inversion_images: int = 1  # --attack inversion: images of the attacked sub-client
    inversion_round: int = 1  # --attack inversion: the round whose update is attacked
    inversion_iterations: int = 1500  # --attack inversion: optimisation steps per restart
    inversion_restarts: int = 2  # --attack inversion: random restarts (lowest loss kept)
    # gradient canaries' coordinates: "quiet" — those where real gradients on public data (training rows no
    # client holds) at the initial model are smallest; "random" — anywhere on the largest parameter tensor
    canary_placement: str = "quiet"

    def validate(self) -> None:
        """Raise ConfigError on settings no audit can run with."""
        from silofl.auditing.canaries import CANARY_KINDS
        from silofl.auditing.gradient import GRADIENT_KINDS

        if self.canary_kind not in (*CANARY_KINDS, *GRADIENT_KINDS):
            raise ConfigError(
                f"unknown --canary-kind {self.canary_kind!r}; choose one of: "
                f"{', '.join((*CANARY_KINDS, *GRADIENT_KINDS))}"
            )
        if self.canary_kind in GRADIENT_KINDS and self.pubsub_model not in (None, "dp-nn"):
            raise ConfigError(
                f"gradient canaries (--canary-kind dirac | random) audit DP-SGD: a run's sites or a "
                f"published dp-nn, not a published {self.pubsub_model}; use --canary-kind mislabelled or "
                "noise"
            )
        if self.canary_placement not in PLACEMENTS:
            raise ConfigError(
                f"unknown --canary-placement {self.canary_placement!r}; choose one of: "
                f"{', '.join(PLACEMENTS)}"
            )
        if self.canaries < 2:
            raise ConfigError(f"--canaries must be at least 2, got {self.canaries}")
        if self.site < 0:
            raise ConfigError(f"--audited-site must be a client index, got {self.site}")
        if self.reference_models < 0:
            raise ConfigError(f"--reference-models must be 0 or more, got {self.reference_models}")
        if self.nonmembers is not None and self.nonmembers < 1:
            raise ConfigError(f"--nonmembers must be at least 1, got {self.nonmembers}")
        if not 0.5 <= self.confidence < 1.0:
            raise ConfigError(f"--confidence must lie in [0.5, 1), got {self.confidence}")
        if self.pubsub_epochs < 1:
            raise ConfigError(f"--epochs must be at least 1, got {self.pubsub_epochs}")
        for name in self.attacks:
            AUDIT_ATTACKS.entry(name)  # a one-line error naming the choices
        for opt, v in (
            ("--inversion-images", self.inversion_images),
            ("--inversion-round", self.inversion_round),
            ("--inversion-iterations", self.inversion_iterations),
            ("--inversion-restarts", self.inversion_restarts),
        ):
            if v < 1:
                raise ConfigError(f"{opt} must be at least 1, got {v}")

    @property
    def seeded(self) -> bool:
        """Whether this is a seeded (reproducible) research audit."""
        return self.seed is not None

    @property
    def research_note(self) -> str:
        """The label of the audit's randomness (audit.json's ``research_note``)."""
        return RESEARCH_NOTE.format(seed=self.seed) if self.seed is not None else SECRET_NOTE

    def derived(self, offset: int) -> int:
        """The seed of one of the audit's own draws: ``seed + offset`` in a seeded audit, else a fresh secret
        one (from ``secrets``, never written), as for every other non-guarantee draw of an unseeded run."""
        return self.seed + offset if self.seed is not None else secrets.randbits(63)
