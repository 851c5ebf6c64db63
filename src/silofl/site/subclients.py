"""A site of client-level DP federated learning with intermediaries (Jiang et al., MICCAI 2023).

The site splits its data into v disjoint sub-clients (a fixed random permutation cut into v near-equal
parts), trains v copies of the broadcast global model with local SGD (vectorised,
:mod:`silofl.training.local_sgd`), clips each update to the sub-client bound the server announced,
and sends one message: the sum of its clipped updates, the number (hospital unit: fraction) of updates
that needed no clipping and the sum of the clipped norms. For DP-FedNova each update is first
normalised to Δ_j·τ̄/τ_j (τ_j its local steps, τ̄ the announced mean) so sites with more steps do not
dominate. The noise is the server's (central DP): the server role lives in
:mod:`silofl.fl.exchange.client_level`.

With secure aggregation (``settings.secure``) the site instead encodes its clipped sum into the group
Z_{2**bits} with its own share of the discrete (Skellam) noise, drawn from its own secret randomness
(:func:`silofl.privacy.discrete.encode`), and masks it (:class:`silofl.secure.Party`): the server sees only
the masked vector, and the noisy sum of the survivors once they unmask it. With the sub-client privacy unit
each sub-client's clipped update is a summand rounded on its own and the site's noise is added once
(:func:`silofl.privacy.discrete.encode_parts`), so one sub-client's sensitivity is one rounded summand.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from silofl.comm.messages import Packet
from silofl.comm.wire import encode, read_model
from silofl.core.errors import ConfigError, PeerModelRejected
from silofl.core.randomness import party_seeds
from silofl.models import ModelSpec
from silofl.privacy.client_level import clip_update
from silofl.site.base import DP, NONPRIVATE, PUBLIC, Site
from silofl.training.local_sgd import flat, local_updates
from silofl.training.metrics import prefixed

log = logging.getLogger("silofl")

# scalars of the server's broadcast and of a site's update message
V, CLIP, TAU, SELECTED, EPS_H, EPS_S = (
    "__v__",
    "__clip__",
    "__tau__",
    "__selected__",
    "__eps_hospital__",
    "__eps_subclient__",
)
UNCLIPPED, NORM_SUM, UNITS, STEPS = "__unclipped__", "__norm_sum__", "__units__", "__steps__"
BROADCAST = (V, CLIP, TAU, SELECTED, EPS_H, EPS_S)
UPDATE = (UNCLIPPED, NORM_SUM, UNITS, STEPS)


def subclient_shards(perm: torch.Tensor, v: int) -> list[torch.Tensor]:
    """v disjoint, near-equal parts of a permutation of the client's indices; together they cover it."""
    if not 1 <= v <= len(perm):
        raise ConfigError(f"cannot split {len(perm)} examples into {v} sub-clients")
    return list(torch.tensor_split(perm, v))


