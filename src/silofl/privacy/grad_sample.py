"""Per-example gradient norms and clipped gradient sums.

Two backends compute, for a batch of per-example losses L_i, the per-example gradient norms
‖∇L_i‖ and the clipped sum Σ_i c_i ∇L_i with c_i = min(1, C / (‖∇L_i‖ + 1e-6)) (Opacus' rule):

``ghost`` — no per-example gradients stored for Linear layers. A Linear layer's per-example weight
gradient is the outer product g_i a_iᵀ of the output gradient and the input, so
‖∇W_i‖² + ‖∇b_i‖² = ‖g_i‖² (‖a_i‖² + 1); the clipped sum is (c ⊙ g)ᵀ a, one matmul. Conv2d layers
use the same identity on unfolded patches U_i: the per-example gradient g_i U_iᵀ is formed when it
is smaller than the L×L Gram matrices, else its norm is Σ (U_iᵀU_i) ⊙ (g_iᵀg_i) ("ghost norm").
Only the gradients w.r.t. layer *outputs* are requested from autograd, so the usual weight gradient
is never computed. GroupNorm's per-example gradients (C numbers per example) are formed directly.
Needs every parameter to live in a Linear, Conv2d (groups=1) or affine GroupNorm used once per
forward.

``vmap`` — ``torch.func.vmap(grad(...))`` per-example gradients for any architecture.

``auto`` picks ghost where it applies and falls back to vmap otherwise, including when the first
ghost step finds a layer reused or an output modified in place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from silofl.core.errors import ConfigError

LossFn = Callable[..., torch.Tensor]  # (logits, *extras) -> per-example losses, shape (B,)


class GhostUnsupported(Exception):
    pass


def clip_factors(sq_norms: torch.Tensor, clip: float) -> torch.Tensor:
    """Opacus' per-example clip factors min(1, C / (‖g‖ + 1e-6)) from squared norms, clamped at zero first: a
    person's squared norm summed over pairs of rows can dip below zero in float32 when the rows' gradients
    cancel, and its root would be NaN."""
    return (clip / (sq_norms.clamp(min=0.0).sqrt() + 1e-6)).clamp(max=1.0)


def _check_no_batchnorm(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            raise ConfigError(
                f"{type(m).__name__} mixes examples within a batch, so per-example clipping is undefined; "
                "use GroupNorm or LayerNorm in a DP-trained model"
            )


def ghost_support(model: nn.Module) -> str | None:
    """None if the ghost backend applies to ``model``, else the reason it does not."""
    for name, m in model.named_modules():
        own = [p for p in m.parameters(recurse=False)]
        if not own:
            continue
        if not all(p.requires_grad for p in own):
            return f"{name} has frozen parameters"
        if isinstance(m, nn.Linear):
            continue
        if (
            isinstance(m, nn.Conv2d)
            and m.groups == 1
            and m.padding_mode == "zeros"
            and not isinstance(m.padding, str)
        ):
            continue
        if isinstance(m, nn.GroupNorm) and m.affine:
            continue
        return f"{name} ({type(m).__name__}) has no per-layer norm rule"
    return None


class GhostClipper:
    """Per-layer norm trick for Linear/Conv2d models (see module doc)."""

    def __init__(self, model: nn.Module):
        _check_no_batchnorm(model)
        reason = ghost_support(model)
        if reason:
            raise GhostUnsupported(reason)
        self.model = model
        self.layers = [m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d, nn.GroupNorm))]
        self._records: list | None = None
        self._handles = [m.register_forward_hook(self._hook) for m in self.layers]

    def _hook(self, mod, inp, out):
        if self._records is not None:
            self._records.append((mod, inp[0].detach(), out, out._version))

    def close(self) -> None:
        """Remove the forward hooks."""
        for h in self._handles:
            h.remove()

    def clipped_sum(
        self,
        x: torch.Tensor,
        loss_fn: LossFn,
        extras: tuple,
        clip: float,
        views: int = 1,
        groups: torch.Tensor | None = None,
        only: frozenset[int] | None = None,
    ):
        """Forward + per-example norms + clipped gradient sum. Returns (logits, grads, sq_norms). ``only``:
        the ids of the parameters whose gradient is clipped and returned (None: all; the others' layers add
        nothing to the norm — a step that updates only those). ``views`` > 1: ``x`` holds that many
        consecutive views of each example (augmentation multiplicity); an example's loss is the mean of its
        views' and its gradient — the sum over views in every layer's identity — is clipped. ``groups``
        (person-level DP, :mod:`silofl.privacy.person`): each row's unit 0 … P−1; a unit's rows' gradients are
        summed and the sum clipped (sq_norms then has one entry per unit)."""
        if groups is not None:
            return self._grouped_sum(x, loss_fn, extras, clip, views, groups, only)
        self._records = []
        try:
            logits = self.model(x)
        finally:
            records, self._records = self._records, None
        records = _restricted(records, only)
        if views > 1:
            extras = tuple(e.repeat_interleave(views, 0) for e in extras)
        losses = loss_fn(logits, *extras)
        if views > 1:
            losses = losses.view(-1, views).mean(1)
        if len({id(r[0]) for r in records}) != len(records):
            raise GhostUnsupported("a layer ran more than once in one forward pass")
        if any(r[2]._version != r[3] for r in records):
            raise GhostUnsupported("a layer output was modified in place")
        outs = [r[2] for r in records]
        gouts = torch.autograd.grad(losses.sum(), outs, allow_unused=True)
        B = x.shape[0] // views
        sq = torch.zeros(B, dtype=logits.dtype, device=logits.device)
        prepared = []
        for (mod, a, z, _), g in zip(records, gouts, strict=True):
            if g is None:
                g = torch.zeros_like(z)
            rule = (
                _linear_norms
                if isinstance(mod, nn.Linear)
                else _conv_norms
                if isinstance(mod, nn.Conv2d)
                else _groupnorm_norms
            )
            n2, ctx = rule(mod, a, g, views)
            sq += n2
            prepared.append((mod, ctx))
        c = clip_factors(sq, clip)
        grads: dict[nn.Parameter, torch.Tensor] = {}
        for mod, ctx in prepared:
            w, b = ctx(c)
            grads[mod.weight] = w.view_as(mod.weight)
            if mod.bias is not None:
                grads[mod.bias] = b
        return logits.detach(), grads, sq

    def _grouped_sum(self, x, loss_fn, extras, clip, views, groups, only=None):
        """:meth:`clipped_sum` with per-unit clipping: Linear layers on 2-D inputs by the pair identity
        ‖Σ_{i∈p} g_i a_iᵀ‖² = Σ_{i,j∈p} (g_i·g_j)(a_i·a_j) (+ the bias term), GroupNorm by summing its rows'
        per-example gradients; anything else is left to the vmap backend (GhostUnsupported)."""
        from silofl.privacy.person import group_pairs

        if views != 1:
            raise GhostUnsupported("per-person clipping takes one view per row")
        self._records = []
        try:
            logits = self.model(x)
        finally:
            records, self._records = self._records, None
        if len({id(r[0]) for r in records}) != len(records):
            raise GhostUnsupported("a layer ran more than once in one forward pass")
        if any(r[2]._version != r[3] for r in records):
            raise GhostUnsupported("a layer output was modified in place")
        records = _restricted(records, only)
        if any(
            isinstance(r[0], nn.Conv2d) or (isinstance(r[0], nn.Linear) and r[1].dim() != 2) for r in records
        ):
            raise GhostUnsupported("per-person clipping by norms covers Linear layers on 2-D inputs")
        losses = loss_fn(logits, *extras)
        gouts = torch.autograd.grad(losses.sum(), [r[2] for r in records], allow_unused=True)
        P = int(groups.max()) + 1
        pi, pj = group_pairs(groups)
        gid = groups[pi]
        sq = torch.zeros(P, dtype=logits.dtype, device=logits.device)
        prepared = []
        for (mod, a, z, _), g in zip(records, gouts, strict=True):
            if g is None:
                g = torch.zeros_like(z)
            if isinstance(mod, nn.Linear):
                has_bias = mod.bias is not None
                # index_select: several times faster than advanced indexing on the CPU
                dots = (a.index_select(0, pi) * a.index_select(0, pj)).sum(1) + (1.0 if has_bias else 0.0)
                sq.index_add_(0, gid, dots * (g.index_select(0, pi) * g.index_select(0, pj)).sum(1))
                prepared.append((mod, "linear", (a, g)))
            else:  # GroupNorm: C numbers per row, summed per unit
                C = a.shape[1]
                xhat = F.group_norm(a, mod.num_groups, eps=mod.eps)
                gw = torch.zeros(P, C, dtype=g.dtype, device=g.device)
                gw.index_add_(0, groups, (g * xhat).reshape(a.shape[0], C, -1).sum(2))
                gb = torch.zeros(P, C, dtype=g.dtype, device=g.device)
                gb.index_add_(0, groups, g.reshape(a.shape[0], C, -1).sum(2))
                sq += gw.pow(2).sum(1) + gb.pow(2).sum(1)
                prepared.append((mod, "groupnorm", (gw, gb)))
        sq.clamp_(min=0.0)  # a sum over pairs of rows: its float32 rounding can dip below zero
        c = clip_factors(sq, clip)
        c_row = c[groups]
        grads: dict[nn.Parameter, torch.Tensor] = {}
        for mod, kind, (u, v) in prepared:
            weight, bias = cast(nn.Parameter, mod.weight), cast(nn.Parameter | None, mod.bias)
            if kind == "linear":
                gc = v * c_row[:, None]
                grads[weight] = (gc.t() @ u).view_as(weight)
                if bias is not None:
                    grads[bias] = gc.sum(0)
            else:
                grads[weight] = c @ u
                if bias is not None:
                    grads[bias] = c @ v
        return logits.detach(), grads, sq


def _restricted(records: list, only: frozenset[int] | None) -> list:
    """The forward records of the layers whose parameters are all in ``only`` (ids; None: every layer); a
    layer with some of its parameters in ``only`` and some not is refused (the vmap backend takes it)."""
    if only is None:
        return records
    out = []
    for r in records:
        ids = {id(p) for p in r[0].parameters(recurse=False)}
        if ids <= only:
            out.append(r)
        elif ids & only:
            raise GhostUnsupported("a layer's parameters are partly in the step's clipped set")
    return out


def _linear_norms(mod: nn.Linear, a: torch.Tensor, g: torch.Tensor, views: int = 1):
    B = a.shape[0] // views  # an example's views are its rows' consecutive blocks: a sequence of views
    has_bias = mod.bias is not None
    if a.dim() == 2 and views == 1:
        n2 = g.pow(2).sum(1) * (a.pow(2).sum(1) + (1.0 if has_bias else 0.0))

        def ctx2d(c):
            gc = g * c[:, None]
            return gc.t() @ a, (gc.sum(0) if has_bias else None)

        return n2, ctx2d
    a3, g3 = a.reshape(B, -1, a.shape[-1]), g.reshape(B, -1, g.shape[-1])
    T, din, dout = a3.shape[1], a3.shape[2], g3.shape[2]
    if T * T <= din * dout:
        n2 = (torch.bmm(a3, a3.transpose(1, 2)) * torch.bmm(g3, g3.transpose(1, 2))).sum((1, 2))
    else:
        n2 = torch.bmm(g3.transpose(1, 2), a3).pow(2).sum((1, 2))
    gsum = g3.sum(1)
    if has_bias:
        n2 = n2 + gsum.pow(2).sum(1)

    def ctx(c):
        gc = g3 * c[:, None, None]
        return gc.reshape(-1, dout).t() @ a3.reshape(-1, din), (
            (gsum * c[:, None]).sum(0) if has_bias else None
        )

    return n2, ctx


def _conv_norms(mod: nn.Conv2d, a: torch.Tensor, g: torch.Tensor, views: int = 1):
    B = a.shape[0] // views
    padding = cast(tuple[int, ...], mod.padding)  # ghost_support admits no string padding
    U = F.unfold(a, mod.kernel_size, dilation=mod.dilation, padding=padding, stride=mod.stride)  # B×D×L
    gg = g.reshape(a.shape[0], g.shape[1], -1)  # B×Cout×L
    if views > 1:  # an example's views side by side: its patches are all its views' patches
        U = U.view(B, views, U.shape[1], U.shape[2]).transpose(1, 2).reshape(B, U.shape[1], -1)
        gg = gg.view(B, views, gg.shape[1], gg.shape[2]).transpose(1, 2).reshape(B, gg.shape[1], -1)
    cout, D, L = gg.shape[1], U.shape[1], U.shape[2]
    has_bias = mod.bias is not None
    gsum = gg.sum(2)
    if cout * D <= L * L:
        G = torch.bmm(gg, U.transpose(1, 2))  # per-example weight gradients, B×Cout×D
        n2 = G.pow(2).sum((1, 2))

        def wsum(c):
            return (c @ G.reshape(B, -1)).view(cout, D)
    else:
        n2 = (torch.bmm(U.transpose(1, 2), U) * torch.bmm(gg.transpose(1, 2), gg)).sum((1, 2))

        def wsum(c):
            gc = gg * c[:, None, None]
            return gc.transpose(0, 1).reshape(cout, -1) @ U.transpose(1, 2).reshape(-1, D)

    if has_bias:
        n2 = n2 + gsum.pow(2).sum(1)

    def ctx(c):
        return wsum(c), (c @ gsum if has_bias else None)

    return n2, ctx


def _groupnorm_norms(mod: nn.GroupNorm, a: torch.Tensor, g: torch.Tensor, views: int = 1):
    """GroupNorm's per-example gradients are C numbers each: ∂w_c = Σ g·x̂ over the channel, ∂b_c = Σ g."""
    B, C = a.shape[0], a.shape[1]
    xhat = F.group_norm(a, mod.num_groups, eps=mod.eps)
    gw = (g * xhat).reshape(B, C, -1).sum(2)
    gb = g.reshape(B, C, -1).sum(2)
    if views > 1:  # summed over an example's views
        gw, gb = gw.view(-1, views, C).sum(1), gb.view(-1, views, C).sum(1)
    n2 = gw.pow(2).sum(1) + gb.pow(2).sum(1)

    def ctx(c):
        return c @ gw, c @ gb

    return n2, ctx


