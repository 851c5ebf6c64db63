"""Client-level DP federated learning with adaptive intermediaries (Jiang et al., MICCAI 2023): the
server role and the round.

Roles: sites ``0..N-1`` are hospitals (:mod:`silofl.site.subclients`), node ``N`` is the server, a role
the coordinator plays.

Round r (hospitals the server selected — all, or Poisson with rate ``client_rate``):

1. A hospital splits its data into v disjoint sub-clients, trains them with local SGD, clips each
   update to the sub-client bound c (``C`` when ``privacy_unit: subclient``; ``C/v`` when
   ``privacy_unit: hospital``, so that one hospital moves the sum by at most C), and sends the sum of
   its clipped updates, the number (hospital unit: fraction) of unclipped updates and the sum of the
   clipped norms (DP-FedNova normalises each update to Δ_j·τ̄/τ_j first).
2. The server validates every message (shapes, finite values, and the norm bound it announced), adds
   N(0, (z_Δ·C)²) to the sum, divides by the expected number of privacy units, and lets the server
   optimizer take a step. With adaptive clipping it releases the noised unclipped count and moves C
   geometrically towards the target quantile; with adaptive intermediaries it releases the noised norm
   sum and sets the next v = √(N·λ̂), λ̂ = ‖noise‖ / (noised Σ‖clipped Δ‖), clamped to
   [1, ⌊min_i n_i / B⌋]. The noised sum enters as the mean clipped norm per privacy unit relative to its
   bound, clamped to [0.05, 1] and exponentially smoothed over rounds (weight 0.7 on the past): at N = 6
   one round's noise would otherwise swing v between 1 and the cap. The auxiliary releases share the
   noise budget: the accountant sees the total multiplier z (:mod:`silofl.privacy.analysis`).
3. The server records the round in two accountants — one per privacy unit — and broadcasts the new
   global model, the next v, the clip, the selection and the ε so far.

Public or privatised, by quantity: the data sizes n_i (as in FedAvg's weights; each site states its own
in ``hello``) and hence τ̄ and the cap on v are public; v, C and the model are functions of noised
releases only; ‖noise‖ is a property of the noise, not of the data. The diagnostics ξ, φ, λ and the
spread of cosine similarities in the metrics use the un-noised sum and are NOT privatised: they are
measurements for the researcher, never fed back into the protocol.

With secure aggregation (``SecureRound``) the sampled hospitals add their own discrete noise and mask; a
sample smaller than ``min_survivors`` skips the round (nothing released). Each hospital's ε against the server
composes the rounds whose sum held its input, with no amplification by sampling (the server picks the
sample); with the sub-client unit each sub-client is a summand of its own (``per_party``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from silofl.comm.messages import Message, Packet
from silofl.comm.wire import encode, read_model
from silofl.core.errors import BudgetExhausted, ConfigError, PeerModelRejected
from silofl.core.randomness import party_seeds
from silofl.fl.coordinator import Coordinator, RoundEvents
from silofl.fl.exchange.secure_round import SecAggOptions, SecureParty, SecureRound, plausible
from silofl.fl.options import (
    PRIVACY_UNITS,
    MethodOptions,
    check_model,
    choice,
    option,
    positive,
    unit_interval,
)
from silofl.models import ModelSpec
from silofl.privacy import Accountant, Budget, NoiseSource
from silofl.privacy.analysis import (
    COUNT_SENSITIVITY,
    subclient_clip,
    unit_noise_multipliers,
    update_noise_multiplier,
)
from silofl.privacy.client_level import AdaptiveClip
from silofl.privacy.sampling import load_sampler_state, make_sampler, sampler_state, uniforms
from silofl.site.subclients import (
    BROADCAST,
    CLIP,
    EPS_H,
    EPS_S,
    NORM_SUM,
    SELECTED,
    TAU,
    UNCLIPPED,
    UNITS,
    UPDATE,
    SubclientSite,
    V,
    local_steps,
)
from silofl.training.local_sgd import flat, unflat
from silofl.training.server_opt import make_optimizer

log = logging.getLogger("silofl")

TOLERANCE = 1e-4  # relative slack on the announced norm bound (float32 sums)
RATIO_FLOOR, RATIO_SMOOTHING = (
    0.05,
    0.7,
)  # adaptive v: clamp and exponential smoothing of the noised norm ratio
__all__ = [
    "BROADCAST",
    "ClientLevelDP",
    "ClientLevelOptions",
    "ClientLevelSite",
    "DPServer",
    "UnitAccountants",
]


# ---------------------------------------------------------------------------------------------- options
@dataclass
class SecureAggregationOptions(SecAggOptions):
    """Secure aggregation's settings for the client-level methods (shared: :class:`SecAggOptions`)."""

    def validate_secure(self, run: Any) -> None:
        """The settings' ranges (client sampling and both privacy units are supported)."""
        self.check_secure(run, lambda: self.secure_settings(run))

    def min_survivors(self, run: Any) -> int:
        """The least number of surviving hospitals whose sum may be released: as set, else K − 1 without
        client sampling and, with ``client_rate`` q < 1, one below the expected sample, round(q·K) − 1 (at
        least 2): a round whose sample is smaller is skipped (no one trains, nothing is released)."""
        if self.secagg_min_survivors is not None or self.client_rate >= 1.0:
            return super().min_survivors(run)
        return min(run.clients, max(2, round(self.client_rate * run.clients) - 1))

    def secure_settings(self, run: Any):
        """A site's secure aggregation settings (None when off)."""
        if not getattr(run, "secure_aggregation", False):
            return None
        from silofl.site.subclients import SecureSiteSettings

        return SecureSiteSettings(
            bits=self.secagg_bits,
            min_survivors=self.min_survivors(run),
            neighbours=self.secagg_neighbours,
            threshold=self.secagg_threshold,
            # without DP: no noise, the update clipped to the announced bound only to fit the group
            noise_multiplier=self.update_noise(run),
            count_noise_multiplier=(
                count / COUNT_SENSITIVITY["hospital"] if (count := self.count_noise_std(run)) else None
            ),
            norm_noise_multiplier=self.norm_noise_multiplier(run),
            privacy_unit=self.privacy_unit,
        )

    def update_noise(self, run: Any) -> float:
        """z_Δ: the update sum's noise multiplier once the auxiliary releases have their share (0 without
        DP)."""
        if run.privacy == "off":
            return 0.0
        return update_noise_multiplier(
            run.noise_multiplier,
            self.count_noise_std(run),
            self.norm_noise_multiplier(run),
            COUNT_SENSITIVITY[self.privacy_unit],
        )


