"""What an audit is asked to do (besides the run it audits)."""

from __future__ import annotations

from dataclasses import dataclass

from silofl.core.errors import ConfigError

RESEARCH_NOTE = ("seeded research run (seed {seed}): the canaries, their coins, the run's noise and sampling are "
                 "drawn from this seed so the audit can be repeated; a deployment draws them from a secret source")


@dataclass
class AuditSettings:
    canaries: int = 1000  # m: each included in the audited site's data (or as a client) with probability ½
    canary_kind: str = "mislabelled"  # example canaries: "mislabelled" | "noise" (out-of-distribution inputs)
    site: int = 0  # the audited site (client index)
    reference_models: int = 4  # per attacked architecture, trained on data disjoint from every candidate
    nonmembers: int | None = None  # default: as many as the audited site's real examples
    confidence: float = 0.95
    seed: int = 0
    pubsub_model: str | None = None  # audit a PubSub-ML published model of this kind instead of a run
    epsilon: float | None = None  # the published model's ε (PubSub)
    pubsub_epochs: int = 20  # dp-nn epochs (PubSub)

    def validate(self) -> None:
        from silofl.audit.canaries import CANARY_KINDS

        if self.canary_kind not in CANARY_KINDS:
            raise ConfigError(f"unknown --canary-kind {self.canary_kind!r}; choose one of: {', '.join(CANARY_KINDS)}")
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

    @property
    def research_note(self) -> str:
        return RESEARCH_NOTE.format(seed=self.seed)
