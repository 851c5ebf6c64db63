"""Scoring models on held-out data: one model (:func:`accuracy`), or many at once (:func:`accuracies`).

Evaluation dominates a round when every site's models are scored on a 10 000-image test set every round (a
LeNet5 pass costs more than a whole ProxyFL training round on 2 cores). :func:`accuracies` scores every model
of one architecture in a single vectorised pass under ``torch.inference_mode``: for the conv nets the first
convolution (whose input all K models share) is one matmul over the input's patches with the K models' filters
side by side, every later convolution one grouped convolution in channels-last layout, each block max-pooled
before its bias and ReLU (exactly equal, and a quarter of the work), every linear layer one batched matmul
(``baddbmm``), in cache-sized chunks; MLPs one ``baddbmm`` per layer; any other architecture goes through
``torch.func.vmap`` of ``functional_call`` over the stacked weights. The predictions equal those of scoring
each model alone except where two logits of an example tie to within floating-point rounding (the batched
kernels sum in another order: logits agree to about 1e-6 relative); accuracies can then differ by such
examples only — none in the checks of ``tests/training/test_evaluation.py`` and ``bench/eval_round.py``.

:func:`scores` and :func:`all_scores` do the same passes and keep the logits: every classification metric of
:mod:`silofl.training.metrics` (accuracy — the same figure :func:`accuracy` gives —, AUROC, balanced accuracy,
macro F1, ECE) comes from that one forward pass per model.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
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


def accuracies(
    models: Sequence[nn.Module], x: torch.Tensor, y: torch.Tensor, batch_size: int = 1000, min_group: int = 2
) -> list[float]:
    """Top-1 accuracy of each model over (x, y): models of one architecture in one vectorised pass (see the
    module doc), any other (or a group smaller than ``min_group``) alone with :func:`accuracy`."""
    return [
        float(a) for a in _by_architecture(models, x, y, batch_size, min_group, accuracy, _stacked_accuracies)
    ]


def _by_architecture(
    models: Sequence[nn.Module],
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int,
    min_group: int,
    alone: Callable,
    stacked: Callable,
) -> list:
    """``alone(model, x, y, batch_size)`` or, for each group of at least ``min_group`` models of one
    architecture (without mode-dependent layers), ``stacked(models, x, y, batch_size)`` in one pass; in the
    models' order."""
    out: list = [None] * len(models)
    groups: dict[tuple, list[int]] = {}
    for i, m in enumerate(models):
        groups.setdefault(signature(m), []).append(i)
    for idx in groups.values():
        ms = [models[i] for i in idx]
        if len(ms) < min_group or _has_mode_dependent_layers(ms[0]) or len(y) == 0:
            for i in idx:
                out[i] = alone(models[i], x, y, batch_size)
            continue
        for i, r in zip(idx, stacked(ms, x, y, batch_size), strict=True):
            out[i] = r
    return out