@dataclass
class ClientLevelOptions(SecureAggregationOptions):
    """Options of every client-level method (the server optimizers add theirs)."""

    proxy_model: str = option(
        "mlp", "The shared model's architecture (ProxyFL's proxy, FedAvg's global model)."
    )
    privacy_unit: str = option("hospital", "Client-level DP: whose contribution --clip bounds.")
    intermediaries: str = option("none", "Client-level DP: sub-clients per client: none | V | adaptive.")
    max_intermediaries: int | None = option(
        None, "Client-level DP, --intermediaries adaptive: the cap on v (default ⌊min_i n_i / batch size⌋)."
    )
    adaptive_clip: bool = option(
        False,
        "Client-level DP: the clip follows a privately estimated quantile of update norms "
        "(or --clip adaptive[:C0]).",
    )
    clip_quantile: float = option(
        0.5, "Client-level DP, adaptive clip: the update-norm quantile the clip follows."
    )
    clip_lr: float = option(0.2, "Client-level DP, adaptive clip: the clip's geometric learning rate.")
    clip_count_noise: float | None = option(
        None, "Client-level DP, adaptive clip: σ_b of the unclipped count (default 2.5·z)."
    )
    norm_noise: float | None = option(
        None, "Client-level DP, --intermediaries adaptive: noise multiplier of the norm sum (default 5·z)."
    )
    client_rate: float = option(1.0, "Client-level DP: Poisson rate of clients per round.")
    local_epochs: int = option(1, "Client-level DP: local SGD epochs.")
    local_lr: float = option(0.05, "Client-level DP: local SGD learning rate.")
    server_lr: float | None = option(None, "Client-level DP: server learning rate.")
    mu: float = option(0.0, "Client-level DP: FedProx's proximal weight μ in local SGD (0: off).")

    default_server_lr: ClassVar[float] = 1.0  # the server optimizer's default learning rates (not options)
    nonprivate_server_lr: ClassVar[float | None] = None

    def resolve(self, run: Any) -> MethodOptions:
        changes: dict[str, Any] = {"intermediaries": str(self.intermediaries)}
        if self.server_lr is None:
            private = run.privacy != "off"
            lr = (
                self.default_server_lr
                if private or self.nonprivate_server_lr is None
                else self.nonprivate_server_lr
            )
            changes["server_lr"] = lr
        return dataclasses.replace(self, **changes)

    def validate(self, run: Any) -> None:
        check_model(self.proxy_model)
        choice("privacy_unit", self.privacy_unit, PRIVACY_UNITS)
        mode = str(self.intermediaries).strip().lower()
        if mode not in ("none", "adaptive"):
            try:
                v = int(mode)
            except ValueError:
                raise ConfigError(
                    f"intermediaries must be none, adaptive or a number of sub-clients, got {mode!r}"
                ) from None
            if v < 1:
                raise ConfigError(f"intermediaries must be at least 1 sub-client per client, got {v}")
        if mode == "adaptive" and run.privacy == "off":
            raise ConfigError(
                "intermediaries 'adaptive' sets v from the DP noise level; without DP use a fixed number"
            )
        if not 0.0 < self.clip_quantile < 1.0:
            raise ConfigError(f"clip_quantile must lie in (0, 1), got {self.clip_quantile}")
        if not 0.0 < self.client_rate <= 1.0:
            raise ConfigError(f"client_rate must lie in (0, 1], got {self.client_rate}")
        for name in ("clip_lr", "local_lr"):
            positive(name, getattr(self, name))
        for name in ("clip_count_noise", "norm_noise", "server_lr"):
            v = getattr(self, name)
            if v is not None:
                positive(name, v)
        if self.local_epochs < 1:
            raise ConfigError(f"local_epochs must be at least 1, got {self.local_epochs}")
        if not (math.isfinite(self.mu) and self.mu >= 0):
            raise ConfigError(f"mu must be a finite non-negative number, got {self.mu}")
        if self.max_intermediaries is not None and self.max_intermediaries < 1:
            raise ConfigError(f"max_intermediaries must be at least 1, got {self.max_intermediaries}")
        if getattr(run, "secure_aggregation", False):
            self.validate_secure(run)

    @property
    def fixed_intermediaries(self) -> int | None:
        """v for a fixed number of sub-clients (1 for none), None for adaptive."""
        mode = str(self.intermediaries).strip().lower()
        return None if mode == "adaptive" else 1 if mode == "none" else int(mode)

    def count_noise_std(self, run: Any) -> float | None:
        """σ_b of the noised unclipped count (adaptive clipping under DP only)."""
        if not (self.adaptive_clip and run.privacy != "off"):
            return None
        return self.clip_count_noise if self.clip_count_noise is not None else 2.5 * run.noise_multiplier

    def norm_noise_multiplier(self, run: Any) -> float | None:
        """z_n of the noised norm sum (adaptive intermediaries under DP only)."""
        if self.fixed_intermediaries is not None or run.privacy == "off":
            return None
        return self.norm_noise if self.norm_noise is not None else 5.0 * run.noise_multiplier


@dataclass
class FedAdamOptions(ClientLevelOptions):
    """FedAdam's server optimizer (Reddi et al.)."""

    adam_beta1: float = option(0.9, "Adaptive server optimizers: β1.")
    adam_beta2: float = option(
        0.99, "Adaptive server optimizers: β2 (DP²-RMSProp: the preconditioner's decay)."
    )
    server_tau: float = option(1e-3, "Adaptive server optimizers: the adaptivity τ.")  # adaptivity τ
    bias_correction: bool = option(False, "FedAdam: Adam's bias correction.")

    default_server_lr = 0.03

    def validate(self, run: Any) -> None:
        super().validate(run)
        for name in ("adam_beta1", "adam_beta2"):
            unit_interval(name, getattr(self, name), open_hi=True)
        positive("server_tau", self.server_tau)


@dataclass
class DP2Options(ClientLevelOptions):
    """DP²-RMSProp's server optimizer (delayed preconditioner, SGD/adaptive phases)."""

    adam_beta2: float = option(
        0.99, "Adaptive server optimizers: β2 (DP²-RMSProp: the preconditioner's decay)."
    )
    server_tau: float = option(1e-3, "Adaptive server optimizers: the adaptivity τ.")
    dp2_delay: int = option(5, "DP²-RMSProp: rounds per SGD / adaptive phase.")
    dp2_lr_sgd: float = option(1.0, "DP²-RMSProp: the server learning rate of the SGD phases.")

    default_server_lr = 0.03
    nonprivate_server_lr = 0.003  # without noise DP²'s preconditioner is small: a smaller step

    def validate(self, run: Any) -> None:
        super().validate(run)
        unit_interval("adam_beta2", self.adam_beta2, open_hi=True)
        positive("server_tau", self.server_tau)
        positive("dp2_lr_sgd", self.dp2_lr_sgd)
        if self.dp2_delay < 1:
            raise ConfigError(f"dp2_delay must be at least 1, got {self.dp2_delay}")


# ---------------------------------------------------------------------------------------------- site steps
@dataclass(frozen=True)
class SecureFloor:
    """A deployed hospital's own floor on secure aggregation (its signed policy, :mod:`silofl.site.policy`,
    and its lifetime budget): it masks no round whose update noise multiplier is below ``min_noise``, whose
    sample or minimum survivors is below its survivors floor (``min_survivors``, and ``survivor_fraction`` of
    the round's sample), nor one that would take the site past its lifetime budget (``lifetime_epsilon``,
    ``delta``: the whole lifetime) — its one accountant
    (:class:`silofl.privacy.site_accountant.SiteAccountant`) over every mechanism its ledger records (secure
    rounds, DP-SGD, releases), against the server plus the ``colluders`` it assumes (its per-threat ε counts
    the honest survivors' shares only)."""

    min_noise: float | None
    min_survivors: int | None
    lifetime_epsilon: float
    delta: float
    survivor_fraction: float = 0.0
    colluders: int = 0

    def floor(self, sample: int) -> int:
        """The least survivors of a round of ``sample`` parties this site masks for."""
        return max(self.min_survivors or 0, math.ceil(self.survivor_fraction * sample - 1e-9))


