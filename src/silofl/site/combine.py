"""Combination at inference, at the site: the site's own non-DP model and the DP model(s) it holds, fused on
rows of its own that no model trained on (post-processing: no privacy budget).

With ``combine`` on (``weights`` | ``stack``; default ``none``) every site, before it is built, sets aside a
fraction ``combine_holdout`` of its own training rows (:func:`holdout_rows`: drawn once from the run's split
seed, which depends on no record; never the test split). **Every model of the site trains on the rest only**
— the DP models too, so their accountants count the rows they saw — and the held-out rows are read by the
combiner alone: a model's predictions on rows it trained on would be over-confident and the combiner would
trust it too much.

The parts, the site's own model first:

* ProxyFL, FML: the private model and the proxy / shared model;
* FedAvg, AvgPush, CWT, Regular, Joint and the client-level methods: a model of the shared architecture that
  the site trains on its own rows without DP (:class:`Combination` trains it once, when first needed, for
  ``combine_epochs`` epochs — default: the run's rounds, one epoch a round as going alone does), and the
  global / shared model. That model is never sent anywhere.

The combiner is one linear layer over the parts' log-probabilities, ``z = W·[log p_1(x), …, log p_k(x)] + b``
(:mod:`silofl.training.fusion`): ``weights`` — ``W = [w_1·I … w_k·I]``, ``b = 0``, w on the simplex in steps
of 0.05, chosen by held-out cross-entropy; ``stack`` — multinomial logistic regression on the
log-probabilities
(L2 ``combine_l2`` on W and b, L-BFGS). Both fits are class-balanced by default (``combine_balance``: every
class
of the held-out rows counts equally, scikit-learn's ``class_weight="balanced"``): a site whose rows are mostly
one
class (the benchmark's p_major split: 80 %) otherwise fits that mix as a prior, and on a balanced population
the
combination then only repeats the site's own model (ProxyFL, Fashion-MNIST, ε = 3: 0.230 / 0.234 unbalanced,
0.517 balanced, on the balanced test set); ``combine_balance: false`` fits the site's own class mix, for a
site
whose future cases come in that mix. It is refitted at every evaluation (the parts change every round) and
at the end; its accuracy is reported as ``combined_acc``, labelled **non-private** (it contains the site's
own model), so across processes it stays in the site's folder unless the site releases it. The final combiner
is written next to the run's models (``client<k>_combined.safetensors`` + ``.json``; the own model as
``client<k>_own``), which ``silofl predict`` / ``export`` load with ``--model combined``.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from silofl.core.errors import ConfigError
from silofl.models import ModelSpec, load_model
from silofl.training.fusion import Fusion, fit_fusion, fit_weights

if TYPE_CHECKING:
    from silofl.site.base import Site

COMBINE_MODES = ("none", "weights", "stack")
COMBINER_FORMAT = "silofl.combiner/1"
OWN = "own"  # the role of the own model a site without one trains for the combination


def holdout_rows(n: int, fraction: float, split_seed: int | None, site: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows the site trains on, rows kept for the combiner) of a site with ``n`` training rows: a random
    ``fraction`` (at least one row, at least one left), drawn from the split seed — which a run always sets
    and records: the draw depends on no record, so it is not secret and claims no amplification (a fresh draw
    only when called without one)."""
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"combine_holdout must lie in (0, 1), got {fraction}")
    k = int(round(fraction * n))
    if n < 2 or k < 1 or k >= n:
        raise ConfigError(
            f"combine_holdout {fraction:g} of site {site}'s {n} training rows leaves no rows to hold out "
            "or none to train on"
        )
    seed = [int(split_seed), 0xC0B1, site] if split_seed is not None else secrets.randbits(64)
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[k:]), np.sort(perm[:k])


@dataclass(frozen=True)
class CombineSettings:
    """How a site combines its models."""

    mode: str  # "weights" | "stack"
    epochs: int  # the own model's epochs (sites without a non-DP model)
    lr: float = 1e-3  # the own model's Adam learning rate
    batch_size: int = 64  # the own model's minibatch
    l2: float = 1e-2  # the stacker's L2 weight
    seed: int | None = None  # a research run's seed for the own model; None: secret randomness
    balance: bool = True  # weight the held-out rows so that every class counts equally (class-balanced fit)


