"""What a feature stage is: a fixed, per-example function of a site's inputs, applied before the model.

A stage maps a batch N×C×H×W to N×(its output shape). It must be a function of each example alone (no
statistic of the batch or of the data set, nothing learned from a site's private rows): then it is part of
the model's input pipeline, not a release, and costs no privacy budget. ``spec()`` identifies it exactly (the
cache key and the model card's record).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch


class FeatureStage:
    """Base class of feature stages (see the module doc)."""

    name: ClassVar[str] = "?"
    takes_argument: ClassVar[bool] = False
    # why it costs no budget (the model card and the threat model quote it)
    budget_note: ClassVar[str] = ""
    # whether `silofl export` puts the stage inside the ONNX graph (else a two-stage export: features by
    # silofl)
    in_onnx: ClassVar[bool] = True

    @classmethod
    def from_config(cls, arg: str | None, cfg: Any) -> FeatureStage:
        """The stage the config asks for (``arg``: what follows ``name:``)."""
        raise NotImplementedError

    @property
    def identity(self) -> bool:
        """Whether it leaves inputs unchanged (``none``)."""
        return False

    def spec(self) -> dict[str, Any]:
        """Plain JSON that identifies the stage exactly (name, parameters, library versions)."""
        raise NotImplementedError

    def check_run(self, cfg: Any) -> None:
        """ConfigError when the stage must not be used for this run (e.g. a backbone trained on rows it
        holds)."""

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of one example's features; ConfigError when the stage does not apply to
        ``input_shape``."""
        raise NotImplementedError

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        """Features of the batch ``x`` (N×input shape → N×output shape), each row from its own input only."""
        raise NotImplementedError

    def describe(self) -> str:
        """One sentence for the model card: what the features are."""
        raise NotImplementedError

    def module(self, input_shape: tuple[int, ...]) -> torch.nn.Module:
        """The stage as a torch module on inputs of ``input_shape`` (what ``predict`` and ``export`` put
        between the preprocessing and the model)."""
        raise NotImplementedError
