"""Architectures of the papers' other experiments, written here (no torchvision):

* :class:`VGG` — a VGG-style CNN (Kvasir experiment): 3×3 conv blocks 32-32 / 64-64 / 128-128 with
  max-pooling, global average pooling, a 256-unit hidden layer.
* :class:`ResNet18` — ResNet-18 (BasicBlock ×[2, 2, 2, 2], widths 64…512) with GroupNorm instead of BatchNorm
  (BatchNorm mixes examples, so per-example clipping would be undefined); a 3×3 stride-1 stem for small
  images, a 7×7 stride-2 stem with max-pooling from 64 pixels up (histopathology patches).
* :class:`DeepSet` — a set / multiple-instance classifier (pan-cancer WSI experiment): an element-wise network
  φ on every instance, a masked mean over the bag, an MLP head ρ. Input is ``(B, M, d + 1)``: ``M`` padded
  instances of ``d`` features and a last column that is 1 for a real instance and 0 for padding.

All parameters live in Linear, Conv2d or GroupNorm layers, so DP-SGD's per-layer norms apply.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from silofl.core.errors import ConfigError


def _image_shape(name: str, input_shape) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise ConfigError(
            f"{name} needs image inputs (channels, height, width), got shape {tuple(input_shape)}"
        )
    return tuple(input_shape)


class VGG(nn.Module):
    def __init__(self, input_shape, num_classes, widths=((32, 32), (64, 64), (128, 128)), hidden: int = 256):
        super().__init__()
        c, h, w = _image_shape("vgg", input_shape)
        if min(h, w) < 2 ** len(widths):
            raise ConfigError(f"vgg needs inputs of at least {2 ** len(widths)} pixels per side, got {h}×{w}")
        self.convs = nn.ModuleList()
        for block in widths:
            for c_out in block:
                self.convs.append(nn.Conv2d(c, c_out, 3, padding=1))
                c = c_out
        self.block_sizes = [len(b) for b in widths]
        self.fc = nn.Linear(c, hidden)
        self.out = nn.Linear(hidden, num_classes)

    def forward(self, x):
        i = 0
        for n in self.block_sizes:
            for _ in range(n):
                x = F.relu(self.convs[i](x))
                i += 1
            x = F.max_pool2d(x, 2)
        x = x.mean((2, 3))
        return self.out(F.relu(self.fc(x)))


def _gn(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(min(32, channels), channels)


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.gn1 = _gn(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.gn2 = _gn(c_out)
        self.down = None
        if stride != 1 or c_in != c_out:
            self.down = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), _gn(c_out))

    def forward(self, x):
        out = F.relu(self.gn1(self.conv1(x)))
        out = self.gn2(self.conv2(out))
        skip = x if self.down is None else self.down(x)
        return F.relu(out + skip)  # no in-place ops: DP hooks read the layer outputs


class ResNet18(nn.Module):
    def __init__(self, input_shape, num_classes, widths=(64, 128, 256, 512)):
        super().__init__()
        c, h, w = _image_shape("resnet18", input_shape)
        self.large = min(h, w) >= 64
        if self.large:
            self.stem = nn.Conv2d(c, widths[0], 7, stride=2, padding=3, bias=False)
        else:
            self.stem = nn.Conv2d(c, widths[0], 3, stride=1, padding=1, bias=False)
        self.stem_gn = _gn(widths[0])
        blocks, c_in = [], widths[0]
        for i, c_out in enumerate(widths):
            stride = 1 if i == 0 else 2
            blocks += [BasicBlock(c_in, c_out, stride), BasicBlock(c_out, c_out, 1)]
            c_in = c_out
        self.blocks = nn.ModuleList(blocks)
        self.fc = nn.Linear(c_in, num_classes)

    def forward(self, x):
        x = F.relu(self.stem_gn(self.stem(x)))
        if self.large:
            x = F.max_pool2d(x, 3, stride=2, padding=1)
        for b in self.blocks:
            x = b(x)
        return self.fc(x.mean((2, 3)))


class DeepSet(nn.Module):
    def __init__(self, input_shape, num_classes, hidden: int = 128):
        super().__init__()
        if len(input_shape) != 2 or input_shape[1] < 2:
            raise ConfigError(
                f"deepset needs bag inputs (instances, features + 1 mask column), got shape "
                f"{tuple(input_shape)}"
            )
        d = input_shape[1] - 1
        self.phi1 = nn.Linear(d, hidden)
        self.phi2 = nn.Linear(hidden, hidden)
        self.rho1 = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, num_classes)

    def forward(self, x):
        feats, mask = x[..., :-1], x[..., -1:]
        h = F.relu(self.phi2(F.relu(self.phi1(feats))))
        pooled = (h * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return self.out(F.relu(self.rho1(pooled)))