LEDGER_KIND = (
    "secagg-discrete"  # a site's ledger entry: the discrete mechanisms of one secure round it masked
)


class ClientLevelSite(SecureParty, SubclientSite):
    """A hospital's steps in the client-level round (secure aggregation's steps: :class:`SecureParty`)."""

    secure_floor: SecureFloor | None = (
        None  # deployed: the site's own floor, and its ledger records its spend
    )

    def secure_spent(self) -> list:
        """The discrete mechanisms of every secure round this site's ledger records (all runs)."""
        from silofl.privacy.discrete import DiscreteMechanism

        if self.ledger is None:
            return []
        return [
            DiscreteMechanism.from_dict(m)
            for e in self.ledger.entries
            if e.get("kind") == LEDGER_KIND
            for m in e["mechanisms"]
        ]

    def _check_floor(self, mechs: list, z: float, m: int, sample: int | None = None) -> None:
        """SecAggRefused (before training: nothing is released) when the requested round gives less
        protection than this site's floor, or would take the site past its lifetime budget (its one
        accountant: every mechanism its ledger records, DP-SGD and releases included)."""
        from silofl.privacy.site_accountant import SiteAccountant, planned_secure
        from silofl.secure import SecAggRefused

        f = self.secure_floor
        if f is None or not self.settings.private:
            return
        if f.min_noise is not None and z < f.min_noise:
            raise SecAggRefused(f"noise multiplier {z:.4g} is below this site's floor {f.min_noise:g}")
        floor = f.floor(sample if sample is not None else m)
        if m < floor:
            raise SecAggRefused(f"minimum survivors {m} is below this site's floor {floor}")
        if sample is not None and sample < floor:
            raise SecAggRefused(f"a sample of {sample} parties is below this site's survivors floor {floor}")
        # the whole hospital (all its sub-clients' summands in a sub-client unit run): its institution's spend
        books = SiteAccountant(self.ledger, colluders=f.colluders)
        try:
            books.require([planned_secure(mechs)], (f.lifetime_epsilon, f.delta), what="this secure round")
        except BudgetExhausted as e:
            raise SecAggRefused(str(e)) from None

    def secure_protocol(self):
        return self.settings.secure.protocol() if self.settings.secure is not None else None

    def on_train_upload(self, msg: Message) -> Message:
        """Train every sub-client and upload the clipped sum (only if the last broadcast selected it); with
        secure aggregation, its noisy encoding, masked, and the sealed shares of its self-mask."""
        if not self.selected:
            return Message()
        rnd, server = int(msg.meta["round"]), int(msg.meta["server"])
        if self.settings.secure is not None:
            return self._secure_upload(rnd, server, msg.meta.get("secagg"))
        return Message(packets=[Packet(self.cid, server, self.train(rnd))])

    def _secure_upload(self, rnd: int, server: int, sec: Any) -> Message:
        from silofl.privacy.discrete import encode_parts
        from silofl.secure import SecAggRefused

        try:
            parts, graph_seed, rseed = self.secure_round_meta(sec)
            sec_settings = self.settings.secure
            assert sec_settings is not None
            # hospital unit: one summand, the hospital's sum (bound v·C/v); sub-client unit: v summands of C
            per_unit = self.settings.privacy_unit == "subclient"
            try:
                mechs = sec_settings.mechanisms(
                    sum(p.numel() for p in self.model.parameters()),
                    self.clip if per_unit else self.clip * self.v,
                    len(parts),
                    self.v if per_unit else 1,
                )
            except ConfigError as e:
                raise SecAggRefused(str(e)) from None
            self.party.settings.check_round(len(parts))  # refuse before training
            self._check_floor(mechs, sec_settings.noise_multiplier, sec_settings.min_survivors, len(parts))
            total, unclipped, norm_sum, _, _ = self.train_vectors(rnd)
            if per_unit:  # every sub-client's update, unclipped indicator (0 or 1) and clipped norm
                summands = self.last_parts
                vectors = [[d.detach().double().cpu().numpy() for d, _, _ in summands]]
                if sec_settings.count_noise_multiplier is not None:
                    vectors.append([np.array([b]) for _, b, _ in summands])
                if sec_settings.norm_noise_multiplier is not None:
                    vectors.append([np.array([n]) for _, _, n in summands])
            else:
                vectors = [[total.detach().double().cpu().numpy()]]
                if sec_settings.count_noise_multiplier is not None:  # hospital unit: the fraction, centred
                    vectors.append([np.array([unclipped - 0.5])])
                if sec_settings.norm_noise_multiplier is not None:
                    vectors.append([np.array([norm_sum])])
            x = np.concatenate(
                [
                    encode_parts(v, m, rotation_seed=rseed, rng=self.secure_rng)
                    for v, m in zip(vectors, mechs, strict=True)
                ]
            )
            out = self.secure_upload(rnd, server, x, parts, graph_seed)
        except (SecAggRefused, ValueError, RuntimeError) as e:  # RuntimeError: rounding never fit the bound
            return self._refuse("mask", rnd, str(e))
        if self.secure_floor is not None and self.ledger is not None and self.settings.private:
            # the site's own record of what it released (masked, and counted whether or not the server
            # decodes the sum: it can only over-count)
            self.ledger.append(
                LEDGER_KIND, run=self.run_label, round=rnd, mechanisms=[m.to_dict() for m in mechs]
            )
        return out

    def on_receive_global(self, msg: Message) -> Message:
        """Take the server's broadcast; a broadcast that fails validation means sitting the next round out."""
        rnd = int(msg.meta["round"])
        rejected = []
        for p in msg.packets:
            try:
                self.receive_global(p, rnd)
            except PeerModelRejected as e:
                rejected.append(self.reject(rnd, p, e))
        return Message({"rejected": rejected})


