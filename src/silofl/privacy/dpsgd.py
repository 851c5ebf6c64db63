"""DP-SGD's gradient: clip each example's gradient to C, sum, add N(0, σ²C²), divide by the
*expected* batch size q·n (Opacus' convention for Poisson sampling).

:class:`DPGradient` writes that gradient into ``p.grad`` of every trainable parameter; the caller's
optimizer then steps as usual (Adam's moments and weight decay are post-processing of DP
gradients). An empty Poisson batch still produces a noise-only gradient — and is a step the
accountant must count. The mechanism counts the steps it ran and reports them
(:meth:`DPGradient.take_run`): accountants are fed from that report, not from a configured number.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from silofl.core.errors import NonFiniteValue
from silofl.privacy.accountant import MechanismRun
from silofl.privacy.grad_sample import GhostClipper, GhostUnsupported, LossFn, VmapClipper, make_clipper
from silofl.privacy.noise import NoiseSource


@dataclass
class StepStats:
    batch_size: int
    mean_norm: float
    clipped_fraction: float


class DPGradient:
    """The DP-SGD gradient of one model: clip, sum, noise, divide (see the module doc)."""

    def __init__(
        self,
        model: nn.Module,
        clip: float,
        noise_multiplier: float,
        expected_batch_size: float,
        noise: NoiseSource,
        backend: str = "auto",
        *,
        sample_rate: float,
    ):
        self.model = model
        self.sample_rate = float(sample_rate)
        self._steps = 0  # steps run since the last take_run()
        self.clip = float(clip)
        self.noise_multiplier = float(noise_multiplier)
        self.expected_batch_size = float(expected_batch_size)
        self.noise = noise
        self.backend = backend
        self.clipper = make_clipper(model, backend)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self._names = {id(p): n for n, p in model.named_parameters()}
        # research hook (auditing.gradient): canary gradients sampled and added to the clipped sum before the
        # noise, like examples; None (the default) leaves the mechanism untouched
        self.canaries: CanaryHook | None = None
        # person-level DP (silofl.privacy.person): every step must say each row's person (``groups``); the
        # sample rate and expected batch size are then over persons
        self.person_level = False
        # the parameters a step updates, when not all (FedRep's phases, silofl.fl.methods.fedrep): only
        # their per-example gradient is clipped to C and noised; the others' p.grad is None (not released,
        # not moved). Each step is still one Gaussian mechanism of sensitivity C and noise σC: the
        # accountant's count holds
        self.only: list[nn.Parameter] | None = None

    def take_run(self) -> MechanismRun:
        """The steps this mechanism ran since the last call, with its (σ, q); the count restarts."""
        run = MechanismRun(self.noise_multiplier, self.sample_rate, self._steps)
        self._steps = 0
        return run

    @property
    def backend_name(self) -> str:
        """The per-example gradient backend in use: ``ghost`` or ``vmap``."""
        return "ghost" if isinstance(self.clipper, GhostClipper) else "vmap"

    def compute(
        self,
        x: torch.Tensor,
        loss_fn: LossFn,
        *extras: torch.Tensor,
        views: int = 1,
        groups: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, StepStats]:
        """Set ``p.grad`` to the DP gradient of Σ_i loss_fn(model(x), *extras)_i; return the logits. ``views``
        > 1 (augmentation multiplicity): ``x`` holds that many consecutive augmented views of each of the B
        examples of ``extras``; example i's loss is the mean over its views, so its clipped gradient — the
        sensitivity — is still at most C. ``groups`` (person-level DP): each row's person 0 … b−1 among the
        batch's b persons; a person's rows' gradients are summed and clipped together, so one person moves the
        sum by at most C (the statistics are then per person)."""
        if views < 1 or x.shape[0] % views:
            raise ValueError(f"{x.shape[0]} inputs are not {views} views of each example")
        if self.person_level and groups is None:
            raise ValueError("a person-level DP step needs each row's person (groups)")
        if groups is not None and (views != 1 or len(groups) != x.shape[0]):
            raise ValueError("groups gives one person per row (one view each)")
        B = x.shape[0] // views
        if B == 0:
            grads, sq = {}, torch.zeros(0)
            with torch.no_grad():
                logits = self.model(x) if x.dim() > 1 else torch.zeros(0)
        else:
            kw: dict = {} if groups is None else {"groups": groups}
            if self.only is not None:
                kw["only"] = frozenset(id(p) for p in self.only)
            try:
                logits, grads, sq = self.clipper.clipped_sum(x, loss_fn, extras, self.clip, views, **kw)
            except GhostUnsupported:
                if self.backend == "ghost":
                    raise
                self.clipper.close()
                self.clipper = VmapClipper(self.model)
                logits, grads, sq = self.clipper.clipped_sum(x, loss_fn, extras, self.clip, views, **kw)
            B = len(sq)
        released = self.params
        if self.only is not None:
            chosen = {id(p) for p in self.only}
            released = [p for p in self.params if id(p) in chosen]
            for p in self.params:
                if id(p) not in chosen:
                    p.grad = None
        if self.canaries is not None:
            grads = self.canaries.add(grads, released, self.clip)
        std = self.noise_multiplier * self.clip
        for p in released:
            g = grads.get(p)
            total = self.noise.normal(tuple(p.shape), std, dtype=p.dtype)
            if g is not None:
                total = total.to(g.device).add_(g.detach())
            p.grad = total.div_(self.expected_batch_size)
        require_finite(
            (f"the noised DP gradient of {self._names.get(id(p), 'a parameter')}", p.grad) for p in released
        )
        self._steps += 1
        norms = sq.clamp(min=0.0).sqrt()
        stats = StepStats(
            batch_size=B,
            mean_norm=float(norms.mean()) if B else 0.0,
            clipped_fraction=float((norms > self.clip).float().mean()) if B else 0.0,
        )
        return logits, stats


def require_finite(named: Iterable[tuple[str, torch.Tensor | None]]) -> None:
    """Raise NonFiniteValue naming the first of the (what, tensor) pairs holding a NaN or an infinity (one
    synchronisation for all of them): a site's run stops there, never trains on or reports a NaN model."""
    pairs = [(what, t) for what, t in named if t is not None and t.is_floating_point() and t.numel()]
    if not pairs or bool(torch.stack([torch.isfinite(t).all() for _, t in pairs]).all()):
        return
    what = next(w for w, t in pairs if not bool(torch.isfinite(t).all()))
    raise NonFiniteValue(
        f"{what} is not finite (NaN or infinite): the site stops its run rather than train on or report it"
    )


class CanaryHook(Protocol):
    """An audit's canary gradients (:mod:`silofl.auditing.gradient`): each step, the sampled ones, each of
    norm at most
    ``clip``, added to the clipped per-example sum (returned: a dict over ``params``) before the noise."""

    def add(self, grads: dict, params: list[nn.Parameter], clip: float) -> dict:
        """``grads`` with this step's sampled canary gradients added (each of norm at most ``clip``)."""
        ...
