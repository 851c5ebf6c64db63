"""SCAFFOLD (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated Learning", ICML
2020) with
example-level DP-SGD, its control variates computed from the DP gradients only.

FedAvg's round (:mod:`silofl.fl.exchange.centralized`) with control variates: the server's c and each site's
c_i (zeros at the start). Every local step uses the corrected gradient g̃ − c_i + c, g̃ the step's DP-SGD
gradient (clipped, summed, noised, divided — exactly FedAvg's mechanism; the correction joins it afterwards,
:meth:`~silofl.site.dpsgd.DPSGDSite.shared_grad_hook`). After the round the site's new control variate is the
mean of the round's K **DP** gradients, c_i⁺ = (1/K)·Σ g̃ — for plain SGD exactly the paper's option II, c_i −
c + (x − y)/(K·η) — and it uploads its model with Δc_i = c_i⁺ − c_i. The server averages the models (and
steps, with ``server_lr``/``server_momentum``) and sets c ← c + (|S|/N)·mean(Δc_i) (weighted as the models
are: exact while every site takes part), then broadcasts the model and c.

Why the guarantee is DP-SGD's, with no extra budget: c_i is a function of the noised gradients g̃ the
mechanism released (the accountant counts each of them), never of an un-noised per-example quantity; c is a
function of the sites' c_i; the correction −c_i + c added to a step depends on no example. Everything that
leaves the site — the model and Δc_i — is post-processing of the DP releases, so the accountant's ε (FedAvg's,
for the steps that ran) covers it.

Pooled noise (``noise_placement: pooled``, :mod:`silofl.fl.exchange.pooled`) is refused: there no site
releases a DP gradient of its own — only the sum of the sites' clipped gradients plus the pooled noise is DP,
each site adding a share too small to protect its own — so c_i would be the site's un-noised (share-noised)
gradient, and uploading Δc_i, or adding −c_i to what it masks (the sum's sensitivity bounds the clipped
gradients, not c_i), would release it. Noising the control variates through a second secure sum would double
the spend for nothing: with one pooled step a round and every site in the sum, Σ_i w_i·(g_i − c_i + c)
carries the corrections only as Σ_i w_i·(c − c_i), which vanishes when c is the sites' weighted mean —
pooled SCAFFOLD is pooled FedAvg. The refusal is one line (:attr:`ScaffoldOptions.pooled_refusal`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from silofl.comm.messages import Packet
from silofl.comm.wire import encode, read_model
from silofl.core.randomness import party_seeds
from silofl.fl.coordinator import Method
from silofl.fl.exchange.centralized import AveragingServer, Centralized, CentralSite
from silofl.fl.exchange.secure_average import NoisePlacementOptions
from silofl.fl.methods.common import dpsgd_settings, spec
from silofl.fl.options import AveragingOptions, SharedModelOptions
from silofl.fl.registry import register

CV = "__cv__."  # the control variates' tensors in a message: CV + the parameter's name


@dataclass
class ScaffoldOptions(NoisePlacementOptions, AveragingOptions, SharedModelOptions):
    """SCAFFOLD: FedAvg with control variates from the DP gradients (local noise only: module doc)."""

    pooled_refusal = (
        "noise_placement pooled is refused for scaffold: a site's control variate would be its own un-noised "
        "gradient (only the sites' sum is DP) and uploading Δc_i releases it; with one pooled step a round "
        "the corrections cancel in the sum anyway: use fedavg"
    )


class ScaffoldSite(CentralSite):
    """FedAvg's DP site with a control variate (see the module doc)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.cv_names = [n for n, p in self.shared.named_parameters() if p.requires_grad]
        zeros = {
            n: torch.zeros_like(p.detach()) for n, p in self.shared.named_parameters() if p.requires_grad
        }
        self.c_local = {n: v.clone() for n, v in zeros.items()}
        self.c_global = {n: v.clone() for n, v in zeros.items()}
        self.c_delta = {
            n: v.clone() for n, v in zeros.items()
        }  # the last round's Δc_i, uploaded with the model
        self._g_sum: dict[str, torch.Tensor] = {}
        self._g_steps = 0

    def shared_grad_hook(self) -> Callable[[], None] | None:
        params = [(n, p) for n, p in self.shared.named_parameters() if p.requires_grad]
        self._g_sum = {n: torch.zeros_like(p.detach()) for n, p in params}
        self._g_steps = 0

        def hook() -> None:
            with torch.no_grad():
                for n, p in params:
                    g = p.grad if p.grad is not None else torch.zeros_like(p)
                    self._g_sum[n].add_(g)  # the DP gradient, before the correction
                    p.grad = g + (self.c_global[n] - self.c_local[n])
            self._g_steps += 1

        return hook

    def train(self, rnd: int) -> dict:
        stats = super().train(rnd)
        if self._g_steps:
            new = {n: s / self._g_steps for n, s in self._g_sum.items()}
            self.c_delta = {n: new[n] - self.c_local[n] for n in new}
            self.c_local = new
        return stats

    def payload(self, rnd: int, extra: dict[str, torch.Tensor] | None = None, **meta) -> bytes:
        state = dict(self.shared.state_dict())
        state.update({CV + n: v for n, v in self.c_delta.items()})
        state.update(extra or {})
        return encode(state, meta={"round": rnd, "src": self.cid, "model": self.shared_spec.name, **meta})

    def take_global(self, got: tuple[dict, dict], rnd: int) -> None:
        """Replace the model and take the server's c from its (validated) broadcast."""
        model, self.c_global = got
        self.replace_shared(model, token=("server", rnd))

    def read_global(self, packet: Packet, rnd: int) -> tuple[dict, dict]:
        """A broadcast's model and control variate, validated (names, shapes, dtypes, finite and bounded
        values, round and sender; the model probed on local data). Raises PeerModelRejected."""
        reference = {**dict(self.shared.state_dict()), **{CV + n: v for n, v in self.c_global.items()}}
        tensors, _, _ = read_model(packet.data, reference, expect={"round": rnd, "src": packet.src})
        model = {k: v for k, v in tensors.items() if not k.startswith(CV)}
        self.probe(model)
        return model, {n: tensors[CV + n].clone() for n in self.cv_names}

    def state_dict(self) -> dict:
        return {
            **super().state_dict(),
            "scaffold": {"c_local": self.c_local, "c_global": self.c_global, "c_delta": self.c_delta},
        }

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        sc = state.get("scaffold")
        if sc is not None:
            self.c_local, self.c_global, self.c_delta = sc["c_local"], sc["c_global"], sc["c_delta"]


