"""``none``: the model reads the inputs as they are."""

from __future__ import annotations

from typing import Any

import torch

from silofl.features.base import FeatureStage
from silofl.features.registry import register


@register("none")
class NoFeatures(FeatureStage):
    budget_note = "no feature stage: the model reads the preprocessed inputs"

    @classmethod
    def from_config(cls, arg: str | None, cfg: Any) -> NoFeatures:
        return cls()

    @property
    def identity(self) -> bool:
        return True

    def spec(self) -> dict[str, Any]:
        return {"name": "none"}

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(input_shape)

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def describe(self) -> str:
        return "none (the preprocessed inputs)"

    def module(self, input_shape: tuple[int, ...]) -> torch.nn.Module:
        return torch.nn.Identity()
