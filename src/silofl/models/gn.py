"""``cnn-gn``: a small CNN with GroupNorm after each convolution — the normalisation layers FedBN keeps at
each site (:mod:`silofl.fl.methods.fedbn`), small enough for CPU tests on 8×8 digits.

GroupNorm normalises each example over groups of its own channels, so unlike BatchNorm it mixes no
examples and DP-SGD's per-example clipping stays defined (its affine parameters take the fast per-example
norm path).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from silofl.core.errors import ConfigError


class CNNGN(nn.Module):
    """A small CNN with GroupNorm: conv3×3 → 8, GroupNorm(4), relu, maxpool(2); conv3×3 → 16, GroupNorm(4),
    relu, maxpool(2); Linear → 64, relu; Linear → classes."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, channels=(8, 16), hidden: int = 64):
        super().__init__()
        if len(input_shape) != 3:
            raise ConfigError(
                "cnn-gn is a convolutional model for images (C×H×W); for inputs of shape "
                f"{tuple(input_shape)} use tabmlp, logreg or mlp"
            )
        c, h, w = input_shape
        if min(h, w) < 4:
            raise ConfigError(f"cnn-gn needs inputs of at least 4 pixels per side, got {h}×{w}")
        self.conv1 = nn.Conv2d(c, channels[0], 3, padding=1)
        self.norm1 = nn.GroupNorm(4, channels[0])
        self.conv2 = nn.Conv2d(channels[0], channels[1], 3, padding=1)
        self.norm2 = nn.GroupNorm(4, channels[1])
        self.fc = nn.Linear(channels[1] * (h // 4) * (w // 4), hidden)
        self.out = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.norm1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.norm2(self.conv2(x))), 2)
        return self.out(F.relu(self.fc(x.flatten(1))))
