"""Ditto (Li et al., "Ditto: Fair and Robust Federated Learning Through Personalization", ICML 2021) with
example-level DP on the global model.

Every site holds two models of the shared architecture (``proxy_model``):

* the **global** model w, trained exactly as FedAvg's (DP-SGD on cross-entropy, one epoch of Poisson batches),
  uploaded, averaged by the server and replaced by its broadcast (:mod:`silofl.fl.exchange.centralized`). It
  is the only thing that leaves the site, and the accountant counts its DP-SGD steps: ε is FedAvg's.
* the **personal** model v, started from the server's initial model and then trained every round on the site's
  data with the objective F_k(v) + (λ/2)·‖v − w^t‖², w^t the global model the site received at the round's
  start: plain (non-DP) Adam at ``private_lr`` on the mean cross-entropy of batches drawn like the global
  model's (the same rate and number of steps, from their own generator), plus the gradient λ·(v − w^t).

The personal model **never leaves the site** — like ProxyFL's private model it is trained without DP, its
figures (``private_acc``) are labelled non-private and released only if the site chooses
(``report_nonprivate``), and it is saved in the site's own run folder. It reads w^t, a DP release, and the
site's own data; nothing derived from it is sent, so the guarantee of what is shared is DP-SGD's. λ → 0 is
each site alone (from a common start); large λ pulls v to the global model. The method is judged by the
personal models (``private_acc``); ``global_acc`` is the aggregate's.

With ``--secure-aggregation`` the server sees only the sum of the global models' moves
(:mod:`silofl.fl.exchange.secure_average`); with ``noise_placement: pooled`` only the noisy sum of the sites'
clipped full-batch gradients of the global model at w^t (:mod:`silofl.fl.exchange.pooled`): the global model
is pooled FedAvg's, its ε pooled FedAvg's per threat, and the personal model still takes its round towards
w^t at the site (:meth:`DittoSite.local_round`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from silofl.comm.messages import Message
from silofl.core.randomness import party_seeds
from silofl.fl.exchange.centralized import CentralSite
from silofl.fl.exchange.pooled import PooledSite
from silofl.fl.exchange.secure_average import SecureAveragingOptions, SecureCentralSite
from silofl.fl.methods.common import ServerAveraged, SiteClasses, spec
from silofl.fl.methods.fedprox import non_negative, proximal_hook, snapshot
from silofl.fl.options import AveragingOptions, SharedModelOptions, option
from silofl.fl.registry import register
from silofl.training import dml_loss, poisson_steps


@dataclass
class DittoOptions(SecureAveragingOptions, AveragingOptions, SharedModelOptions):
    """Ditto: a DP global model (FedAvg) and a personal model pulled towards it with weight λ."""

    supports_pooled = True  # the global model's round is pooled FedAvg's; the personal model stays local

    ditto_lambda: float = option(0.1, "Ditto: the personal model's pull λ towards the received global model.")

    def validate(self, run: Any) -> None:
        super().validate(run)
        non_negative("ditto_lambda", self.ditto_lambda)


def _ce(logits: torch.Tensor, y: torch.Tensor, _other: torch.Tensor) -> torch.Tensor:
    return dml_loss(logits, y, None, 0.0)


class DittoSite(CentralSite):
    """FedAvg's DP site plus a personal model (see the module doc)."""

    mutual_learning_partner = (
        False  # the personal model trains in its own steps, not on the DP model's batches
    )

    def __init__(self, *args: Any, ditto_lambda: float = 0.0, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.ditto_lambda = float(ditto_lambda)
        # the personal model's batches: not behind any guarantee (nothing of the personal model leaves the
        # site), so a seeded generator — the run's fifth seed of this site in a research run, a fresh secret
        # one otherwise
        self.personal_sampler = torch.Generator().manual_seed(_personal_seed(self.settings.seed, self.cid))

    def on_receive_global(self, msg: Message) -> Message:
        reply = super().on_receive_global(msg)
        if int(msg.meta["round"]) == 0 and not reply.meta.get("rejected") and self.private is not None:
            self.private.load_state_dict(
                self.shared.state_dict()
            )  # the personal model starts from the global one
        return reply

    def train(self, rnd: int) -> dict:
        """The global model's DP round, then the personal model's round towards the global model received."""
        _, anchor = snapshot(self.shared)  # w^t, before the DP round moves it
        stats = super().train(rnd)
        self.personal_round(anchor)
        return stats

    def local_round(self, rnd: int) -> None:
        """With pooled noise (the shared model is not trained here): the personal model's round towards the
        global model received."""
        self.personal_round(snapshot(self.shared)[1])

    def personal_round(self, anchor: list[torch.Tensor]) -> None:
        """The personal model's non-DP round: cross-entropy plus the pull λ·(v − ``anchor``)."""
        assert self.private is not None and self.private_opt is not None
        params = [p for p in self.private.parameters() if p.requires_grad]
        hook = proximal_hook(params, anchor, self.ditto_lambda) if self.ditto_lambda else None
        poisson_steps(
            self.private,
            self.private_opt,
            self.x,
            self.y,
            sample_rate=self.sample_rate,
            steps=self.steps_per_round,
            sampler=self.personal_sampler,
            loss_fn=_ce,
            grad_hook=hook,
        )

    def state_dict(self) -> dict:
        return {**super().state_dict(), "personal_sampler": self.personal_sampler.get_state()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if "personal_sampler" in state:
            self.personal_sampler.set_state(state["personal_sampler"])


def _personal_seed(seed: int | None, cid: int) -> int:
    """The seed of site ``cid``'s personal batches: the fifth of its seeds in a research run, else a fresh
    secret one."""
    return party_seeds(seed, cid, 5)[4]


class PersonalizedMethod(ServerAveraged):
    """A method whose clients train a DP global model averaged by a server (local noise, secure aggregation or
    pooled noise: :class:`ServerAveraged`), and a personal model of the same architecture that never leaves
    the client (Ditto, APFL): its :attr:`sites` per placement, told their own options by
    :meth:`site_options`."""

    opts: Any

    def site_options(self) -> dict[str, Any]:
        """Keyword arguments of the site classes beyond the shared ones."""
        return {}

    def make_site(self, k, x, y, data):
        s = spec(self.opts.proxy_model, data)
        return self.averaging_site(k, x, y, data, private_spec=s, **self.site_options())


class SecureDittoSite(DittoSite, SecureCentralSite):
    """A Ditto site uploading only the masked encoding of its global model's move (secure aggregation)."""


class PooledDittoSite(DittoSite, PooledSite):
    """A Ditto site whose global model takes pooled noise; its personal model trains each round as without."""


@register(
    "ditto",
    options=DittoOptions,
    headline="private_acc",
    exchange="server",
    metrics=("private_acc", "global_acc"),
    description="DP global model (FedAvg) + a personal model per client pulled towards it (λ), kept at the "
    "client",
)
class Ditto(PersonalizedMethod):
    opts: DittoOptions
    sites = SiteClasses(DittoSite, SecureDittoSite, PooledDittoSite)

    def site_options(self) -> dict[str, Any]:
        """The pull λ of the personal model towards the global one."""
        return {"ditto_lambda": self.opts.ditto_lambda}