# ---------------------------------------------------------------------------------------------- server
class UnitAccountants:
    """The server's two accountants (hospital and sub-client unit), the budget of the run's unit, and the
    ledger they are rebuilt from."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.opts = cfg.options
        self.unit = self.opts.privacy_unit
        self.accountants = {u: Accountant(cfg.accountant) for u in ("hospital", "subclient")}
        # with secure aggregation the server picks the sample and is an adversary: no amplification claimed
        self.sample_rate = 1.0 if getattr(cfg, "secure_aggregation", False) else self.opts.client_rate
        self.ledger = None
        self.budget = (
            Budget(self.accountants[self.unit], cfg.target_epsilon, cfg.delta) if cfg.is_private else None
        )

    def allows_round(self) -> bool:
        """Whether one more round fits the budget of the run's unit."""
        return self.budget is None or self.budget.allows(self.cfg.noise_multiplier, self.sample_rate, 1)

    def record(self, z_total: float, v: int) -> dict[str, float]:
        """Record one round of the mechanism that ran (the calibrated unit's total multiplier ``z_total``, v
        sub-clients, the auxiliary releases of this run): each unit's multiplier, in the server's ledger
        first."""
        if not self.cfg.is_private:
            return {}
        zs = unit_noise_multipliers(
            z_total,
            v,
            self.unit,
            self.opts.count_noise_std(self.cfg),
            self.opts.norm_noise_multiplier(self.cfg),
        )
        if self.ledger is not None:
            self.ledger.append("client-level", multipliers=zs, sample_rate=self.sample_rate, v=v)
        for u, z in zs.items():
            self.accountants[u].step(z, self.sample_rate, 1)
        return zs

    def open(self, folder) -> None:
        """Keep the rounds in a ledger in ``folder``; the accountants are rebuilt from it (see
        :meth:`restore`)."""
        from silofl.privacy.ledger import Ledger

        self.ledger = Ledger(folder)
        self.restore()

    def restore(self) -> None:
        """The accountants from the ledger's record of every round that ran."""
        if self.ledger is None:
            return
        rounds = [e for e in self.ledger.entries if e["kind"] == "client-level"]
        for u, acc in self.accountants.items():
            acc.replay([(e["multipliers"][u], e["sample_rate"], 1) for e in rounds])

    def epsilons(self) -> dict[str, float]:
        """ε per unit so far."""
        if not self.cfg.is_private:
            return {"hospital": 0.0, "subclient": 0.0}
        return {u: a.epsilon(self.cfg.delta) for u, a in self.accountants.items()}

    def report(self) -> dict:
        """The run's unit's accountant report, and the other unit's ε and history."""
        if not self.cfg.is_private:
            return {"accountant": None, "epsilon": None, "delta": None, "unit": self.unit}
        rep = self.accountants[self.unit].report(self.cfg.delta)
        other = "subclient" if self.unit == "hospital" else "hospital"
        return {
            **rep,
            "unit": self.unit,
            "target_epsilon": self.cfg.target_epsilon,
            f"epsilon_{other}": self.accountants[other].epsilon(self.cfg.delta),
            f"history_{other}": [list(h) for h in self.accountants[other].history],
        }