def log_probs(model: nn.Module, x: torch.Tensor, batch_size: int = 1000) -> torch.Tensor:
    """``log_softmax(model(x))`` in eval mode, under no_grad (the model's mode is restored)."""
    was = model.training
    model.eval()
    with torch.no_grad():
        out = torch.cat(
            [F.log_softmax(model(x[i : i + batch_size]), dim=1) for i in range(0, len(x), batch_size)]
        )
    model.train(was)
    return out.float()


class Combination:
    """A site's combiner: its held-out rows, the own model it trains if it has none, the fitted linear
    layer."""

    def __init__(self, settings: CombineSettings, x_hold: torch.Tensor, y_hold: torch.Tensor):
        if settings.mode not in COMBINE_MODES[1:]:
            raise ConfigError(
                f"unknown combine mode {settings.mode!r}; choose one of: {', '.join(COMBINE_MODES)}"
            )
        self.settings = settings
        self.x_hold, self.y_hold = x_hold, y_hold
        self.own: tuple[nn.Module, ModelSpec] | None = None  # trained here when the site has no non-DP model
        self.roles: list[str] = []
        self.weight: torch.Tensor | None = None  # (C, k·C)
        self.bias: torch.Tensor | None = None  # (C,)
        self.mix: tuple[float, ...] | None = None  # "weights": the weight of each part

    # ------------------------------------------------------------------ the parts
    def parts(self, site: Site) -> list[tuple[str, nn.Module]]:
        """(role, model) of each part, the site's own non-DP model first."""
        models = site.final_models()
        own = site.own_model()
        if own is None:
            own_role, own_model = OWN, self.own_model(site, models)
        else:
            own_role = next(r for r, (m, _) in models.items() if m is own)
            own_model = own
        return [(own_role, own_model), *((r, m) for r, (m, _) in models.items() if m is not own_model)]

    def own_model(self, site: Site, models: dict[str, tuple[nn.Module, ModelSpec]]) -> nn.Module:
        """The site's own model of the shared architecture, trained without DP on its own training rows
        (once)."""
        if self.own is None:
            spec = next(iter(models.values()))[1]
            self.own = (train_own(spec, site.x, site.y, self.settings), spec)  # type: ignore[attr-defined]
        return self.own[0]

    # ------------------------------------------------------------------ fitting and scoring
    def fit(self, site: Site) -> None:
        """Fit the combiner on the held-out rows (and nothing else) with the site's current models."""
        parts = self.parts(site)
        self.roles = [r for r, _ in parts]
        logps = [log_probs(m, self.x_hold) for _, m in parts]
        self.weight, self.bias, self.mix = fit_combiner(
            logps, self.y_hold, self.settings.mode, self.settings.l2, self.settings.balance
        )

    def logits(self, site: Site, x: torch.Tensor) -> torch.Tensor:
        """The combined model's logits on x."""
        if self.weight is None or self.bias is None:
            raise ConfigError("the combiner has not been fitted")
        feats = torch.cat([log_probs(m, x) for _, m in self.parts(site)], 1)
        return feats @ self.weight.to(feats.device).T + self.bias.to(feats.device)

    def accuracy(self, site: Site, x: torch.Tensor, y: torch.Tensor) -> float:
        """The combined model's accuracy on (x, y)."""
        return float((self.logits(site, x).argmax(1) == y).float().mean()) if len(y) else 0.0

    def scores(self, site: Site, x: torch.Tensor, y: torch.Tensor) -> dict:
        """Every metric of the combined model on (x, y) from one pass (:mod:`silofl.training.metrics`);
        ``acc`` as :meth:`accuracy` gives it."""
        from silofl.training.metrics import classification_metrics, finite_or_none

        logits = self.logits(site, x)
        out: dict = {k: finite_or_none(v) for k, v in classification_metrics(logits, y).items()}
        out["acc"] = float((logits.argmax(1) == y).float().mean()) if len(y) else 0.0
        return out

    # ------------------------------------------------------------------ saving
    def save(self, site: Site, d: Path) -> list[str]:
        """Write the own model (if trained here) and the combiner under ``d``; the files written
        (``d.name/…``)."""
        from safetensors.torch import save_file

        from silofl.models import save_model

        self.fit(site)  # with the final models
        assert self.weight is not None and self.bias is not None
        written = []
        if self.own is not None:
            save_model(self.own[0], self.own[1], d / f"client{site.cid}_{OWN}")
            written.append(f"{d.name}/client{site.cid}_{OWN}.safetensors")
        p = d / f"client{site.cid}_combined"
        meta = {
            "format": COMBINER_FORMAT,
            "mode": self.settings.mode,
            "balance": self.settings.balance,
            "parts": self.roles,
            "classes": int(self.weight.shape[0]),
            "held_out_rows": len(self.y_hold),
            "mix": list(self.mix) if self.mix is not None else None,
            "privacy": "non-private",
            "note": "logits = weight · concat(log_softmax(part(x)) for part in parts) + bias; the parts are "
            "this "
            "site's files client<k>_<part>; fitted on rows held out from the site's own training rows. "
            "NOT differentially private: it contains the site's own model, trained without DP",
        }
        save_file(
            {"weight": self.weight.contiguous(), "bias": self.bias.contiguous()},
            str(p.with_suffix(".safetensors")),
            metadata={"combiner": json.dumps(meta)},
        )
        p.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
        written.append(f"{d.name}/{p.name}.safetensors")
        return written