def local_steps(n: int, v: int, batch_size: int, epochs: int) -> list[int]:
    """Local SGD steps of each of a client's v sub-clients (sizes from :func:`subclient_shards`)."""
    return [epochs * (len(part) // batch_size) for part in torch.tensor_split(torch.arange(n), v)]


@dataclass(frozen=True)
class SubclientSettings:
    """What a client-level site needs: the run's seed, local SGD, whether DP is on, the privacy unit."""

    seed: int | None  # a research run's seed; None: secret randomness
    batch_size: int
    local_epochs: int
    local_lr: float
    private: bool
    privacy_unit: str  # "hospital" | "subclient"
    normalise: bool  # DP-FedNova: updates scaled by τ̄/τ_j
    clip: float
    secure: SecureSiteSettings | None = None  # secure aggregation with noise at the site (None: off)
    prox_mu: float = 0.0  # FedProx's proximal weight μ in local SGD (0: off)


@dataclass(frozen=True)
class SecureSiteSettings:
    """A site's side of secure aggregation: the group, the thresholds and the noise it calibrates itself
    (its share of the target z·C, assuming only ``min_survivors`` sites' noise reaches the sum)."""

    bits: int
    min_survivors: int
    neighbours: int | None
    threshold: int | None
    noise_multiplier: float  # of the update sum (z_Δ: what the auxiliary releases leave of z)
    count_noise_multiplier: float | None = None  # adaptive clip: σ_b / ½ of the centred unclipped fraction
    norm_noise_multiplier: float | None = None  # adaptive v: z_n of the clipped norm sum
    privacy_unit: str = "hospital"  # subclient: every sub-client a summand (mechanisms' per_party)

    def protocol(self):
        """These settings as the protocol's :class:`~silofl.secure.SecAggSettings`."""
        from silofl.secure import SecAggSettings

        return SecAggSettings(self.bits, self.min_survivors, self.neighbours, self.threshold)

    def mechanism(self, dim: int, clip: float, parties: int, per_party: int = 1):
        """The discrete mechanism of one hospital's update (the same the server computes: public inputs)."""
        return self.mechanisms(dim, clip, parties, per_party)[0]

    def mechanisms(self, dim: int, clip: float, parties: int, per_party: int = 1) -> list:
        """The round's discrete mechanisms, in the order their encodings are concatenated before masking:
        the update (``dim`` coordinates, bound ``clip``), then with adaptive clipping the centred unclipped
        fraction (one coordinate, bound ½), then with adaptive intermediaries the clipped norm sum (bound
        ``clip``). The sub-client privacy unit (``per_party`` = v sub-clients): ``clip`` is one sub-client's
        bound C and each sub-client's update, unclipped indicator (0 or 1, bound 1: the central analysis's
        sub-client count sensitivity, so a sub-client replaced by one that needs no clipping is covered too;
        the same noise std σ_b) and clipped norm is a summand of its own, rounded on its own
        (:func:`silofl.privacy.discrete.encode_parts`): one sub-client moves the hospital's integer sum by one
        rounded summand, the sensitivity the noise is calibrated to and the accountant uses."""
        from silofl.privacy.discrete import calibrate

        def one(d: int, c: float, z: float):
            return calibrate(
                dim=d,
                clip=c,
                bits=self.bits,
                parties=parties,
                min_survivors=self.min_survivors,
                noise_multiplier=z,
                per_party=per_party,
            )

        out = [one(dim, clip, self.noise_multiplier)]
        if self.count_noise_multiplier is not None:  # relative to ½; per sub-client: the indicator, bound 1
            if self.privacy_unit == "subclient":
                out.append(one(1, 1.0, self.count_noise_multiplier / 2))
            else:
                out.append(one(1, 0.5, self.count_noise_multiplier))
        if self.norm_noise_multiplier is not None:
            out.append(one(1, clip, self.norm_noise_multiplier))
        return out


class SubclientSite(Site):
    """Trains its sub-clients, clips, sends one message; holds the broadcast global model."""

    def __init__(
        self, cid: int, x: torch.Tensor, y: torch.Tensor, spec: ModelSpec, settings: SubclientSettings
    ):
        super().__init__(cid)
        self.settings, self.spec = settings, spec
        self.x, self.y = x, y
        _, seed_sample, _, _ = party_seeds(
            settings.seed, cid
        )  # the split and local shuffles (not a DP mechanism)
        self.generator = torch.Generator().manual_seed(seed_sample)
        self.perm = torch.randperm(self.n, generator=self.generator).to(x.device)
        self.model = spec.build().to(x.device)
        self.v, self.clip, self.tau, self.selected = 1, settings.clip, 1.0, False
        self.eps = {"hospital": 0.0, "subclient": 0.0}
        self.token: object = None
        self.rounds_trained = 0
        self.last_parts: list[tuple[torch.Tensor, float, float]] = []
        self.secure_rng = None
        if settings.secure is not None:
            from silofl.privacy.discrete import DiscreteRandom

            # the site's own noise: secret unless this is a seeded research run
            seed_noise = None if settings.seed is None else party_seeds(settings.seed, cid)[2]
            self.secure_rng = DiscreteRandom(seed_noise)

    @property
    def n(self) -> int:
        return len(self.y)

    # ------------------------------------------------------------------ steps
    def receive_global(self, packet: Packet, rnd: int) -> None:
        """Take the server's broadcast (model and round parameters); raises PeerModelRejected."""
        tensors, s, _ = read_model(
            packet.data, dict(self.model.state_dict()), BROADCAST, expect={"round": rnd, "src": packet.src}
        )
        v = int(round(s[V]))
        if v < 1 or v > self.n // self.settings.batch_size or s[CLIP] <= 0 or s[TAU] <= 0:
            raise PeerModelRejected(f"invalid round parameters v={s[V]}, clip={s[CLIP]}, tau={s[TAU]}")
        self.model.load_state_dict(tensors)
        self.v, self.clip, self.tau, self.selected = v, s[CLIP], s[TAU], s[SELECTED] > 0.5
        self.eps = {"hospital": s[EPS_H], "subclient": s[EPS_S]}
        self.token = ("server", rnd)

    def can_continue(self) -> bool:
        return True  # the budget is the server's (central DP)

    def train(self, rnd: int) -> bytes:
        """One round of local SGD on every sub-client; the update message (wire bytes)."""
        total, unclipped, norm_sum, units, steps = self.train_vectors(rnd)
        return encode(
            {
                "update": total,
                UNCLIPPED: torch.tensor(unclipped, dtype=torch.float64),
                NORM_SUM: torch.tensor(norm_sum, dtype=torch.float64),
                UNITS: torch.tensor(float(units), dtype=torch.float64),
                STEPS: torch.tensor(float(steps), dtype=torch.float64),
            },
            meta={"round": rnd, "src": self.cid, "v": self.v},
        )

    def train_vectors(self, rnd: int) -> tuple[torch.Tensor, float, float, int, int]:
        """One round of local SGD on every sub-client: the sum of the clipped updates, the unclipped count
        (hospital unit: fraction), the clipped norm sum, the privacy units and the local steps."""
        s = self.settings
        start = {k: v.detach().clone() for k, v in self.model.named_parameters()}
        shards = subclient_shards(self.perm, self.v)
        results = local_updates(
            self.model,
            start,
            self.x,
            self.y,
            shards,
            s.local_epochs,
            s.batch_size,
            s.local_lr,
            self.generator,
            prox_mu=s.prox_mu,
        )
        total = torch.zeros_like(flat(start))
        unclipped = norm_sum = raw_norm_sum = 0.0
        steps = 0
        # secure aggregation, sub-client unit: every sub-client's clipped update, unclipped indicator and
        # clipped norm, encoded as summands of their own (SecureSiteSettings.mechanisms)
        keep = s.secure is not None and s.privacy_unit == "subclient"
        parts: list[tuple[torch.Tensor, float, float]] = []
        for delta, tau_j in results:
            if s.normalise:
                delta = delta * (self.tau / tau_j)
            if s.private:
                delta, norm = clip_update(delta, self.clip)
                flag, clipped_norm = float(norm <= self.clip), min(norm, self.clip)
            else:
                norm = float(torch.linalg.vector_norm(delta))
                flag, clipped_norm = 0.0, norm
            unclipped += flag
            norm_sum += clipped_norm
            if keep:
                parts.append((delta, flag, clipped_norm))
            raw_norm_sum += norm
            total += delta
            steps += tau_j
        self.last_parts = parts
        units = 1 if s.privacy_unit == "hospital" else self.v
        if s.privacy_unit == "hospital":
            unclipped /= self.v  # the fraction: one hospital moves the count by at most 1
        self.rounds_trained += 1
        self.last_train = {
            "subclients": self.v,
            "local_steps": steps,
            "update_norm_mean": raw_norm_sum / self.v,
        }
        return total, unclipped, norm_sum, units, steps

    def reject(self, rnd: int, packet: Packet, err: Exception) -> dict:
        """A broadcast that fails validation: log it and sit the next round out."""
        log.warning("client %d rejected the global model in round %d: %s", self.cid, rnd, err)
        self.selected = False
        return {"round": rnd, "client": self.cid, "src": packet.src, "reason": str(err)}

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return {
            **super().state_dict(),
            "model": self.model.state_dict(),
            "generator": self.generator.get_state(),
            "perm": self.perm,
            "v": self.v,
            "clip": self.clip,
            "tau": self.tau,
            "selected": self.selected,
            "eps": self.eps,
            "rounds_trained": self.rounds_trained,
            "last_train": self.last_train,
            **({"secure_rng": self.secure_rng.state_dict()} if self.secure_rng is not None else {}),
        }

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.model.load_state_dict(state["model"])
        self.generator.set_state(state["generator"])
        self.perm = state["perm"].to(self.x.device)
        self.v, self.clip, self.tau = int(state["v"]), float(state["clip"]), float(state["tau"])
        self.selected, self.eps = bool(state["selected"]), dict(state["eps"])
        self.rounds_trained, self.last_train = int(state["rounds_trained"]), dict(state["last_train"])
        if self.secure_rng is not None and "secure_rng" in state:
            self.secure_rng.load_state_dict(state["secure_rng"])
        self.token = object()

    # ------------------------------------------------------------------ reporting
    def evaluate(self, x, y, cache=None) -> dict[str, float]:
        """``global_acc`` with the other metrics of the same pass (``global_auroc``, …)."""
        return prefixed("global_acc", self.cached_scores(self.token, self.model, x, y, cache))

    def metric_label(self, key: str) -> str:
        if key in ("subclients", "local_steps"):  # set by the server's privatised v and the public sizes
            return PUBLIC
        if key == "global_acc" and self.settings.private:
            return DP  # the global model is the server's DP release
        return NONPRIVATE  # e.g. the mean norm of the un-clipped updates

    def epsilon(self) -> float | None:
        """The ε the server announced for the run's privacy unit (the server accounts: central DP)."""
        return self.eps[self.settings.privacy_unit] if self.settings.private else None

    def architectures(self) -> dict[str, str]:
        return {"global": self.spec.name}

    def privacy_report(self) -> dict:
        return {
            "client": self.cid,
            "n": self.n,
            "rounds_trained": self.rounds_trained,
            "left_at": self.left_at,
        }

    def final_models(self):
        return {"global": (self.model, self.spec)}