class ScaffoldServer(AveragingServer):
    """The averaging server with the global control variate c (see the module doc)."""

    def __init__(self, *args: Any, n_sites: int, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.n_sites = n_sites
        self.c = {
            n: torch.zeros_like(p.detach(), dtype=p.dtype)
            for n, p in self.model.named_parameters()
            if p.requires_grad
        }

    def state(self) -> dict[str, torch.Tensor]:
        return {**super().state(), **{CV + n: v for n, v in self.c.items()}}

    def absorb(self, average: dict[str, torch.Tensor], received: int) -> dict[str, torch.Tensor]:
        share = received / self.n_sites
        for n in self.c:
            self.c[n] = self.c[n] + share * average[CV + n].to(self.c[n].dtype)
        self._encoded = None
        return {k: v for k, v in average.items() if not k.startswith(CV)}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "c": self.c}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if "c" in state:
            self.c = dict(state["c"])


class ScaffoldCoordinator(Centralized):
    """FedAvg's round with :class:`ScaffoldServer`."""

    def __init__(self, cfg: Any, n_sites: int, spec_, device: torch.device, uniform: bool = False):
        super().__init__(cfg, n_sites, spec_, device, uniform=uniform)
        old = self.server
        self.server = ScaffoldServer(
            n_sites, spec_, party_seeds(cfg.seed, n_sites)[0], device, old.opt, n_sites=n_sites
        )


@register(
    "scaffold",
    options=ScaffoldOptions,
    headline="global_acc",
    exchange="server",
    metrics=("global_acc",),
    description="FedAvg with SCAFFOLD's control variates, computed from the DP gradients only",
)
class Scaffold(Method):
    opts: ScaffoldOptions

    def make_site(self, k, x, y, data):
        return ScaffoldSite(
            k, x, y, spec(self.opts.proxy_model, data), dpsgd_settings(self.plan, k), shared_field="global"
        )

    def make_coordinator(self, n_sites, data, device):
        return ScaffoldCoordinator(
            self.plan,
            n_sites,
            spec(self.opts.proxy_model, data),
            device,
            uniform=self.opts.aggregation == "uniform",
        )
