"""``dp-ssp``: one-shot DP sufficient statistics through the secure sum (issue 44; Wang, "Revisiting
differentially private linear regression: optimal and adaptive prediction & estimation in unbounded domain",
UAI 2018 — AdaSSP; Mehta et al. 2023 on least squares over fixed features under DP).

On fixed features (ScatterNet, a backbone, table columns) a linear or ridge head needs only XᵀX and XᵀY. Each
site, once:

1. flattens its rows' features, optionally projects them with a *public*, data-independent Gaussian matrix
   (``ssp_dim`` k > 0; the seed is a constant of the method), and scales every row to L2 norm ≤ 1;
2. forms its statistics s_k = (upper triangle of X_kᵀX_k, X_kᵀY_k) with Y one-hot — one row moves them by
   (x xᵀ, x yᵀ), of L2 norm ≤ √(‖x‖⁴ + ‖x‖²) ≤ √2: the example-level sensitivity;
3. encodes s_k with its noise share and masks it exactly as pooled FedAvg does
   (:mod:`silofl.fl.exchange.pooled`: :func:`~silofl.privacy.discrete.calibrate_pooled` with C = √2, the
   survivors floor carrying the whole noise; budget-first: z from the discrete accountant for one release).

The server decodes only the sum (A, B) and solves the one-vs-rest least squares on the noisy statistics with
A's eigenvalues floored at t = ``ssp_ridge`` × the noise's spectral scale z·√2·√k′ (k′ the statistics'
feature dimension; AdaSSP regularises from the same scale, Wang 2018): W = V·diag(1/max(λᵢ, t))·Vᵀ·B
(post-processing), and broadcasts the head as a ``linear``
model (weights (P·W)ᵀ, no bias: the row scaling in step 1 never changes an argmax). Every site then fits
its own head (``private``, non-DP, it never leaves the site) on its own rows with the shared head as its
prior: W_k = (X_kᵀX_k + λ_k I)⁻¹(X_kᵀY_k + λ_k W), λ_k = ``ssp_private_ridge``.

Accounting: one release of one :class:`~silofl.privacy.discrete.DiscreteMechanism` per site — its ledger
entry is ``secagg-discrete`` with ``unit: "row"`` and ``placement: "secure"`` — and ε per threat as for pooled
FedAvg (against outsiders and the server: the survivors floor's noise; plus c colluders: the honest shares).
Nothing composes over rounds: the method runs one round.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from silofl.comm.messages import Message
from silofl.core.errors import ConfigError
from silofl.fl.coordinator import Method, RoundEvents
from silofl.fl.exchange.pooled import PooledCentralized, PooledSettings, PooledSite, pooled_settings
from silofl.fl.exchange.secure_round import SecAggOptions, SecureRound
from silofl.fl.methods.common import dpsgd_settings, spec
from silofl.fl.options import SharedModelOptions, option, positive
from silofl.fl.registry import register

PROJECTION_SEED = 20180806  # public: the projection is a fixed, data-independent map of each row
ROW_BOUND = math.sqrt(2.0)  # one row's (x xᵀ, x yᵀ) with ‖x‖ ≤ 1 and y one-hot


@dataclass
class DpSspOptions(SecAggOptions, SharedModelOptions):
    """dp-ssp: the statistics' projection and the ridge of the shared and the private heads."""

    noise_placement = "pooled"  # not an option: its statistics always go through the pooled secure sum

    secagg_bits: int = field(
        default=32,
        metadata={
            "help": "--secure-aggregation, dp-ssp: bits per coordinate of the statistics.",
            "panel": "privacy",
        },
    )
    ssp_dim: int = option(
        128, "dp-ssp: project the features to this many dimensions first (public random map; 0: none)."
    )
    ssp_ridge: float = option(
        1.0, "dp-ssp: the shared head's ridge λ in units of the noise's spectral scale."
    )
    ssp_private_ridge: float = option(
        10.0, "dp-ssp: each site's own head: the pull towards the shared head (non-DP, stays at the site)."
    )

    def resolve(self, run: Any):
        if self.sample_rate is None or self.local_steps is None:  # one full-batch release (the plan's q = 1)
            return dataclasses.replace(self, sample_rate=1.0, local_steps=1).resolve(run)
        return super().resolve(run)

    def validate(self, run: Any) -> None:
        super().validate(run)
        if self.proxy_model != "linear":
            raise ConfigError("dp-ssp fits a linear head: proxy_model must be linear")
        if not getattr(run, "secure_aggregation", False):
            raise ConfigError(
                "dp-ssp releases its statistics through the secure sum: add --secure-aggregation"
            )
        if run.privacy == "off":
            raise ConfigError("dp-ssp is a DP release: it needs privacy on")
        if run.rounds != 1:
            raise ConfigError(f"dp-ssp releases its statistics once: rounds must be 1, got {run.rounds}")
        if getattr(run, "target_epsilons", None):
            raise ConfigError("dp-ssp: every site adds a share of one noise, so one target_epsilon")
        if self.ssp_dim < 0:
            raise ConfigError(
                f"ssp_dim must be 0 (no projection) or a positive dimension, got {self.ssp_dim}"
            )
        positive("ssp_ridge", self.ssp_ridge)
        positive("ssp_private_ridge", self.ssp_private_ridge)
        self.check_secure(run, lambda: pooled_settings(self, run))


