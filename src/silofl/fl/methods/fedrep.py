"""FedRep (Collins et al., "Exploiting Shared Representations for Personalized Federated Learning", ICML
2021) with example-level DP: a shared body (the representation) averaged by the server, a head kept at
each site, and every round two phases — **first the head, then the body**.

Every site holds one model (``proxy_model``; the head is its last layer with parameters, the body
everything before it, as FedPer's: :func:`silofl.fl.methods.fedper.body_keys`). A round is the site's
usual K DP-SGD steps (one epoch, or ``local_steps``) of **one** mechanism — one clipper, one noise source,
one accountant — split in two phases: the first H = ⌊``fedrep_head_share``·K + ½⌋ steps (at most K − 1)
update only the head with the body fixed, the remaining K − H update only the body with the (new) head
fixed. The site then uploads only the body; the server averages the bodies
(:mod:`silofl.fl.exchange.centralized` with ``shared_keys``) and broadcasts the average, which each site
loads under its own head. The head never leaves the site.

Each step is one DP-SGD step of the phase's part of the model: every sampled example's gradient **of the
part the phase updates** (the head's parameters in the head phase, the body's in the body phase) is clipped
to C and the sum noised with N(0, σ²C²) (:attr:`silofl.privacy.DPGradient.only`); the frozen part's gradient
is neither computed into the clip nor released (``p.grad = None``: the optimizer does not move it). Each
step is therefore one Gaussian mechanism of sensitivity C and noise σC on what it releases — the same
per-step privacy loss as a whole-model step, so the accountant's count is exact. Hence:

* **the accountant counts every step of both phases** — K a round, exactly FedAvg's count, so a
  budget-first run's planned σ holds. The head phase must be DP too, although the head is never released:
  the body's steps read the head, and a head trained without DP is a function of the whole local data set,
  so replacing one example would change every term of the body's clipped sum through the head — the
  sensitivity would no longer be C (FedPer's argument, :mod:`silofl.fl.methods.fedper`). With both phases
  inside one DP-SGD mechanism, adaptive composition over all K steps covers every model the site computes,
  and sending the body is post-processing.
* the head phase clips the head's per-example gradient alone: the body's part, which the step would drop
  anyway, no longer shrinks the head's share of the clip budget C (nor does the head's shrink the body's in
  the body phase). Before, every step clipped the whole gradient and dropped the frozen part afterwards:
  the same ε, but the kept part was scaled down by the dropped part's norm.

``fedrep_head_share`` (default 0.2) sets the split; 0 leaves the head at its initial weights (only the body
learns). The paper trains the head for more local epochs than the body, which costs nothing without DP;
under DP every head step is a step of the budget, taken from the body's. Measured on digits (3 sites, 300
examples each, 5 steps a round, 5 rounds, MLP, privacy off): share 0.5 0.274, share 0.2 0.661, FedPer
0.669 — the body needs the steps, hence the default. The personalised model (shared body + own head,
``private_acc``) is a DP model.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from silofl.core.errors import ConfigError
from silofl.fl.methods.fedbn import stand_in
from silofl.fl.methods.fedper import PersonalHeadSite, SharedKeysMethod, head_keys
from silofl.fl.options import AveragingOptions, SharedModelOptions, unit_interval
from silofl.fl.registry import register


def head_steps(k: int, share: float) -> int:
    """The head phase's steps of a round of ``k`` DP steps: ⌊share·k + ½⌋, at most k − 1 (the body trains
    every round)."""
    return max(0, min(k - 1, math.floor(share * k + 0.5)))


@dataclass
class FedRepOptions(AveragingOptions, SharedModelOptions):
    """FedRep: one DP model per site; each round the head's steps, then the body's; the server averages the
    bodies."""

    fedrep_head_share: float = field(
        default=0.2,
        metadata={
            "help": "FedRep: the share of each round's DP steps that train the head (first; the rest train "
            "the body)."
        },
    )

    def validate(self, run: Any) -> None:
        super().validate(run)
        unit_interval("fedrep_head_share", self.fedrep_head_share, open_hi=True)
        model = stand_in(self.proxy_model)  # refused before any data is read: a model that is all head
        if model is not None and set(head_keys(model)) == set(model.state_dict()):
            raise ConfigError(
                f"FedRep shares a model's body and keeps its last layer; {self.proxy_model!r} has a single "
                "layer: choose a deeper proxy_model"
            )


class RepresentationSite(PersonalHeadSite):
    """A FedPer site whose round trains the head first, then the body, under one DP mechanism (module doc)."""

    def __init__(self, *args: Any, head_share: float = 0.5, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.head_share = float(head_share)
        shared = set(self.shared_keys)
        named = [(n, p) for n, p in self.shared.named_parameters() if p.requires_grad]
        self.head_params = [p for n, p in named if n not in shared]
        self.body_params = [p for n, p in named if n in shared]
        self.phases: list[str] = []  # the phase of every step of the last round (what the tests read)

    @property
    def head_steps(self) -> int:
        """This site's head-phase steps per round (:func:`head_steps` of its steps and share)."""
        return head_steps(self.steps_per_round, self.head_share)

    def shared_grad_hook(self) -> Callable[[], None] | None:
        n_head = self.head_steps
        self.phases = []

        def phase(step: int) -> list:  # the parameters step ``step`` of the round updates
            return self.head_params if step < n_head else self.body_params

        if self.dp is not None:  # the first step's clipped set (each hook sets the next step's)
            self.dp.only = phase(0)

        def hook() -> None:  # after the step's DP gradient is in p.grad, before the optimizer steps
            head = len(self.phases) < n_head
            for p in self.body_params if head else self.head_params:
                p.grad = None  # the frozen part: not released (DPGradient.only), the optimizer skips it
            self.phases.append("head" if head else "body")
            if self.dp is not None:
                self.dp.only = phase(len(self.phases))

        return hook


@register(
    "fedrep",
    options=FedRepOptions,
    headline="private_acc",
    exchange="server",
    metrics=("private_acc",),
    description="one DP model per client; each round its head's DP steps, then its body's; the server "
    "averages the bodies, each client keeps its head",
)
class FedRep(SharedKeysMethod):
    opts: FedRepOptions
    site_cls = RepresentationSite

    def site_options(self) -> dict[str, Any]:
        """The head phase's share of each round's DP steps."""
        return {"head_share": self.opts.fedrep_head_share}
