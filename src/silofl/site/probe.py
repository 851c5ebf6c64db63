"""Received models tried on a probe batch of the site's own data, many in one pass.

A site refuses a received model whose outputs on its first examples are not finite and bounded
(:meth:`silofl.site.dpsgd.DPSGDSite.probe`). A site of a complete graph receives K − 1 models a round;
trying each one alone costs a Python-level module call per model, K² per round for the K sites. Models of
one architecture are tried together: their weights stacked, one :func:`torch.func.vmap` over
:func:`torch.func.functional_call` of the scratch model (no weight is copied into it). A model whose
operations vmap cannot batch is tried one model at a time, with the same verdicts.
"""

from __future__ import annotations

import torch
from torch.func import functional_call, vmap


def bounded(out: torch.Tensor, max_output: float) -> torch.Tensor:
    """Per leading index: all finite and no larger in magnitude than ``max_output``."""
    flat = out.reshape(out.shape[0], -1)
    return torch.isfinite(flat).all(1) & (flat.abs().amax(1) <= max_output)


def probe_many(
    model: torch.nn.Module, states: list[dict[str, torch.Tensor]], x: torch.Tensor, max_output: float
) -> list[bool]:
    """Whether ``model`` with each of ``states`` (weights of its architecture, already checked against it)
    gives finite outputs bounded by ``max_output`` on ``x``; ``model`` is not modified."""
    if not states:
        return []
    with torch.no_grad():
        if len(states) > 1:
            try:
                stacked = {k: torch.stack([s[k] for s in states]) for k in states[0]}
                out = vmap(lambda p: functional_call(model, p, (x,), strict=True))(stacked)
                return [bool(v) for v in bounded(out, max_output)]
            except (RuntimeError, ValueError, TypeError, NotImplementedError):  # an op vmap cannot batch
                pass
        return [
            bool(bounded(functional_call(model, s, (x,), strict=True).unsqueeze(0), max_output)[0])
            for s in states
        ]
