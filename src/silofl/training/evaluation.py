"""Scoring models on held-out data: one model (:func:`accuracy`), or many at once (:func:`accuracies`).

Evaluation dominates a round when every site's models are scored on a 10 000-image test set every round (a
LeNet5 pass costs more than a whole ProxyFL training round on 2 cores). :func:`accuracies` scores every model of
one architecture in a single vectorised pass under ``torch.inference_mode``: for the conv nets every convolution
of the K models is one grouped convolution in channels-last layout and every linear layer one batched matmul
(``baddbmm``); any other architecture goes through ``torch.func.vmap`` of ``functional_call`` over the stacked
weights. The
predictions equal those of scoring each model alone except where two logits of an example tie to within floating-
point rounding (the batched kernels sum in another order: logits agree to about 1e-6 relative); accuracies can
then differ by such examples only — none in the checks of ``tests/training/test_evaluation.py`` and
``bench/eval_round.py``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
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


def signature(model: nn.Module) -> tuple:
    """Models with equal signatures (class, parameter and buffer names, shapes, dtypes) can be stacked."""
    return (type(model), tuple((k, tuple(v.shape), v.dtype) for k, v in model.state_dict().items()))


def _has_mode_dependent_layers(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm | nn.Dropout) for m in model.modules())


def accuracies(models: Sequence[nn.Module], x: torch.Tensor, y: torch.Tensor, batch_size: int = 1000,
               min_group: int = 2) -> list[float]:
    """Top-1 accuracy of each model over (x, y): models of one architecture in one vectorised pass (see the module
    doc), any other (or a group smaller than ``min_group``) alone with :func:`accuracy`."""
    out: list[float | None] = [None] * len(models)
    groups: dict[tuple, list[int]] = {}
    for i, m in enumerate(models):
        groups.setdefault(signature(m), []).append(i)
    for idx in groups.values():
        ms = [models[i] for i in idx]
        if len(ms) < min_group or _has_mode_dependent_layers(ms[0]):
            for i in idx:
                out[i] = accuracy(models[i], x, y, batch_size)
            continue
        for i, acc in zip(idx, _stacked_accuracies(ms, x, y, batch_size), strict=True):
            out[i] = acc
    return [float(a) for a in out]  # type: ignore[arg-type]


def _linear_stack(layers: Sequence[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor]:
    """(K, in, out) weights transposed for ``baddbmm`` and (K, 1, out) biases of K same-shaped Linear layers."""
    return (torch.stack([m.weight for m in layers]).transpose(1, 2).contiguous(),
            torch.stack([m.bias for m in layers]).unsqueeze(1))


def _stacked_forward(models: Sequence[nn.Module]):
    """A function x ↦ (K, n, classes) logits of all K models, or None when the family has no stacked form.

    Conv nets (LeNet5, CNN1, CNN2): every convolution of the K models is one grouped convolution over the input
    repeated K times, in channels-last layout (oneDNN's fastest path on this CPU); fully connected layers (and MLPs)
    are one ``baddbmm`` each."""
    from silofl.models import MLP, _ConvNet

    k = len(models)
    ms: list[Any] = list(models)  # the family is checked below; its layers are read by name
    if isinstance(ms[0], _ConvNet) and type(ms[0]).forward is _ConvNet.forward:
        convs = [(torch.cat([m.convs[j].weight for m in ms]).contiguous(memory_format=torch.channels_last),
                  torch.cat([m.convs[j].bias for m in ms])) for j in range(len(ms[0].convs))]
        fcs = [_linear_stack([m.fcs[j] for m in ms]) for j in range(len(ms[0].fcs))]
        head = _linear_stack([m.out for m in ms])

        def conv_forward(x: torch.Tensor) -> torch.Tensor:
            h = x.repeat(1, k, 1, 1).contiguous(memory_format=torch.channels_last)
            for w, b in convs:
                h = F.max_pool2d(F.relu(F.conv2d(h, w, b, groups=k)), 2)
            n = h.shape[0]
            z = h.reshape(n, k, -1).transpose(0, 1)  # (K, n, features): each model's flatten(1)
            for w, b in fcs:
                z = F.relu(torch.baddbmm(b, z, w))
            return torch.baddbmm(head[1], z, head[0])

        return conv_forward
    if type(ms[0]).forward is MLP.forward:
        hidden = [_linear_stack([m.hidden[j] for m in ms]) for j in range(len(ms[0].hidden))]
        head = _linear_stack([m.out for m in ms])

        def mlp_forward(x: torch.Tensor) -> torch.Tensor:
            z = x.flatten(1).unsqueeze(0).expand(k, -1, -1)
            for w, b in hidden:
                z = F.relu(torch.baddbmm(b, z, w))
            return torch.baddbmm(head[1], z, head[0])

        return mlp_forward
    return None


def _vmap_forward(models: Sequence[nn.Module]):
    from torch.func import functional_call, stack_module_state, vmap

    params, buffers = stack_module_state(list(models))  # copies of the weights, stacked
    proto = copy.deepcopy(models[0]).to("meta").eval()

    def forward(p, b, xb):
        return functional_call(proto, (p, b), (xb,))

    batched = vmap(forward, in_dims=(0, 0, None))
    return lambda x: batched(params, buffers, x)


@torch.inference_mode()
def _stacked_accuracies(models: Sequence[nn.Module], x: torch.Tensor, y: torch.Tensor, batch_size: int) -> list[float]:
    forward = _stacked_forward(models) or _vmap_forward(models)
    correct = torch.zeros(len(models), dtype=torch.long, device=x.device)
    for i in range(0, len(y), batch_size):
        pred = forward(x[i : i + batch_size]).argmax(-1)
        correct += (pred == y[i : i + batch_size]).sum(1)
    n = max(1, len(y))
    return [int(c) / n for c in correct]