def _linear_stack(layers: Sequence[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor]:
    """(K, in, out) weights transposed for ``baddbmm`` and (K, 1, out) biases of K same-shaped Linear
    layers."""
    return (
        torch.stack([m.weight for m in layers]).transpose(1, 2).contiguous(),
        torch.stack([m.bias for m in layers]).unsqueeze(1),
    )


def _stacked_forward(models: Sequence[nn.Module]):
    """A function x ↦ (K, n, classes) logits of all K models, or None when the family has no stacked form.

    Conv nets (LeNet5, CNN1, CNN2): every convolution of the K models is one grouped convolution over the
    input repeated K times, in channels-last layout (oneDNN's fastest path on this CPU); fully connected
    layers (and MLPs) are one ``baddbmm`` each."""
    from silofl.models import MLP, _ConvNet

    k = len(models)
    ms: list[Any] = list(models)  # the family is checked below; its layers are read by name
    if isinstance(ms[0], _ConvNet) and type(ms[0]).forward is _ConvNet.forward:
        first = ms[0].convs[0]
        c_out, c_in, kh, kw = first.weight.shape
        # the first convolution reads the same input for every model: one matmul over its patches (im2col in
        # channels-last order) with the K models' filters side by side, (c_in·kh·kw, K·c_out)
        w_first = (
            torch.cat([m.convs[0].weight for m in ms]).reshape(k * c_out, c_in * kh * kw).t().contiguous()
        )
        biases = [torch.cat([m.convs[j].bias for m in ms]).view(1, -1, 1, 1) for j in range(len(ms[0].convs))]
        # the later ones: one grouped convolution (group = model), channels-last (oneDNN's fastest path here)
        w_rest = [
            torch.cat([m.convs[j].weight for m in ms]).contiguous(memory_format=torch.channels_last)
            for j in range(1, len(ms[0].convs))
        ]
        fcs = [_linear_stack([m.fcs[j] for m in ms]) for j in range(len(ms[0].fcs))]
        head = _linear_stack([m.out for m in ms])

        def block_end(h: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            # max-pool first, then bias and ReLU on a quarter of the values: max(relu(a + b)) = relu(max(a) +
            # b) exactly, as a ↦ relu(a + b) is monotone in floating point too
            return F.max_pool2d(h, 2).add_(b).relu_()

        def conv_forward(x: torch.Tensor) -> torch.Tensor:
            n, _, hh, ww = x.shape
            ho, wo = hh - kh + 1, ww - kw + 1
            patches = x.permute(0, 2, 3, 1).unfold(1, kh, 1).unfold(2, kw, 1)  # (n, ho, wo, c_in, kh, kw)
            h = (patches.reshape(n * ho * wo, c_in * kh * kw) @ w_first).view(n, ho, wo, k * c_out)
            h = block_end(h.permute(0, 3, 1, 2), biases[0])  # NCHW view of channels-last memory
            for w, b in zip(w_rest, biases[1:], strict=True):
                h = block_end(F.conv2d(h, w, groups=k), b)
            z = h.reshape(n, k, -1).transpose(0, 1)  # (K, n, features): each model's flatten(1)
            for w, b in fcs:
                z = torch.baddbmm(b, z, w).relu_()
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


_CONV_CHUNK_BYTES = (
    4 << 20
)  # the first convolution's output for all K models per chunk: cache-sized (measured best)


def _chunk(models: Sequence[nn.Module], x: torch.Tensor, batch_size: int) -> int:
    """Examples per vectorised pass: ``batch_size``, but for conv nets few enough that the K models'
    first-layer activations stay cache-sized (8 LeNet5 on 10 000 images, 2 threads: 0.47 s at 32 a pass, 0.95
    s at 1000)."""
    from silofl.models import _ConvNet

    if not isinstance(models[0], _ConvNet) or x.dim() != 4:
        return batch_size
    c_out, _, kh, kw = models[0].convs[0].weight.shape
    per_example = len(models) * int(c_out) * max(1, x.shape[2] - kh + 1) * max(1, x.shape[3] - kw + 1) * 4
    return max(16, min(batch_size, _CONV_CHUNK_BYTES // per_example))


@torch.inference_mode()
def _stacked_accuracies(
    models: Sequence[nn.Module], x: torch.Tensor, y: torch.Tensor, batch_size: int
) -> list[float]:
    forward = _stacked_forward(models) or _vmap_forward(models)
    correct = torch.zeros(len(models), dtype=torch.long, device=x.device)
    batch_size = _chunk(models, x, batch_size)
    for i in range(0, len(y), batch_size):
        pred = forward(x[i : i + batch_size]).argmax(-1)
        correct += (pred == y[i : i + batch_size]).sum(1)
    n = max(1, len(y))
    return [int(c) / n for c in correct]


# ------------------------------------------------------------------------------------------------ every
# metric
def metrics_of(logits: torch.Tensor, y: torch.Tensor) -> dict[str, float | None]:
    """Every figure of one model's outputs on targets ``y``: its task's own (a survival target: the C-index),
    else the classification metrics (:func:`silofl.training.metrics.classification_metrics`); None where
    undefined."""
    return _metrics(logits, y)


def _metrics(logits: torch.Tensor, y: torch.Tensor) -> dict[str, float | None]:
    from silofl.training.metrics import classification_metrics, finite_or_none
    from silofl.training.tasks import target_task

    own = target_task(y)  # a task with its own figures (a survival target: the C-index)
    if own is not None and own.scores is not None:
        return {k: finite_or_none(v) for k, v in own.scores(logits, y).items()}
    return {k: finite_or_none(v) for k, v in classification_metrics(logits, y).items()}


@torch.no_grad()
def scores(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1000
) -> dict[str, float | None]:
    """Every metric of :mod:`silofl.training.metrics` for one model over (x, y), from one pass in batches
    under no_grad, in eval mode: ``{acc, auroc, balanced_accuracy, f1, ece}`` (None where undefined). ``acc``
    equals :func:`accuracy`."""
    was_training = model.training
    model.eval()
    try:
        if y.dim() == 3:  # masks: segmentation metrics, reduced chunk by chunk (no image's logits are kept)
            return _segmentation_scores([model], x, y, batch_size)[0]
        if len(y) == 0:
            return _metrics(torch.zeros(0, 1, device=y.device), y)
        logits = torch.cat([model(x[i : i + batch_size]) for i in range(0, len(y), batch_size)])
    finally:
        model.train(was_training)
    return _metrics(logits, y)


def all_scores(
    models: Sequence[nn.Module], x: torch.Tensor, y: torch.Tensor, batch_size: int = 1000, min_group: int = 2
) -> list[dict[str, float | None]]:
    """:func:`scores` of each model over (x, y), grouped and vectorised as :func:`accuracies` does (its
    ``acc`` values are :func:`accuracies`' figures)."""
    return _by_architecture(models, x, y, batch_size, min_group, scores, _stacked_scores)


@torch.inference_mode()
def _stacked_scores(
    models: Sequence[nn.Module], x: torch.Tensor, y: torch.Tensor, batch_size: int
) -> list[dict[str, float | None]]:
    if y.dim() == 3:  # masks (silofl.training.segmentation): model by model (group_norm has no vmap rule for
        # every memory layout, and the per-pixel logits of K models at once would not be cache-sized anyway)
        return _segmentation_scores(models, x, y, batch_size)
    forward = _stacked_forward(models) or _vmap_forward(models)
    batch_size = _chunk(models, x, batch_size)
    logits = torch.cat(
        [forward(x[i : i + batch_size]) for i in range(0, len(y), batch_size)], dim=1
    )  # (K, n, C)
    return [_metrics(logits[j], y) for j in range(len(models))]


def _segmentation_scores(
    models: Sequence[nn.Module], x: torch.Tensor, y: torch.Tensor, batch_size: int, forward=None
) -> list[dict[str, float | None]]:
    """``{acc, dice, iou}`` (:mod:`silofl.training.segmentation`) of each model on (x, masks y): each chunk's
    (K, n, classes, H, W) logits — from ``forward`` over the stacked models, else model by model — reduced to
    per-image counts at once."""
    from silofl.training.metrics import finite_or_none
    from silofl.training.segmentation import metrics_from_counts, segmentation_counts

    counts: list[list[torch.Tensor]] = [[] for _ in models]
    step = max(1, min(batch_size, 64))  # images per pass: their logits are H·W times a classifier's
    with torch.no_grad():
        for i in range(0, len(y), step):
            xb, yb = x[i : i + step], y[i : i + step]
            outs = forward(xb) if forward is not None else [m(xb) for m in models]
            for j in range(len(models)):
                counts[j].append(segmentation_counts(outs[j], yb).cpu())
    pixels = int(y.shape[1] * y.shape[2])
    return [
        {
            k: finite_or_none(v)
            for k, v in metrics_from_counts(
                torch.cat(c) if c else torch.zeros(0, 2, dtype=torch.float64), pixels
            ).items()
        }
        for c in counts
    ]