class VmapClipper:
    """Per-example gradients with torch.func for any architecture (no BatchNorm)."""

    def __init__(self, model: nn.Module):
        _check_no_batchnorm(model)
        self.model = model

    def close(self) -> None:
        """Nothing to release."""
        pass

    def per_example_grads(
        self,
        x: torch.Tensor,
        loss_fn: LossFn,
        extras: tuple,
        views: int = 1,
        only: frozenset[int] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Per-example gradients of the summed losses (torch.func vmap over grad); with ``views`` > 1 (``x``:
        that many consecutive views of each example) the gradient of the mean of an example's views'
        losses."""
        from torch.func import functional_call, grad, vmap

        params = {
            n: p.detach()
            for n, p in self.model.named_parameters()
            if p.requires_grad and (only is None or id(p) in only)
        }
        buffers = dict(self.model.named_buffers())
        if only is not None:  # the parameters outside ``only`` enter as constants (no gradient, no graph)
            buffers.update({n: p.detach() for n, p in self.model.named_parameters() if n not in params})
        if views > 1:

            def mean_of_views(prm, xi, *ex):
                out = functional_call(self.model, (prm, buffers), (xi,))
                return loss_fn(out, *[e.unsqueeze(0).expand(views, *e.shape) for e in ex]).mean()

            xs = x.reshape(x.shape[0] // views, views, *x.shape[1:])
            return vmap(grad(mean_of_views), in_dims=(None, 0, *([0] * len(extras))))(params, xs, *extras)

        def one(prm, xi, *ex):
            out = functional_call(self.model, (prm, buffers), (xi.unsqueeze(0),))
            return loss_fn(out, *[e.unsqueeze(0) for e in ex]).sum()

        return vmap(grad(one), in_dims=(None, 0, *([0] * len(extras))))(params, x, *extras)

    def clipped_sum(
        self,
        x: torch.Tensor,
        loss_fn: LossFn,
        extras: tuple,
        clip: float,
        views: int = 1,
        groups: torch.Tensor | None = None,
        only: frozenset[int] | None = None,
    ):
        """Forward + per-example norms + clipped gradient sum: (logits, grads, squared norms); ``views`` as in
        :meth:`per_example_grads`; ``groups`` and ``only`` as in :meth:`GhostClipper.clipped_sum` (each unit's
        rows' per-example gradients summed before the clip)."""
        per = self.per_example_grads(x, loss_fn, extras, views, only)
        if groups is not None:
            P = int(groups.max()) + 1
            per = {
                n: torch.zeros(P, *g.shape[1:], dtype=g.dtype, device=g.device).index_add_(0, groups, g)
                for n, g in per.items()
            }
        sq = cast(torch.Tensor, sum(g.reshape(g.shape[0], -1).pow(2).sum(1) for g in per.values()))
        c = clip_factors(sq, clip)
        named = dict(self.model.named_parameters())
        grads = {named[n]: torch.einsum("b,b...->...", c, g) for n, g in per.items()}
        with torch.no_grad():
            logits = self.model(x)
        return logits, grads, sq


def make_clipper(model: nn.Module, backend: str = "auto"):
    """The per-example clipper for a model: ghost norms where they apply, else vmap."""
    if backend not in ("auto", "ghost", "vmap"):
        raise ConfigError(f"unknown DP backend {backend!r}; choose auto, ghost or vmap")
    if backend == "vmap":
        return VmapClipper(model)
    try:
        return GhostClipper(model)
    except GhostUnsupported as e:
        if backend == "ghost":
            raise ConfigError(f"the ghost DP backend does not apply to this model: {e}") from None
        return VmapClipper(model)
