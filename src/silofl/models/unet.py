"""A small UNet for 2-D segmentation (Ronneberger et al. 2015) that DP-SGD can train.

Every layer with parameters is a ``Conv2d`` (3×3, zero padding 1, or the 1×1 head) or an affine ``GroupNorm``,
each used once per forward, so the per-layer norm trick (``dp_backend: ghost``) and per-example gradients of
any backend apply; BatchNorm would mix the images of a batch and make per-example clipping undefined.
Downsampling is max-pooling, upsampling nearest-neighbour interpolation to the skip connection's size (no
transposed convolution), so any input of at least 2^depth pixels a side works.

``unet``: widths 8 · 2^l at depth l = 0 … 3 (about 0.3 M parameters), small enough for CPU tests on 32×32 or
64×64 images; the seed paper trains a wider one on 256×256 prostate slices — build
``UNet(shape, 2, width=32)`` for that. The output is (n, num_classes, H, W) logits — a softmax head over
the classes: num_classes = 2 for a binary mask, C for label masks 0 … C−1
(:mod:`silofl.data.segmentation`; the loss and the metrics take the softmax / arg-max over them).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from silofl.core.errors import ConfigError


def _groups(channels: int) -> int:
    return next(g for g in (8, 4, 2, 1) if channels % g == 0 and channels // g >= 2) if channels > 1 else 1


class _Block(nn.Module):
    """(conv3×3 → GroupNorm → ReLU) × 2."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1)
        self.norm1 = nn.GroupNorm(_groups(c_out), c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1)
        self.norm2 = nn.GroupNorm(_groups(c_out), c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.norm1(self.conv1(x)))
        return F.relu(self.norm2(self.conv2(x)))


class UNet(nn.Module):
    """See the module doc."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, width: int = 8, depth: int = 3):
        super().__init__()
        if len(input_shape) != 3:
            raise ConfigError(f"unet segments images (C×H×W), got inputs of shape {tuple(input_shape)}")
        c, h, w = (int(s) for s in input_shape)
        if min(h, w) < 2**depth:
            raise ConfigError(f"unet (depth {depth}) needs at least {2**depth} pixels a side, got {h}×{w}")
        if num_classes < 2:
            raise ConfigError(f"unet needs at least 2 classes (background and foreground), got {num_classes}")
        widths = [width * 2**i for i in range(depth + 1)]
        self.down = nn.ModuleList()
        c_in = c
        for wd in widths:
            self.down.append(_Block(c_in, wd))
            c_in = wd
        self.up = nn.ModuleList(_Block(widths[i + 1] + widths[i], widths[i]) for i in reversed(range(depth)))
        self.head = nn.Conv2d(widths[0], num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for i, block in enumerate(self.down):
            if i > 0:
                x = F.max_pool2d(x, 2)
            x = block(x)
            skips.append(x)
        skips.pop()
        for block in self.up:
            skip = skips.pop()
            x = F.interpolate(x, size=skip.shape[-2:], mode="nearest")
            x = block(torch.cat([x, skip], 1))
        return self.head(x)
