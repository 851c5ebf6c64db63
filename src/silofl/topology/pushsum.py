"""PushSum mixing with de-bias weights (ProxyFL, Algorithm 1, lines 7–10).

Each client holds de-biased parameters θ and a weight w (initially 1); its *mass* is w·θ. A
sender keeps ``self_weight`` of its weight and splits the rest equally over its out-neighbours; a
receiver adds the masses it gets to the part it kept and divides by the summed weight. Total mass
and total weight are conserved when every message arrives; with ``self_weight = 0`` and one
in-neighbour, the received proxy replaces the local one (the paper's setting), with 0.5 it is
push-sum averaging.
"""

from __future__ import annotations

import torch


def share(weight: float, self_weight: float, n_out: int) -> tuple[float, float]:
    """(weight kept by the sender, weight carried by each outgoing message)."""
    if n_out == 0:
        return weight, 0.0
    return self_weight * weight, (1.0 - self_weight) * weight / n_out


def combine(
    own: dict[str, torch.Tensor], kept_weight: float, received: list[tuple[dict[str, torch.Tensor], float]]
) -> tuple[dict[str, torch.Tensor], float]:
    """New de-biased parameters and weight from the kept share and the received (θ_j, w_j) shares.

    If the total weight is zero (the client kept nothing and every message was lost or rejected),
    the client keeps ``own`` unchanged with weight 1 — its mass is not conserved, which is logged
    by the caller.
    """
    total = kept_weight + sum(w for _, w in received)
    if total <= 0.0:
        return {k: v.clone() for k, v in own.items()}, 1.0
    out = {}
    for k, v in own.items():
        acc = v.double() * kept_weight
        for params, w in received:
            acc = acc + params[k].double() * w
        out[k] = (acc / total).to(v.dtype)
    return out, total
