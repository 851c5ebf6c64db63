"""``scatter``: kymatio's 2-D scattering transform, then a per-example GroupNorm without affine parameters.

Tramèr & Boneh ("Differentially Private Learning Needs Better Features (or Much More Data)", ICLR 2021) train
linear models and small CNNs with DP-SGD on ScatterNet features: ``Scattering2D(J=2, L=8)`` of a 28×28 grey
image gives 81 channels of 7×7; each example's channels are then normalised in 27 groups with no learned or
data-derived statistic (their ``GroupNorm(27, 81, affine=False)``). Colour images are scattered channel by
channel (C×81 channels). Both steps are fixed functions of one example: no budget is spent on them.

Groups: gcd(27, channels) — 27 for Tramèr & Boneh's 81 (grey) and 243 (colour) channels at J = 2, L = 8.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from silofl.core.errors import ConfigError
from silofl.features.base import FeatureStage
from silofl.features.registry import register

GROUPS = 27  # Tramèr & Boneh's num_groups for ScatterNet features (81 or 243 channels)


def scattering_channels(j: int, l: int) -> int:  # noqa: E741 - kymatio's name
    """Scattering channels per input channel, up to order 2: 1 + J·L + L²·J·(J−1)/2."""
    return 1 + j * l + l * l * j * (j - 1) // 2


def _kymatio_scattering(j: int, shape: tuple[int, int], l: int) -> nn.Module:  # noqa: E741
    try:  # the 2-D torch frontend alone: ``kymatio.torch`` also imports the 3-D one, which needs scipy < 1.15
        from kymatio.scattering2d.frontend.torch_frontend import ScatteringTorch2D
    except ImportError as e:  # pragma: no cover - kymatio is a dependency
        raise ConfigError(f"features 'scatter' need kymatio (pip install kymatio): {e}") from None
    try:
        return ScatteringTorch2D(J=j, shape=shape, L=l)
    except (RuntimeError, ValueError) as e:
        raise ConfigError(
            f"scattering J = {j} does not fit {shape[0]}×{shape[1]} images ({e}); use a smaller "
            "--set scatter_j"
        ) from None


class ScatterModule(nn.Module):
    """Scattering of each channel, then GroupNorm without affine parameters (a torch module)."""

    def __init__(self, input_shape: tuple[int, ...], j: int, l: int):  # noqa: E741
        super().__init__()
        c, h, w = input_shape
        self.scattering = _kymatio_scattering(j, (h, w), l)
        self.channels = c * scattering_channels(j, l)
        self.groups = math.gcd(GROUPS, self.channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.scattering(x.contiguous())  # N×C×K×H'×W'
        s = s.reshape(s.shape[0], -1, *s.shape[-2:])
        return F.group_norm(s, self.groups)


@register("scatter")
class ScatterFeatures(FeatureStage):
    # torch 2.13's ONNX exporter did not produce a graph of kymatio's complex FFTs here (the process ended
    # during "Optimize the ONNX graph"): `silofl export` writes a two-stage export instead
    in_onnx = False
    budget_note = (
        "a fixed transform of each example alone (kymatio's scattering with its predefined Morlet filters, "
        "then per-example normalisation with no learned or data-derived statistic): it reads no other "
        "example and no statistic of the data, so it releases nothing and costs no privacy budget"
    )

    def __init__(self, j: int = 2, l: int = 8):  # noqa: E741
        if not (isinstance(j, int) and j >= 1):
            raise ConfigError(f"scatter_j must be a whole number of at least 1, got {j!r}")
        if not (isinstance(l, int) and l >= 1):
            raise ConfigError(f"scatter_l must be a whole number of at least 1, got {l!r}")
        self.j, self.l = j, l
        self._modules: dict[tuple[int, ...], ScatterModule] = {}

    @classmethod
    def from_config(cls, arg: str | None, cfg: Any) -> ScatterFeatures:
        return cls(getattr(cfg, "scatter_j", 2), getattr(cfg, "scatter_l", 8))

    def spec(self) -> dict[str, Any]:
        import kymatio

        return {
            "name": "scatter",
            "J": self.j,
            "L": self.l,
            "groups": GROUPS,
            "norm": "group_norm, no affine",
            "library": f"kymatio {kymatio.__version__}",
        }

    def _check(self, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
        if len(input_shape) != 3:
            raise ConfigError(
                f"features 'scatter' apply to images (C×H×W), not inputs of shape {tuple(input_shape)} "
                "(table rows or bags): use --features none"
            )
        c, h, w = input_shape
        if min(h, w) < 2**self.j:
            raise ConfigError(
                f"scattering J = {self.j} needs images of at least {2**self.j}×{2**self.j} pixels, "
                f"got {h}×{w}: use a smaller --set scatter_j"
            )
        return c, h, w

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        c, h, w = self._check(input_shape)
        try:
            out = self.module_for((c, h, w))(torch.zeros(1, c, h, w))
        except (RuntimeError, ValueError) as e:  # e.g. GroupNorm over groups of one value on tiny images
            raise ConfigError(
                f"features 'scatter' (J = {self.j}, L = {self.l}) do not apply to {h}×{w} images: {e}; "
                "use a smaller --set scatter_j or --features none"
            ) from None
        return tuple(out.shape[1:])

    def module_for(self, input_shape: tuple[int, ...]) -> ScatterModule:
        """The stage as a module on inputs of ``input_shape`` (built once per shape)."""
        key = tuple(input_shape)
        if key not in self._modules:
            c, h, w = self._check(key)
            self._modules[key] = ScatterModule((c, h, w), self.j, self.l)
        return self._modules[key]

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        m = self.module_for(tuple(x.shape[1:]))
        with torch.no_grad():
            return m(x.float().cpu())

    def describe(self) -> str:
        return (
            f"ScatterNet: kymatio Scattering2D(J={self.j}, L={self.l}) of each image channel, then GroupNorm "
            f"without affine parameters (Tramèr & Boneh 2021)"
        )

    def value_bounds(self, input_shape: tuple[int, ...]) -> tuple[float, float]:
        """Public bounds of every feature value, whatever the data: after GroupNorm a group of n values has
        mean 0 and (biased) variance ≤ 1, so no value exceeds √(n − 1) in magnitude (for PubSub-ML's
        ``dp-nn``, whose inputs are clipped to declared bounds)."""
        c, h, w = self.output_shape(tuple(input_shape))
        n = (c // math.gcd(GROUPS, c)) * h * w
        b = math.sqrt(max(n - 1, 1))
        return -b, b

    def module(self, input_shape: tuple[int, ...]) -> nn.Module:
        return self.module_for(tuple(input_shape))
