"""APFL, adaptive personalised federated learning (Deng, Kamani & Mahdavi, "Adaptive Personalized Federated
Learning", 2020), with example-level DP on the global model, the mixture on the outputs as FL4Health mixes
them.

Every site holds two models of the shared architecture (``proxy_model``) and a mixing weight α ∈ [0, 1]:

* the **global** model w, trained exactly as FedAvg's (DP-SGD on its own cross-entropy, one epoch of
  Poisson batches), uploaded, averaged by the server and replaced by its broadcast
  (:mod:`silofl.fl.exchange.centralized`). It is the only thing that leaves the site; its steps read
  neither the local model nor α, and the accountant counts exactly them: ε is FedAvg's.
* the **local** model v (started from the server's initial model) and α, trained every round — before the
  global model's DP steps, against the global model w^t the site holds then (the last broadcast, a DP
  release) — on the cross-entropy of the **mixture** m(x) = α·v(x) + (1 − α)·w^t(x) (logits; w^t fixed):
  as many steps as the global model's, Poisson batches drawn like its (the same rate, their own
  generator), plain Adam at ``private_lr`` for v, and for α a projected gradient step α ← clip(α −
  ``apfl_alpha_lr``·∂L/∂α, 0, 1) with ∂L/∂α = mean_i ⟨softmax(m(x_i)) − onehot(y_i), v(x_i) − w^t(x_i)⟩. α
  starts at ``apfl_alpha``.

v and α **never leave the site** and are trained without DP — like Ditto's personal model: they read the
site's data and w^t (a DP release), and nothing derived from them is sent, so the guarantee of what is
shared is DP-SGD's. Their figures are labelled non-private (released only if the site chooses,
``report_nonprivate``): ``combined_acc`` is the mixture's (the method's headline: the personalised model),
``private_acc`` the local model's alone, ``global_acc`` the DP global model's; ``apfl_alpha`` is reported
with every evaluation.

The mixture is exported as one model: the site writes ``client<k>_private`` (v), ``client<k>_global`` (w)
and ``client<k>_combined``, a combiner (:mod:`silofl.site.combine`'s format) with weight [α·I, (1 − α)·I]
over the parts' log-probabilities — α·log_softmax(v(x)) + (1 − α)·log_softmax(w(x)) differs from α·v(x) +
(1 − α)·w(x) by a constant per example, so its class probabilities are exactly the mixture's. ``silofl
predict`` / ``export`` load it with ``--model combined``; the run's own ``--combine`` therefore does not
apply to APFL.

With ``--secure-aggregation`` the server sees only the sum of the global models' moves
(:mod:`silofl.fl.exchange.secure_average`); with ``noise_placement: pooled`` only the noisy sum of the sites'
clipped full-batch gradients of the global model's own cross-entropy at w^t (:mod:`silofl.fl.exchange.pooled`;
the mixture never enters them): the global model is pooled FedAvg's, its ε pooled FedAvg's per threat, and v
and α still take their round against w^t at the site (:meth:`APFLSite.local_round`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from silofl.comm.messages import Message
from silofl.core.errors import ConfigError
from silofl.core.randomness import party_seeds
from silofl.fl.exchange.centralized import CentralSite
from silofl.fl.exchange.pooled import PooledSite
from silofl.fl.exchange.secure_average import SecureAveragingOptions, SecureCentralSite
from silofl.fl.methods.common import SiteClasses
from silofl.fl.methods.ditto import PersonalizedMethod
from silofl.fl.methods.fedprox import non_negative
from silofl.fl.options import AveragingOptions, SharedModelOptions, unit_interval
from silofl.fl.registry import register
from silofl.privacy.sampling import poisson_batch
from silofl.training.metrics import prefixed

APFL_FORMAT = "apfl"  # the combiner's mode in client<k>_combined.json


class APFLMixture(nn.Module):
    """α·local(x) + (1 − α)·global(x): APFL's personalised model as one module (logits)."""

    def __init__(self, local: nn.Module, global_: nn.Module, alpha: float):
        super().__init__()
        self.local, self.global_ = local, global_
        self.alpha = nn.Parameter(torch.tensor(float(alpha)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.alpha * self.local(x) + (1.0 - self.alpha) * self.global_(x)


def mixture_step(
    mix: APFLMixture, opt: torch.optim.Optimizer, xb: torch.Tensor, yb: torch.Tensor, alpha_lr: float
) -> float:
    """One APFL step of the local model and α on a batch: the mixture's mean cross-entropy with the global
    model fixed; v by ``opt``, α by a projected gradient step of ``alpha_lr``. Returns ∂L/∂α."""
    with torch.no_grad():
        g = mix.global_(xb)
    alpha = mix.alpha
    logits = alpha * mix.local(xb) + (1.0 - alpha) * g
    opt.zero_grad(set_to_none=True)
    alpha.grad = None
    F.cross_entropy(logits, yb).backward()
    assert alpha.grad is not None
    d_alpha = float(alpha.grad)
    opt.step()
    with torch.no_grad():
        alpha.sub_(alpha_lr * d_alpha).clamp_(0.0, 1.0)
    alpha.grad = None
    return d_alpha


@dataclass
class APFLOptions(SecureAveragingOptions, AveragingOptions, SharedModelOptions):
    """APFL: a DP global model (FedAvg) and a local model mixed with a learned α, kept at the site."""

    supports_pooled = True  # the global model's round is pooled FedAvg's; v and α stay local

    apfl_alpha: float = field(
        default=0.5,
        metadata={"help": "APFL: the local model's starting weight α in the mixture (in [0, 1])."},
    )
    apfl_alpha_lr: float = field(
        default=0.01, metadata={"help": "APFL: the learning rate of α (projected gradient steps, per site)."}
    )

    def validate(self, run: Any) -> None:
        super().validate(run)
        unit_interval("apfl_alpha", self.apfl_alpha)
        non_negative("apfl_alpha_lr", self.apfl_alpha_lr)
        if str(getattr(run, "combine", "none") or "none") != "none":
            raise ConfigError(
                "apfl saves its own mixture as the combined model (predict/export --model combined); "
                "--combine does not apply to it"
            )


class APFLSite(CentralSite):
    """FedAvg's DP site plus a local model and α mixed with the global model (see the module doc)."""

    mutual_learning_partner = False  # the local model trains in its own steps

    def __init__(self, *args: Any, alpha: float = 0.5, alpha_lr: float = 0.01, **kwargs: Any):
        super().__init__(*args, **kwargs)
        assert self.private is not None
        self.alpha_lr = float(alpha_lr)
        self.mixture = APFLMixture(self.private, self.shared, alpha)
        # the local model's batches: behind no guarantee (nothing of v or α leaves the site), so a seeded
        # generator — the run's fifth seed of this site in a research run, a fresh secret one otherwise
        self.local_sampler = torch.Generator().manual_seed(party_seeds(self.settings.seed, self.cid, 5)[4])

    @property
    def mix_weight(self) -> float:
        """The site's current α (the local model's weight in the mixture)."""
        return float(self.mixture.alpha.detach())

    def on_receive_global(self, msg: Message) -> Message:
        reply = super().on_receive_global(msg)
        if int(msg.meta["round"]) == 0 and not reply.meta.get("rejected") and self.private is not None:
            self.private.load_state_dict(self.shared.state_dict())  # v starts from the global model
        return reply

    def train(self, rnd: int) -> dict:
        """The local model's and α's round against the global model held now, then the global model's DP
        round."""
        if self.budget is not None:  # nothing trains in a round the budget cannot pay for
            self.budget.require(self.settings.noise_multiplier, self.sample_rate, self.steps_per_round)
        self.local_round(rnd)
        return super().train(rnd)

    def local_round(self, rnd: int) -> None:
        """The local model's and α's non-DP round against the global model held now (with pooled noise the
        only training at the site: the global model's step is the server's)."""
        assert self.private_opt is not None
        self.private.train()  # type: ignore[union-attr]
        was = self.shared.training
        self.shared.eval()
        for _ in range(self.steps_per_round):
            idx = poisson_batch(self.n, self.sample_rate, self.local_sampler).to(self.x.device)
            if len(idx):
                mixture_step(self.mixture, self.private_opt, self.x[idx], self.y[idx], self.alpha_lr)
        self.shared.train(was)

    def evaluate(self, x: torch.Tensor, y: torch.Tensor, cache: dict | None = None) -> dict[str, float]:
        out = super().evaluate(x, y, cache)
        assert self.private is not None
        mixed = APFLMixture(self.private, self.released(), self.mix_weight)  # the global model as saved (EMA)
        out.update(prefixed("combined_acc", self.cached_scores(None, mixed, x, y, None)))
        return out

    def extra_metrics(self) -> dict:
        return {"apfl_alpha": self.mix_weight}

    def combiner(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight, bias) of the exported combiner: [α·I, (1 − α)·I] over [log p_local, log p_global], 0."""
        c = self.shared_spec.num_classes
        eye = torch.eye(c)
        return torch.cat([self.mix_weight * eye, (1.0 - self.mix_weight) * eye], 1), torch.zeros(c)

    def on_finish(self, msg: Message) -> Message:
        reply = super().on_finish(msg)
        if msg.meta.get("models_dir"):
            reply.meta["models"] = [
                *reply.meta.get("models", []),
                self.save_mixture(Path(msg.meta["models_dir"])),
            ]
        return reply

    def save_mixture(self, d: Path) -> str:
        """Write the mixture as ``client<k>_combined`` (:mod:`silofl.site.combine`'s format) under ``d``."""
        from safetensors.torch import save_file

        from silofl.site.combine import COMBINER_FORMAT

        weight, bias = self.combiner()
        p = d / f"client{self.cid}_combined"
        meta = {
            "format": COMBINER_FORMAT,
            "mode": APFL_FORMAT,
            "parts": ["private", "global"],
            "classes": int(weight.shape[0]),
            "alpha": self.mix_weight,
            "privacy": "non-private",
            "note": "APFL's personalised model: logits = weight · concat(log_softmax(part(x)) for part in "
            "parts) + bias with weight [α·I, (1 − α)·I] — the class probabilities of α·local(x) + "
            "(1 − α)·global(x). "
            "NOT differentially private: it contains the site's local model and α, trained without DP",
        }
        save_file(
            {"weight": weight.contiguous(), "bias": bias.contiguous()},
            str(p.with_suffix(".safetensors")),
            metadata={"combiner": json.dumps(meta)},
        )
        p.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
        return f"{d.name}/{p.name}.safetensors"

    def state_dict(self) -> dict:
        return {
            **super().state_dict(),
            "apfl_alpha": self.mixture.alpha.detach().clone(),
            "local_sampler": self.local_sampler.get_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if "apfl_alpha" in state:
            with torch.no_grad():
                self.mixture.alpha.copy_(state["apfl_alpha"])
            self.local_sampler.set_state(state["local_sampler"])


class SecureAPFLSite(APFLSite, SecureCentralSite):
    """An APFL site uploading only the masked encoding of its global model's move (secure aggregation)."""


class PooledAPFLSite(APFLSite, PooledSite):
    """An APFL site whose global model takes pooled noise; its local model and α train every round as
    without."""


@register(
    "apfl",
    options=APFLOptions,
    headline="combined_acc",
    exchange="server",
    metrics=("combined_acc", "private_acc", "global_acc"),
    description="DP global model (FedAvg) + a local model mixed with it by a learned α, kept at the client "
    "(mixture exported as the combined model)",
)
class APFL(PersonalizedMethod):
    opts: APFLOptions
    sites = SiteClasses(APFLSite, SecureAPFLSite, PooledAPFLSite)

    def site_options(self) -> dict[str, Any]:
        """The mixture weight α's start and learning rate."""
        return {"alpha": self.opts.apfl_alpha, "alpha_lr": self.opts.apfl_alpha_lr}
