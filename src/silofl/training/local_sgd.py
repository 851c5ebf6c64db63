"""Local SGD of many copies of one model at once (the sub-clients of one site).

A site with v sub-clients trains v copies of the global model, each on its own disjoint shard,
starting from the same weights. Copies whose shards give the same number of batches per epoch are
stacked and trained together with ``torch.func.vmap`` over ``grad`` — one batched matmul per layer
instead of v small ones — with exactly the arithmetic of training them one by one (tested).
Each epoch reshuffles a shard and drops its last incomplete batch, so a copy takes
``epochs · ⌊n_j / B⌋`` steps of plain SGD on the mean cross-entropy of B examples — or, for a regression
target (floating-point ``y``, a model with one output), their mean squared error — plus, with ``prox_mu`` > 0,
FedProx's proximal term μ/2·‖w − w_start‖² (its gradient μ·(w − w_start) joins every step).
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap


def flat(params: dict[str, torch.Tensor]) -> torch.Tensor:
    """The tensors of a parameter dict concatenated into one flat vector."""
    return torch.cat([p.reshape(-1) for p in params.values()])


def unflat(vec: torch.Tensor, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A flat vector cut back into views shaped like ``like``."""
    out, i = {}, 0
    for k, p in like.items():
        out[k] = vec[i : i + p.numel()].view_as(p)
        i += p.numel()
    return out


def local_updates(
    model: nn.Module,
    start: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    shards: list[torch.Tensor],
    epochs: int,
    batch_size: int,
    lr: float,
    generator: torch.Generator,
    chunk: int = 64,
    prox_mu: float = 0.0,
) -> list[tuple[torch.Tensor, int]]:
    """(flat update w_j − w_start, steps taken) for each shard (an index tensor into x, y), in order.
    ``prox_mu``: FedProx's proximal weight μ (0: plain local SGD)."""
    buffers = {k: b for k, b in model.named_buffers()}
    regression = y.is_floating_point()
    from silofl.training.tasks import target_task

    own = target_task(y)  # a task with its own per-example loss (a survival target)

    def loss(params, xb, yb):
        out = functional_call(model, (params, buffers), (xb,))
        if own is not None and own.loss is not None:
            return own.loss(out, yb).mean()
        if yb.dim() == 3:  # masks: the mean per-image Dice + CE (silofl.training.segmentation)
            from silofl.training.segmentation import segmentation_loss

            return segmentation_loss(out, yb).mean()
        return F.mse_loss(out.squeeze(-1), yb) if regression else F.cross_entropy(out, yb)

    single_grad, step_grad = grad(loss), vmap(grad(loss))

    def batched_grad(params, xb, yb):  # one copy: skip vmap's batching overhead (same arithmetic)
        if xb.shape[0] == 1:
            return {
                k: g.unsqueeze(0)
                for k, g in single_grad({k: p[0] for k, p in params.items()}, xb[0], yb[0]).items()
            }
        return step_grad(params, xb, yb)

    results: list[tuple[torch.Tensor, int] | None] = [None] * len(shards)
    groups: dict[int, list[int]] = defaultdict(list)
    for j, s in enumerate(shards):
        if len(s) < batch_size:
            raise ValueError(f"shard {j} has {len(s)} examples, fewer than one batch of {batch_size}")
        groups[len(s) // batch_size].append(j)
    start_flat = flat(start)
    # permutations are drawn shard by shard in index order, so results do not depend on grouping
    perms = {
        j: [torch.randperm(len(shards[j]), generator=generator) for _ in range(epochs)]
        for j in range(len(shards))
    }
    for per_epoch, members in sorted(groups.items()):
        for c0 in range(0, len(members), chunk):
            ids = members[c0 : c0 + chunk]
            m = len(ids)
            params = {k: v.detach().unsqueeze(0).repeat(m, *([1] * v.dim())) for k, v in start.items()}
            for e in range(epochs):
                # [m, per_epoch, B] global indices of each copy's batches in this epoch
                idx = torch.stack(
                    [
                        shards[j][perms[j][e][: per_epoch * batch_size].to(shards[j].device)].view(
                            per_epoch, batch_size
                        )
                        for j in ids
                    ]
                )
                for step in range(per_epoch):
                    b = idx[:, step]
                    g = batched_grad(params, x[b], y[b])
                    for k in params:
                        if prox_mu:  # μ·(w − w_start), w_start the same for every copy
                            g[k] = g[k] + prox_mu * (params[k] - start[k].unsqueeze(0))
                        params[k].sub_(g[k], alpha=lr)
            for i, j in enumerate(ids):
                w = torch.cat([params[k][i].reshape(-1) for k in start])
                results[j] = (w - start_flat, epochs * per_epoch)
    return results  # type: ignore[return-value]
