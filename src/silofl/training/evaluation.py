"""Scoring models on held-out data."""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1000) -> float:
    """Top-1 accuracy over (x, y) in batches, under no_grad, in eval mode."""
    was_training = model.training
    model.eval()
    correct = 0
    for i in range(0, len(y), batch_size):
        correct += int((model(x[i : i + batch_size]).argmax(1) == y[i : i + batch_size]).sum())
    model.train(was_training)
    return correct / max(1, len(y))