class DPServer:
    """Node N: noise, clip adaptation, the choice of v, the server optimizer, the accountants."""

    def __init__(
        self,
        node: int,
        spec: ModelSpec,
        cfg,
        sizes: list[int],
        accounts: UnitAccountants,
        device,
        optimizer: str,
    ):
        seed_init, seed_sample, seed_noise, _ = party_seeds(cfg.seed, node)
        seeded = cfg.seed is not None
        torch.manual_seed(seed_init)
        self.node, self.spec, self.cfg, self.sizes, self.accounts = node, spec, cfg, sizes, accounts
        o = self.opts = cfg.options
        self.model = spec.build().to(device)
        self.names = [k for k, _ in self.model.named_parameters()]
        self.d = sum(p.numel() for p in self.model.parameters())
        self.opt = make_optimizer(optimizer, o)
        # the aggregate is formed on the CPU (messages arrive there): the same noise on any device
        self.noise = NoiseSource(seed_noise if seeded else None, device="cpu")
        self.sampler = make_sampler(seed_sample if seeded else None)  # client sampling: secure unless seeded
        self.v_cap = min(sizes) // cfg.batch_size
        if o.max_intermediaries is not None:
            self.v_cap = min(self.v_cap, o.max_intermediaries)
        fixed = o.fixed_intermediaries
        if fixed is not None and fixed > min(sizes) // cfg.batch_size:
            raise ConfigError(
                f"intermediaries {fixed}: the smallest client has {min(sizes)} examples, enough for at most "
                f"{min(sizes) // cfg.batch_size} sub-clients of one batch ({cfg.batch_size}) each"
            )
        self.v = fixed if fixed is not None else 1
        self.clip = (
            AdaptiveClip(cfg.clip, o.clip_quantile, o.clip_lr, o.count_noise_std(cfg) or 1.0)
            if o.adaptive_clip and cfg.is_private
            else None
        )
        # the mechanism: the update sum's noise multiplier z_Δ, chosen so that with the auxiliary releases
        # the whole round is one Gaussian mechanism of total multiplier z (what the ledger records)
        self.z_total = cfg.noise_multiplier
        self.z_update = (
            update_noise_multiplier(
                self.z_total,
                o.count_noise_std(cfg),
                o.norm_noise_multiplier(cfg),
                COUNT_SENSITIVITY[o.privacy_unit],
            )
            if cfg.is_private
            else 0.0
        )
        self.selected: set[int] = set()
        self.norm_ratio: float | None = None
        self.history: list[dict] = []
        self._announced: tuple | None = None
        # secure aggregation: the protocol's server role, the mechanisms whose sums it saw (the accountant
        # against the server), and the public per-round rotation seeds (seeded research runs: reproducible)
        self.secure = o.secure_settings(cfg)
        self.secagg: SecureRound | None = None
        # per released round: its number, the hospitals whose inputs are in the sum, its mechanisms — each
        # hospital's ε against the server composes the rounds it took part in (no amplification by sampling)
        self.secure_rounds: list[dict] = []
        self.secure_abandoned = 0
        self.secure_skipped = 0  # rounds whose sample was below min_survivors: no one trained
        if self.secure is not None:
            import random

            extras = (self.secure.count_noise_multiplier is not None) + (
                self.secure.norm_noise_multiplier is not None
            )
            self.secagg = SecureRound(
                self.secure.protocol(),
                (1 << max(0, (self.d - 1).bit_length())) + extras,
                random.Random(seed_noise) if seeded else random.SystemRandom(),
            )

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """Model, optimizer, RNGs, clip, v and both accountants."""
        return {
            "model": self.model.state_dict(),
            "opt": self.opt.state_dict(),
            "noise": self.noise.state_dict(),
            "sampler": sampler_state(self.sampler),
            "clip": self.clip.clip if self.clip is not None else None,
            "v": self.v,
            "norm_ratio": self.norm_ratio,
            "selected": sorted(self.selected),
            "history": self.history,
            "accountants": {u: a.state_dict() for u, a in self.accounts.accountants.items()},
            "ledger_head": self.accounts.ledger.head.to_dict() if self.accounts.ledger is not None else None,
            "secure_released": self.secure_released,
            "secure_rounds": self.secure_rounds,
            "secure_abandoned": self.secure_abandoned,
            "secure_skipped": self.secure_skipped,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (the accountants may only grow)."""
        device = next(self.model.parameters()).device
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(
            {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in state["opt"].items()}
        )
        self.noise.load_state_dict(state["noise"])
        load_sampler_state(self.sampler, state["sampler"])
        if self.clip is not None:
            self.clip.clip = float(state["clip"])
        self.v, self.norm_ratio = int(state["v"]), state["norm_ratio"]
        self.selected, self.history = set(state["selected"]), list(state["history"])
        self.secure_rounds = list(state.get("secure_rounds", []))
        if "secure_rounds" not in state and state.get("secure_released") and self.secure is not None:
            # a checkpoint from before per-hospital accounting: every hospital in every released round
            per = (
                1
                + (self.secure.count_noise_multiplier is not None)
                + (self.secure.norm_noise_multiplier is not None)
            )
            rel = list(state["secure_released"])
            self.secure_rounds = [
                {"round": None, "survivors": list(range(len(self.sizes))), "mechanisms": rel[i : i + per]}
                for i in range(0, len(rel), per)
            ]
        self.secure_abandoned = int(state.get("secure_abandoned", 0))
        self.secure_skipped = int(state.get("secure_skipped", 0))
        if self.accounts.ledger is not None:  # what ran, from the ledger — never a number from the checkpoint
            self.accounts.ledger.check_head(state["ledger_head"])
            self.accounts.restore()
        else:
            for u, a in self.accounts.accountants.items():
                a.load_state_dict(state["accountants"][u])
        self._announced = None

    # ------------------------------------------------------------------ what the server announces
    @property
    def clip_bound(self) -> float:
        """One privacy unit's sensitivity this round."""
        return self.clip.clip if self.clip is not None else self.cfg.clip

    def tau_bar(self) -> float:
        """τ̄: the mean local steps per sub-client (from the public data sizes)."""
        steps = [
            t for n in self.sizes for t in local_steps(n, self.v, self.cfg.batch_size, self.opts.local_epochs)
        ]
        return statistics.fmean(steps)

    def select(self, clients: list[int]) -> None:
        """Poisson-sample the sites that train next round."""
        q = self.opts.client_rate
        draws = uniforms(len(self.sizes), self.sampler)
        self.selected = {k for k in clients if q >= 1.0 or float(draws[k]) < q}

    def _announcement(self, rnd: int) -> dict[str, torch.Tensor]:
        """What every client is told this round (model, v, clip, τ̄, ε): computed once per broadcast."""
        key = (rnd, len(self.history))
        if self._announced is None or self._announced[0] != key:
            eps = self.accounts.epsilons()
            sub_clip = (
                subclient_clip(self.clip_bound, self.v, self.opts.privacy_unit)
                if self.cfg.is_private
                else self.clip_bound
            )
            scalars = {
                V: self.v,
                CLIP: sub_clip,
                TAU: self.tau_bar(),
                EPS_H: eps["hospital"],
                EPS_S: eps["subclient"],
            }
            state = dict(self.model.state_dict())
            state.update({k: torch.tensor(float(val), dtype=torch.float64) for k, val in scalars.items()})
            self._announced = (key, state)
        return self._announced[1]

    def payload(self, rnd: int, client: int) -> bytes:
        """The broadcast to ``client``: the announcement plus whether it is selected next round."""
        state = {
            **self._announcement(rnd),
            SELECTED: torch.tensor(float(client in self.selected), dtype=torch.float64),
        }
        return encode(state, meta={"round": rnd, "src": self.node, "model": self.spec.name, "global": True})

    # ------------------------------------------------------------------ one aggregation
    def expected_units(self) -> float:
        """The expected number of privacy units per round (the divisor of the noised sum)."""
        units = len(self.sizes) * (self.v if self.opts.privacy_unit == "subclient" else 1)
        return self.opts.client_rate * units

    def aggregate(self, rnd: int, packets: list[Packet]) -> list[dict]:
        """Validate the updates, release their noised sum (and the auxiliary statistics), step."""
        cfg, o = self.cfg, self.opts
        params = dict(self.model.named_parameters())
        ref = {"update": torch.zeros(self.d, dtype=params[self.names[0]].dtype)}
        per_unit_bound = self.clip_bound  # one unit's sensitivity
        total = torch.zeros(self.d, dtype=torch.float64, device=ref["update"].device)
        unclipped_centred = norm_sum = 0.0
        updates, rejected = [], []
        for env in packets:
            try:
                if env.src not in self.selected:
                    raise PeerModelRejected("update from a client that was not selected this round")
                t, s, _ = read_model(env.data, ref, UPDATE, expect={"round": rnd, "src": env.src})
                upd = t["update"].to(total.device)
                units = s[UNITS]
                want_units = 1 if o.privacy_unit == "hospital" else self.v
                if units != want_units:
                    raise PeerModelRejected(f"update claims {units:g} privacy units, expected {want_units}")
                if cfg.is_private:
                    bound = units * per_unit_bound * (1 + TOLERANCE)
                    norm = float(torch.linalg.vector_norm(upd.double()))
                    if norm > bound:
                        raise PeerModelRejected(
                            f"update norm {norm:.4g} exceeds the announced bound {bound:.4g}"
                        )
                    if s[NORM_SUM] > bound or s[UNCLIPPED] > units:
                        raise PeerModelRejected("clip statistics outside their bounds")
                updates.append(upd)
                total += upd.double()
                unclipped_centred += s[UNCLIPPED] - units / 2.0
                norm_sum += s[NORM_SUM]
            except PeerModelRejected as e:
                log.warning("server rejected the update from client %d in round %d: %s", env.src, rnd, e)
                rejected.append({"round": rnd, "client": self.node, "src": env.src, "reason": str(e)})
        D = self.expected_units()
        stats: dict = {
            "round": rnd,
            "v": self.v,
            "clip": self.clip_bound,
            "updates": len(updates),
            "expected_units": D,
        }
        if cfg.is_private:
            noise = self.noise.normal((self.d,), self.z_update * per_unit_bound, dtype=torch.float64)
            noise_norm = float(torch.linalg.vector_norm(noise))
            released = total + noise
            zs = self.accounts.record(self.z_total, self.v)
            stats.update(
                {
                    "noise_std": self.z_update * per_unit_bound,
                    "z_update": self.z_update,
                    "z_hospital": zs["hospital"],
                    "z_subclient": zs["subclient"],
                }
            )
            stats.update(self._diagnostics(total, noise_norm, norm_sum, updates))
            if self.clip is not None:  # privatised quantile estimate moves the clip
                b = self.clip.noisy_fraction(
                    unclipped_centred, D, float(self.noise.normal((1,), 1.0, torch.float64)[0])
                )
                stats["unclipped_fraction_noisy"] = b
                self.clip.update(b)
            if o.fixed_intermediaries is None:  # privatised norm sum sets the next v
                z_n = o.norm_noise_multiplier(cfg)
                noisy_sum = norm_sum + float(self.noise.normal((1,), z_n * per_unit_bound, torch.float64)[0])
                stats.update(self._next_v(noisy_sum, noise_norm, D, per_unit_bound))
        else:
            released = total
            stats.update(self._diagnostics(total, 0.0, norm_sum, updates))
        self._step(released / D)
        stats.update(
            {f"epsilon_{u}": e for u, e in self.accounts.epsilons().items()} if cfg.is_private else {}
        )
        self.history.append(stats)
        return rejected

    def _next_v(self, noisy_sum: float, noise_norm: float, D: float, per_unit_bound: float) -> dict:
        """Adaptive intermediaries: the next v from the noised norm sum and the noise's norm."""
        # mean clipped norm per unit relative to its bound: in [0, 1] before noise, so clamping
        # and smoothing it (post-processing) keep one noisy round from throwing v to an extreme
        ratio = min(1.0, max(RATIO_FLOOR, noisy_sum / (D * per_unit_bound)))
        self.norm_ratio = (
            ratio
            if self.norm_ratio is None
            else RATIO_SMOOTHING * self.norm_ratio + (1 - RATIO_SMOOTHING) * ratio
        )
        lam = noise_norm / (self.norm_ratio * D * per_unit_bound)
        v_next = int(min(self.v_cap, max(1, round(math.sqrt(len(self.sizes) * lam)))))
        self.v = v_next
        return {"norm_ratio_privatised": self.norm_ratio, "lambda_privatised": lam, "v_next": v_next}

    def _step(self, mean: torch.Tensor) -> None:
        """The server optimizer's step with the released mean update."""
        params = dict(self.model.named_parameters())
        p0 = params[self.names[0]]
        step = self.opt.step(mean.to(device=p0.device, dtype=p0.dtype))
        with torch.no_grad():
            new = flat({k: p.detach() for k, p in params.items()}) + step
            for k, val in unflat(new, {k: p for k, p in params.items()}).items():
                params[k].copy_(val)

    # ------------------------------------------------------------------ secure aggregation
    def secure_mechanism(self, parties: int):
        """The discrete mechanism of this round's update sum."""
        return self.secure_mechanisms(parties)[0]

    def secure_mechanisms(self, parties: int, v: int | None = None) -> list:
        """The round's discrete mechanisms (update; unclipped count; norm sum), as the sites compute them from
        public inputs — the hospital's bound is the announced sub-client clip times v (this round's, unless
        ``v`` is given), as each site computes it."""
        assert self.secure is not None
        v = self.v if v is None else v
        private = self.cfg.is_private
        sub_clip = subclient_clip(self.clip_bound, v, self.opts.privacy_unit) if private else self.clip_bound
        c = float(torch.tensor(sub_clip, dtype=torch.float64))
        if self.opts.privacy_unit == "subclient":  # v summands of one sub-client's bound each
            return self.secure.mechanisms(self.d, c, parties, v)
        return self.secure.mechanisms(self.d, c * v, parties)

    def check_secure_group(self, parties: int) -> None:
        """ConfigError now, not an abandoned round later, when the group cannot hold a round of ``parties``
        hospitals (the bits are too few for the model; with the sub-client unit, at the most sub-clients v
        may reach)."""
        most = self.opts.privacy_unit == "subclient" and self.opts.fixed_intermediaries is None
        try:
            self.secure_mechanisms(parties, max(1, self.v_cap) if most else None)
        except ConfigError as e:
            raise ConfigError(f"secure aggregation: {e}") from None

    def secure_allows_round(self, parties: int) -> bool:
        """Whether one more round's discrete releases keep ε against the server within the target (cached per
        round: asked once per site)."""
        cfg = self.cfg
        if cfg.target_epsilon is None or not cfg.is_private:
            return True
        key = (len(self.secure_rounds), self.clip_bound, self.v)
        if getattr(self, "_allows", (None, True))[0] != key:
            # every hospital that may be sampled next: its own rounds plus one more (at the most parties)
            nxt = self.secure_mechanisms(parties)
            worst = max(
                self._epsilon_of([*self._secure_mechs_of(k), *nxt], self.opts.privacy_unit)
                for k in range(len(self.sizes))
            )
            self._allows = (key, worst <= cfg.target_epsilon)
        return self._allows[1]

    @property
    def secure_released(self) -> list[dict]:
        """The discrete mechanisms of every released round, in order (what the server saw)."""
        return [m for r in self.secure_rounds for m in r["mechanisms"]]

    def _secure_mechs_of(self, k: int) -> list:
        """The discrete mechanisms of every released round whose sum holds hospital ``k``'s input."""
        from silofl.privacy.discrete import DiscreteMechanism

        return [
            DiscreteMechanism.from_dict(m)
            for r in self.secure_rounds
            if k in r["survivors"]
            for m in r["mechanisms"]
        ]

    def _epsilon_of(self, mechs: list, unit: str) -> float:
        """ε at the run's δ of ``mechs`` for one ``unit``: a hospital (all its summands) or a sub-client."""
        from silofl.privacy.discrete import epsilon

        return epsilon(mechs, rounds=1, delta=self.cfg.delta, whole_party=unit == "hospital")

    def secure_participation(self) -> dict[int, int]:
        """Per hospital, the released rounds whose sum holds its input."""
        return {k: sum(k in r["survivors"] for r in self.secure_rounds) for k in range(len(self.sizes))}

    def epsilon_vs_server_of(self, k: int, unit: str | None = None) -> float | None:
        """Hospital ``k``'s own ε against the server (its ``unit``: default the run's): the discrete
        mechanisms of the rounds it took part in, composed; None without DP."""
        if not self.cfg.is_private:
            return None
        unit = unit or self.opts.privacy_unit
        if unit == "subclient" and self.opts.privacy_unit != "subclient":
            raise ValueError("a sub-client's ε against the server is accounted in sub-client unit runs only")
        return self._epsilon_of(self._secure_mechs_of(k), unit)

    def epsilon_vs_server(self, unit: str | None = None) -> float | None:
        """ε against the server (the run's unit unless ``unit``): the largest hospital's own — each composes
        the sums that held its input, each a Skellam release with the minimum survivors' noise
        (silofl.privacy.discrete's analysis); no amplification by sampling (the server picks the sample)."""
        if not self.cfg.is_private:
            return None
        if not self.secure_rounds:
            return 0.0
        return max(float(self.epsilon_vs_server_of(k, unit) or 0.0) for k in range(len(self.sizes)))

    def secure_release(
        self,
        rnd: int,
        released: torch.Tensor | None,
        mechs: list | None,
        info: dict,
        aux: list[float] = (),
        members: list[int] | None = None,
    ) -> None:
        """Record a round of secure aggregation: ``released`` is the decoded noisy update sum the server
        saw and ``aux`` the decoded auxiliary sums (the centred unclipped count, the norm sum: those the run
        releases, in that order); None: the round was abandoned before any sum was revealed — nothing
        released, nothing recorded. With ``info["step"]`` False the sums were seen but not used (implausible:
        a wrong mask or a wrap-around). ``members``: the hospitals whose inputs are in the sum (default all
        that could be: every hospital)."""
        D = self.expected_units()
        per_unit_bound = self.clip_bound
        stats: dict = {"round": rnd, "v": self.v, "clip": self.clip_bound, "expected_units": D, **info}
        if released is None:
            self.secure_abandoned += 1
            stats["abandoned"] = True
            self.history.append(stats)
            return
        survivors = int(info["survivors"])
        assert mechs is not None
        mech = mechs[0]
        self.secure_rounds.append(  # the server saw them: accounted, used or not
            {
                "round": rnd,
                "survivors": sorted(int(k) for k in (range(len(self.sizes)) if members is None else members)),
                "mechanisms": [m.to_dict() for m in mechs],
            }
        )
        zs = self.accounts.record(self.z_total, self.v)
        stats.update(
            {
                "noise_std": mech.central_std(survivors),
                "noise_std_min_survivors": mech.central_std(mech.min_survivors),
                "z_update": self.z_update,
                "z_hospital": zs.get("hospital"),
                "z_subclient": zs.get("subclient"),
                "epsilon_vs_server": self.epsilon_vs_server(),
            }
        )
        if info.get("step", True):
            self._step(released / D)
            rest = list(aux)
            if self.clip is not None:  # the privatised quantile estimate moves the clip
                count = rest.pop(0)
                if self.opts.privacy_unit == "subclient":  # the indicators' sum: centre it (v per survivor)
                    count -= survivors * self.v / 2.0
                b = count / D + 0.5
                stats["unclipped_fraction_noisy"] = b
                self.clip.update(b)
            if self.opts.fixed_intermediaries is None:  # the privatised norm sum sets the next v
                noise_norm = math.sqrt(self.d) * mech.central_std(survivors)  # of the noise, not the data
                stats.update(self._next_v(rest.pop(0), noise_norm, D, per_unit_bound))
        if self.cfg.is_private:
            stats.update({f"epsilon_{u}": e for u, e in self.accounts.epsilons().items()})
        self.history.append(stats)

    def _diagnostics(self, total: torch.Tensor, noise_norm: float, norm_sum: float, updates: list) -> dict:
        """ξ, φ, λ and the spread of cosines — measured on the un-noised sum (NOT privatised)."""
        s_norm = float(torch.linalg.vector_norm(total))
        if s_norm == 0:
            return {}
        cos = []
        for u in updates:
            u = u.double()
            n = float(torch.linalg.vector_norm(u))
            if n > 0:
                cos.append(float(torch.dot(u, total)) / (n * s_norm))
        xi, phi = noise_norm / s_norm, norm_sum / s_norm
        return {
            "xi": xi,
            "phi": phi,
            "lambda": xi / phi if phi > 0 else None,
            "cos_std": statistics.pstdev(cos) if len(cos) > 1 else 0.0,
        }


class ClientLevelDP(Coordinator):
    """The round with the DP server: only selected sites train; each gets its own broadcast (it says whether
    that site is selected next round)."""

    def __init__(self, cfg, n_sites: int, spec: ModelSpec, device: torch.device, optimizer: str):
        super().__init__(cfg, n_sites)
        self.spec, self.device, self.optimizer = spec, device, optimizer
        self.accounts = UnitAccountants(cfg)
        self.server: DPServer | None = None

    def setup(self) -> None:
        cfg, o = self.cfg, self.cfg.options
        missing = sorted(set(range(self.n_sites)) - set(self.info))
        if missing:
            lost = self.engine.lost if self.engine is not None else {}
            raise ConfigError(
                f"client-level DP needs every hospital's public data size at the start; site(s) "
                f"{missing} did not answer ({'; '.join(lost.get(k, 'no reply') for k in missing)})"
            )
        sizes = [int(self.info[k]["n"]) for k in range(self.n_sites)]
        if cfg.is_private:
            units = self.n_sites * (
                1
                if o.privacy_unit == "hospital"
                else (o.fixed_intermediaries or min(sizes) // cfg.batch_size)
            )
            if cfg.delta > 1.0 / units:
                raise ConfigError(
                    f"delta {cfg.delta:g} must be at most 1/(number of privacy units) = 1/{units}"
                )
        self.server = DPServer(
            self.server_id, self.spec, cfg, sizes, self.accounts, self.device, self.optimizer
        )
        if self.server.secure is not None:
            self.server.check_secure_group(self.n_sites)

    def open_ledger(self, folder) -> None:
        self.accounts.open(folder)

    def may_continue(self, k: int) -> bool:
        ok = super().may_continue(k) and self.accounts.allows_round()
        if ok and self.server is not None and self.server.secagg is not None:
            ok = self.server.secure_allows_round(self.n_sites)
        return ok

    def budget_message(self) -> str:
        led, cfg = self.accounts, self.cfg
        one = led.accountants[led.unit].epsilon_after(cfg.noise_multiplier, led.sample_rate, 1, cfg.delta)
        if self.server is not None and self.server.secagg is not None:  # the discrete mechanism's ε
            from silofl.privacy.discrete import epsilon

            mechs = self.server.secure_mechanisms(self.n_sites)
            one = max(one, epsilon(mechs, rounds=1, delta=cfg.delta))
        return (
            f"target_epsilon {led.budget.target_epsilon:g} is below the ε of a single round ({one:.3f} at "
            f"δ={cfg.delta:g}, {led.unit} level): raise the budget or the noise multiplier"
        )

    def broadcast(self, rnd: int, sites: list[int], events: RoundEvents) -> None:
        """Select next round's sites and send each its broadcast."""
        server = self.server
        server.select(sites)
        self.send_from_server(rnd, sites, server.payload, events)

    def start(self) -> None:
        self.broadcast(0, list(range(self.n_sites)), RoundEvents())

    def run_round(self, rnd: int) -> RoundEvents:
        events = RoundEvents()
        active = self.retire(rnd, events)
        if not active:
            return events
        if self.server.secagg is not None:
            self._secure_round(rnd, active, events)
            self.broadcast(rnd, active, events)
            return events
        chosen = sorted(self.server.selected & set(active))
        uploads = self.call(
            "train_upload", {k: Message({"round": rnd, "server": self.server_id}) for k in chosen}
        )
        packets = [
            p for k in sorted(uploads) for p in self.routable(rnd, k, uploads, {self.server_id}, events)
        ]
        events.rejected += self.server.aggregate(rnd, packets)
        self.broadcast(rnd, active, events)
        return events

    # ------------------------------------------------------------------ secure aggregation
    def _secure_round(self, rnd: int, active: list[int], events: RoundEvents) -> None:
        """One round with secure aggregation (:class:`SecureRound`): masked noisy uploads, unmasking by the
        survivors, the decoded sum released — or the round abandoned with nothing released."""
        from silofl.privacy.discrete import decode
        from silofl.secure import SecAggRefused

        server, sec = self.server, self.server.secagg
        chosen = sorted(server.selected & set(sec.participants(self, active, events)))
        info: dict = {"participants": len(chosen)}
        mechs = None
        need = max(2, server.secure.min_survivors)
        if len(chosen) < need:  # client sampling drew too few: no one trains, nothing is released
            info.update(
                {
                    "skipped": True,
                    "reason": f"{len(chosen)} hospital(s) sampled with keys, fewer than the {need} whose "
                    "noise each sum needs (min_survivors): round skipped, no hospital trained, nothing "
                    "released",
                }
            )
            server.secure_skipped += 1
            server.secure_release(rnd, None, mechs, info)
            log.warning("secure aggregation skipped round %d: %s", rnd, info["reason"])
            return
        try:
            mechs = server.secure_mechanisms(len(chosen))
        except (ConfigError, ValueError, SecAggRefused) as e:
            info["reason"] = str(e)
            server.secure_release(rnd, None, mechs, info)
            log.warning("secure aggregation abandoned round %d: %s", rnd, e)
            return
        mech = mechs[0]
        res = sec.run(self, rnd, chosen, events)
        if res.total is None and res.rotation_seed is None:  # refused before any upload
            info["reason"] = res.reason
            server.secure_release(rnd, None, mechs, info)
            log.warning("secure aggregation abandoned round %d: %s", rnd, res.reason)
            return
        released, aux = None, []
        if res.total is not None:
            total, rseed, d = res.total, res.rotation_seed, mech.padded_dim()
            released = torch.from_numpy(decode(total[:d], mech, rotation_seed=rseed))
            aux = [
                float(decode(total[d + i : d + i + 1], m, rotation_seed=rseed)[0])
                for i, m in enumerate(mechs[1:])
            ]
            info["survivors"] = len(res.survivors)
            info["step"] = plausible(released, mech, len(res.survivors), rnd)
        if released is None:
            info["reason"] = res.reason
            log.warning("secure aggregation abandoned round %d: %s — nothing released", rnd, res.reason)
        server.secure_release(
            rnd, released, mechs, info, aux if released is not None else [], members=list(res.survivors)
        )

    def extra_metrics(self, k: int) -> dict:
        if self.server is None or not self.server.history:
            return {}
        h = self.server.history[-1]
        keys = [
            "v",
            "clip",
            "epsilon_hospital",
            "epsilon_subclient",
            "epsilon_vs_server",
        ]  # privatised or public
        if self.release_nonprivate:  # diagnostics of the un-noised sum
            keys = ["xi", "phi", "lambda", "cos_std", *keys]
        out = {key: h[key] for key in keys if key in h}
        if "epsilon_vs_server" in out:  # this hospital's own: the rounds it took part in
            out["epsilon_vs_server"] = self.server.epsilon_vs_server_of(k)
        return out

    def site_report(self, k: int, report: dict) -> dict:
        priv = {**report["privacy"], **self.accounts.report()}
        server = self.server
        if server is not None and server.secagg is not None and self.cfg.is_private:
            priv["epsilon_vs_server"] = server.epsilon_vs_server_of(k)
            priv["secure_rounds_taken_part"] = server.secure_participation()[k]
        return {**report, "privacy": priv}

    def round_history(self) -> list[dict]:
        history = self.server.history if self.server is not None else []
        if self.release_nonprivate:
            return history
        diagnostics = ("xi", "phi", "lambda", "cos_std")  # of the un-noised sum: kept by the server
        return [{k: v for k, v in h.items() if k not in diagnostics} for h in history]

    def state_dict(self) -> dict:
        return {**super().state_dict(), "server": self.server.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.server.load_state_dict(state["server"])
        if self.server.secagg is not None:  # sites resumed from checkpoints hold no keys: agree on new ones
            self.server.secagg.keys_ready = False

    def privacy_summary(self) -> dict:
        cfg, o, led = self.cfg, self.cfg.options, self.accounts
        if not cfg.is_private:
            return {"unit": "none (no DP)", "privacy_unit": o.privacy_unit, **self.secure_summary()}
        eps = led.epsilons()
        other = "subclient" if led.unit == "hospital" else "hospital"
        return {
            "unit": f"one {led.unit} (client-level DP: all of its data at once)",
            "privacy_unit": led.unit,
            "epsilon_hospital": eps["hospital"],
            "epsilon_subclient": eps["subclient"],
            "note_units": (
                f"calibrated per {led.unit}: ε_{led.unit} is the run's guarantee; ε_{other} is the same "
                f"mechanism "
                f"accounted for one {other}, block by block (update sum, and the unclipped count and norm "
                f"sum when they "
                f"are released). ε_hospital bounds everything one hospital holds — any of its records, or "
                f"all of them. "
                "ε_subclient (the figure the published code reports) bounds one sub-client's shard as its "
                "hospital "
                "split it that round: not one record (removing a record re-splits the hospital's data and "
                "changes "
                "every shard), and not a hospital (its v sub-clients move the sum together, which ε_hospital "
                "accounts for)."
            ),
            "noise_multiplier_total": cfg.noise_multiplier,
            "noise_multiplier_update": self.server.z_update,
            "clip_count_noise_std": o.count_noise_std(cfg),
            "norm_sum_noise_multiplier": o.norm_noise_multiplier(cfg),
            "client_rate": o.client_rate,
            "privatised_inputs": "v from the noised norm sum, C from the noised unclipped count; data sizes "
            "public",
            "not_privatised_diagnostics": ["xi", "phi", "lambda", "cos_std"],
            **self.secure_summary(),
        }

    def secure_summary(self) -> dict:
        """summary.json's secure aggregation entries (``secure_aggregation: false`` when off)."""
        server = self.server
        if server is None or server.secagg is None or server.secure is None:
            return {"secure_aggregation": False}
        s = server.secure
        n = self.n_sites
        k = s.protocol().degree(n)
        return {
            "secure_aggregation": True,
            "noise_placement": "site" if self.cfg.is_private else "none (no DP)",
            "noise": (
                "Skellam, each site's share from its own randomness (silofl.privacy.discrete)"
                if self.cfg.is_private
                else "none: updates clipped to --clip only to fit the group"
            ),
            "min_survivors": s.min_survivors,
            "bits_per_coordinate": s.bits,
            "secagg_neighbours": k,
            "secagg_threshold": s.protocol().shares_needed(k),
            "rounds_released": len(server.secure_rounds),
            "rounds_abandoned": server.secure_abandoned,
            "rounds_skipped_small_sample": server.secure_skipped,
            "client_rate": self.cfg.options.client_rate,
            "rounds_per_hospital": {str(k): c for k, c in server.secure_participation().items()},
            "epsilon_vs_server": server.epsilon_vs_server(),
            **self._secure_epsilons(),
            "note_secure_aggregation": (
                "epsilon_vs_server holds against the server and outsiders, assuming no hospital in a sum "
                "colludes with the server (each knows its own noise share: against the server plus c "
                "colluding hospitals only the honest survivors' shares count, each site's own figure with c "
                "from its policy); the server saw only masked vectors and the noisy sums it decoded (each "
                "with the noise of at least min_survivors sites), "
                "accounted with the Skellam mechanism's own RDP bound (rounding and the group included); "
                "epsilon_hospital is the central Gaussian accountant at the same noise multiplier, kept for "
                "comparison — the discrete mechanism is what ran. Abandoned rounds released nothing."
            ),
            **({"note_sampling": self.sampling_note()} if self.cfg.is_private else {}),
        }

    def sampling_note(self) -> str:
        """What the ε against the server holds against, with client sampling: no amplification claimed."""
        unit = self.cfg.options.privacy_unit
        return (
            f"ε against the server (one {unit}): no amplification by sampling claimed (the server picks the "
            "sample and sees who takes part); it holds against the server and outsiders while no other "
            "hospital in a sum colludes with it (each knows its own noise share; against the server plus c "
            "colluders, each site's own accountant counts the honest survivors' shares only); each "
            "hospital's own composes the rounds whose sum held its input (epsilon_vs_server_per_hospital), "
            "the headline is the largest"
            + (
                f"; client_rate {self.cfg.options.client_rate:g}: the central Gaussian figures are "
                "unamplified too"
                if self.cfg.options.client_rate < 1
                else ""
            )
        )

    def _secure_epsilons(self) -> dict:
        """Each hospital's own ε against the server (its participation), and in sub-client unit runs the
        hospital's (all v sub-clients together) beside the sub-client's."""
        server = self.server
        if server is None or not self.cfg.is_private:
            return {}
        n = self.n_sites
        out: dict = {
            "epsilon_vs_server_per_hospital": {str(k): server.epsilon_vs_server_of(k) for k in range(n)}
        }
        if self.cfg.options.privacy_unit == "subclient":
            out["epsilon_vs_server_hospital"] = server.epsilon_vs_server("hospital")
            out["epsilon_vs_server_hospital_per_hospital"] = {
                str(k): server.epsilon_vs_server_of(k, "hospital") for k in range(n)
            }
        return out