def balanced_weights(y: torch.Tensor, c: int) -> torch.Tensor:
    """Each class's weight so that every class present in ``y`` counts equally: n / (classes present ·
    count)."""
    counts = torch.bincount(y, minlength=c).double()
    present = int((counts > 0).sum())
    return torch.where(counts > 0, len(y) / (present * counts.clamp_min(1)), torch.zeros_like(counts)).float()


def fit_combiner(
    logps: list[torch.Tensor], y: torch.Tensor, mode: str, l2: float = 1e-2, balance: bool = False
) -> tuple[torch.Tensor, torch.Tensor, tuple[float, ...] | None]:
    """(weight (C, k·C), bias (C,), the mix of ``weights``) of the combiner fitted on the parts' held-out
    log-probabilities ``logps`` and labels ``y``; with ``balance`` every class of ``y`` counts equally."""
    c = logps[0].shape[1]
    y = y.long().cpu()
    logps = [lp.cpu() for lp in logps]
    cw = balanced_weights(y, c) if balance else None
    if mode == "weights":
        mix = fit_weights(logps, y, class_weight=cw)
        weight = torch.cat([w * torch.eye(c) for w in mix], 1)
        return weight, torch.zeros(c), mix
    if mode == "stack":
        feats = torch.cat(logps, 1)
        with torch.random.fork_rng(
            devices=[]
        ):  # nothing is drawn, but keep the run's streams untouched anyway
            fusion = Fusion(feats.shape[1], c, len(logps), 0, "classification", start="zero")
        fit_fusion(
            fusion,
            feats,
            y,
            "classification",
            weight_decay=l2,
            epochs=500,
            tolerance_grad=1e-7,
            tolerance_change=1e-12,
            class_weight=cw,
        )
        return fusion.linear.weight.detach().clone(), fusion.linear.bias.detach().clone(), None
    raise ConfigError(f"unknown combine mode {mode!r}; choose one of: {', '.join(COMBINE_MODES)}")


def train_own(spec: ModelSpec, x: torch.Tensor, y: torch.Tensor, s: CombineSettings) -> nn.Module:
    """A model of ``spec`` trained on (x, y) without DP: ``s.epochs`` epochs of shuffled minibatches, Adam.
    Its randomness comes from ``s.seed`` (secret without one) and leaves the run's random streams
    untouched."""
    seed = s.seed if s.seed is not None else secrets.randbits(63)
    with torch.random.fork_rng(devices=[x.device] if x.device.type == "cuda" else []):
        torch.manual_seed(seed)
        model = spec.build().to(x.device)
        opt = torch.optim.Adam(model.parameters(), lr=s.lr)
        gen = torch.Generator().manual_seed(seed)
        model.train()
        bs = max(1, min(s.batch_size, len(y)))
        for _ in range(s.epochs):
            perm = torch.randperm(len(y), generator=gen).to(x.device)
            for i in range(0, len(y) - bs + 1, bs):
                idx = perm[i : i + bs]
                opt.zero_grad()
                F.cross_entropy(model(x[idx]), y[idx]).backward()
                opt.step()
    return model.eval()