def projection(d: int, k: int) -> torch.Tensor | None:
    """The public d × k Gaussian projection (entries N(0, 1/k)); None for k = 0."""
    if k == 0:
        return None
    g = torch.Generator().manual_seed(PROJECTION_SEED)
    return torch.randn(d, k, generator=g, dtype=torch.float64) / math.sqrt(k)


def rows(x: torch.Tensor, proj: torch.Tensor | None) -> torch.Tensor:
    """Each row flattened, projected and scaled to L2 norm ≤ 1 (float64)."""
    z = x.reshape(len(x), -1).double()
    if proj is not None:
        z = z @ proj
    return z * torch.clamp(1.0 / z.norm(dim=1, keepdim=True).clamp_min(1e-300), max=1.0)


def statistics(z: torch.Tensor, y: torch.Tensor, classes: int) -> np.ndarray:
    """(upper triangle of ZᵀZ, ZᵀY) flattened, Y one-hot: the vector a site releases."""
    a = z.T @ z
    iu = torch.triu_indices(a.shape[0], a.shape[0])
    b = z.T @ torch.nn.functional.one_hot(y.long(), classes).double()
    return torch.cat([a[iu[0], iu[1]], b.reshape(-1)]).numpy()


def unpack(v: np.ndarray, k: int, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """The symmetric k × k matrix A and the k × classes B from :func:`statistics`' vector."""
    a = np.zeros((k, k))
    iu = np.triu_indices(k)
    a[iu] = v[: len(iu[0])]
    a = a + a.T - np.diag(np.diag(a))
    return a, v[len(iu[0]) :].reshape(k, classes)


def stats_dim(k: int, classes: int) -> int:
    """The length of :func:`statistics`' vector for k features."""
    return k * (k + 1) // 2 + k * classes


class SspSite(PooledSite):
    """A dp-ssp site: it releases its noisy statistics once and fits its own head on the shared one."""

    def enable_ssp(self, settings: PooledSettings, seed: int | None, k: int, private_ridge: float) -> None:
        """Pooled noise on, for the statistics of k features (k = 0: the features as they are)."""
        self.enable_pooled(settings, seed)
        d = int(np.prod(self.x.shape[1:]))
        self.proj = projection(d, k)
        self.k, self.classes = (k or d), int(self.shared_spec.num_classes)
        self.private_ridge = float(private_ridge)
        self.pooled = _row_bound(settings)
        self.dim = self.release_dim()  # what PooledSite encodes: the statistics, not the model

    def release_dim(self) -> int:
        return stats_dim(self.k, self.classes)

    def clipped_sum(self) -> np.ndarray:
        return statistics(rows(self.x, self.proj), self.y, self.classes)

    def on_train_upload(self, msg: Message) -> Message:
        if self.released_mechs:
            return self._refuse("mask", msg.meta.get("round"), "dp-ssp releases its statistics once")
        return super().on_train_upload(msg)

    def take_global(self, tensors: Any, rnd: int) -> None:
        """The shared head; then this site's own head on its own rows, pulled towards it."""
        super().take_global(tensors, rnd)
        if self.private is None:
            return
        w = tensors["out.weight"].double().T.numpy()  # d × classes
        z = self.x.reshape(len(self.x), -1).double()
        z = (z / z.norm(dim=1, keepdim=True).clamp_min(1e-300)).numpy()
        y = np.eye(self.classes)[self.y.long().numpy()]
        lam = self.private_ridge
        own = _solve(z.T @ z, z.T @ y + lam * w, lam)
        state = {"out.weight": torch.from_numpy(own.T).float(), "out.bias": torch.zeros(self.classes)}
        self.private.load_state_dict(state)


def _row_bound(s: PooledSettings) -> PooledSettings:
    """The pooled settings with one row's statistics bound √2 as the clip."""
    return dataclasses.replace(s, clip=ROW_BOUND)


def floor_solve(a: np.ndarray, b: np.ndarray, floor: float) -> np.ndarray:
    """V·diag(1/max(λᵢ, floor))·Vᵀ·B for the noisy symmetric A = V·diag(λ)·Vᵀ: the eigenvalues the noise
    could have made small or negative are floored (post-processing; for a floor below A's smallest eigenvalue
    this is A⁻¹B, the least-squares solution)."""
    lam, v = np.linalg.eigh(a)
    return v @ ((v.T @ b) / np.maximum(lam, floor)[:, None])


def _solve(a: np.ndarray, b: np.ndarray, lam: float) -> np.ndarray:
    """(A + λI)⁻¹B for symmetric A (least squares if the noisy A + λI is not positive definite)."""
    m = a + lam * np.eye(a.shape[0])
    try:
        return np.linalg.solve(m, b)
    except np.linalg.LinAlgError:
        return np.linalg.lstsq(m, b, rcond=None)[0]


class SspServer(PooledCentralized):
    """Decodes the sum of the statistics once, solves the ridge, broadcasts the head."""

    def __init__(self, cfg, n_sites: int, spec_, device, settings: PooledSettings, d: int):
        super().__init__(cfg, n_sites, spec_, device, settings)
        o = cfg.options
        self.k, self.classes, self.ssp_ridge = (o.ssp_dim or d), spec_.num_classes, float(o.ssp_ridge)
        self.proj = projection(d, o.ssp_dim)
        self.pooled = _row_bound(settings)
        self.dim = stats_dim(self.k, self.classes)
        mech = self.pooled.mechanism(self.dim, n_sites)
        self.secagg = SecureRound(self.pooled.protocol(), mech.padded_dim(), self.secagg.rotation_rng)

    def _release(self, rnd: int, mech, res, stats: dict, meta: dict | None = None) -> None:
        from silofl.privacy.discrete import decode

        self.released += 1
        v = decode(res.total, mech, rotation_seed=res.rotation_seed)
        self.released_rounds.append(
            {"round": rnd, "survivors": list(res.survivors), "mechanism": mech.to_dict()}
        )
        a, b = unpack(v, self.k, self.classes)
        lam = self.ssp_ridge * mech.noise_multiplier() * mech.clip * math.sqrt(self.k)
        w = floor_solve(a, b, lam)
        if self.proj is not None:
            w = self.proj.numpy() @ w
        stats.update({"survivors": len(res.survivors), "ridge": lam, "step": True})
        state = {"out.weight": torch.from_numpy(w.T).float(), "out.bias": torch.zeros(self.classes)}
        self.server.model.load_state_dict(state)
        self.server.version = rnd

    def run_round(self, rnd: int) -> RoundEvents:
        if self.released:
            events = RoundEvents()
            self.broadcast(rnd, self.retire(rnd, events), events)
            return events
        return super().run_round(rnd)


@register(
    "dp-ssp",
    options=DpSspOptions,
    headline="global_acc",
    exchange="server",
    metrics=("global_acc", "private_acc"),
    description="one-shot DP sufficient statistics (XᵀX, XᵀY) through the secure sum; a ridge head",
)
class DpSsp(Method):
    opts: DpSspOptions

    def make_site(self, k, x, y, data):
        head = spec(self.opts.proxy_model, data)
        site = SspSite(k, x, y, head, dpsgd_settings(self.plan, k), private_spec=head, shared_field="global")
        site.enable_ssp(
            pooled_settings(self.opts, self.plan),
            self.plan.seed,
            self.opts.ssp_dim,
            self.opts.ssp_private_ridge,
        )
        return site

    def make_coordinator(self, n_sites, data, device):
        d = int(np.prod(data.input_shape))
        return SspServer(
            self.plan,
            n_sites,
            spec(self.opts.proxy_model, data),
            device,
            pooled_settings(self.opts, self.plan),
            d,
        )