def combination_for(
    cfg, k: int, x: torch.Tensor, y: torch.Tensor, batch_size: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, Combination | None]:
    """(the rows site ``k`` trains on, their labels, its Combination) under ``cfg``'s ``combine`` options: the
    site's rows unchanged and None when combination is off. ``batch_size``: the run's planned batch size
    (default: ``cfg``'s)."""
    mode = getattr(cfg, "combine", "none")
    if mode == "none":
        return x, y, None
    keep, held = holdout_rows(len(y), cfg.combine_holdout, cfg.data_seed, k)
    keep_t, held_t = torch.as_tensor(keep, device=y.device), torch.as_tensor(held, device=y.device)
    seed = None if cfg.seed is None else int(cfg.seed) * 1009 + k
    own_lr = (
        getattr(cfg.options, "private_lr", None) or getattr(cfg.options, "lr", None) or 1e-3
    )  # the non-DP models'
    settings = CombineSettings(
        mode=mode,
        epochs=cfg.combine_epochs or cfg.rounds,
        lr=float(own_lr),
        batch_size=int((batch_size if batch_size is not None else cfg.batch_size) or 64),
        l2=cfg.combine_l2,
        seed=seed,
        balance=bool(cfg.combine_balance),
    )
    return x[keep_t], y[keep_t], Combination(settings, x[held_t], y[held_t])


class Combined(nn.Module):
    """A site's combined model (:mod:`silofl.site.combine`): ``weight · concat(log_softmax(part(x))) +
    bias``."""

    def __init__(self, parts: list[nn.Module], roles: list[str], weight: torch.Tensor, bias: torch.Tensor):
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.roles = roles
        self.combiner = nn.Linear(weight.shape[1], weight.shape[0])
        with torch.no_grad():
            self.combiner.weight.copy_(weight)
            self.combiner.bias.copy_(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.combiner(torch.cat([torch.log_softmax(m(x), dim=1) for m in self.parts], 1))


def load_combined(d: Path, client: int) -> tuple[Combined, ModelSpec]:
    """Client ``client``'s combined model from ``d`` (the combiner's safetensors + JSON and its parts' files),
    and the spec of its first part (input shape and classes)."""
    from safetensors.torch import load_file

    p = d / f"client{client}_combined"
    try:
        meta = json.loads(p.with_suffix(".json").read_text())
        tensors = load_file(str(p.with_suffix(".safetensors")))
    except (OSError, ValueError, RuntimeError) as e:
        raise ConfigError(f"cannot read the combiner {p}: {e}") from None
    roles = meta.get("parts") if isinstance(meta, dict) else None
    if (
        not isinstance(meta, dict)
        or meta.get("format") != COMBINER_FORMAT
        or not isinstance(roles, list)
        or not roles
        or not all(isinstance(r, str) and r.isidentifier() for r in roles)
    ):
        raise ConfigError(f"{p.with_suffix('.json')} is not a silofl combiner ({COMBINER_FORMAT})")
    loaded = [load_model(d / f"client{client}_{r}") for r in roles]
    specs = [s for _, s in loaded]
    c = specs[0].num_classes
    w, b = tensors.get("weight"), tensors.get("bias")
    if (
        any(tuple(s.input_shape) != tuple(specs[0].input_shape) or s.num_classes != c for s in specs)
        or w is None
        or b is None
        or tuple(w.shape) != (c, c * len(roles))
        or tuple(b.shape) != (c,)
        or not bool(torch.isfinite(w).all() and torch.isfinite(b).all())
    ):
        raise ConfigError(f"the combiner {p} does not fit its parts {roles}")
    return Combined([m for m, _ in loaded], roles, w.float(), b.float()), specs[0]
