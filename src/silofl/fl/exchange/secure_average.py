"""FedAvg and FML with secure aggregation: the server learns only the weighted sum of the sites' model
deltas, never one site's model (:mod:`silofl.fl.exchange.secure_round` runs the protocol).

Each round a participating site trains as usual (example-level DP-SGD: its upload is DP already, the
example-level ε is unchanged), takes its shared model's move Δ_k = θ_k − θ_k⁰ over the round, scales it by
its weight w_k, and encodes w_k·Δ_k into the group Z_(2^bits) with
:func:`silofl.privacy.discrete.exact_range`: the vector is clipped to the documented range bound R
(``secagg_range``, an L2 norm; a site whose move is longer is clipped to R and says so in its log — post-
processing of a DP release, never a silent wrap-around), rotated, scaled by γ = (2^(bits−1) − 1 − n)/(n·R)
and randomly rounded, so the sum of the n participants' encodings provably stays inside the group. No noise
is added: the uploads are DP at the site. The masked encodings go to the server, the survivors unmask, and
the server decodes Σ_k w_k·Δ_k over the survivors, divides by Σ_k w_k over them and steps the global model
(its optimizer, if any, on that mean, as without secure aggregation). Fewer survivors than
``secagg_min_survivors`` (at least 2): the round is abandoned, nothing is released and the global model
stays.

Weights: w_k = n_k / max_j n_j over the round's participants (or 1 with ``aggregation: uniform``), from the
data sizes every site announces in ``hello`` — public today (FedAvg's weights without secure aggregation),
so the weighting reveals nothing new; who takes part in a round is public to the server, as in every
secure aggregation protocol.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from silofl.comm.messages import Message
from silofl.core.errors import ConfigError
from silofl.core.randomness import party_seeds
from silofl.fl.coordinator import RoundEvents
from silofl.fl.exchange.centralized import Centralized, CentralSite
from silofl.fl.exchange.secure_round import SecAggOptions, SecureParty, SecureRound, plausible
from silofl.fl.options import MethodOptions

log = logging.getLogger("silofl")

__all__ = [
    "NoisePlacementOptions",
    "SecureAverageSettings",
    "SecureAveragingOptions",
    "SecureCentralSite",
    "SecureCentralized",
]


@dataclass(frozen=True)
class SecureAverageSettings:
    """Secure aggregation of averaged models: the group, the thresholds and the range bound R."""

    bits: int
    min_survivors: int
    neighbours: int | None
    threshold: int | None
    range: float

    def protocol(self):
        """These settings as the protocol's :class:`~silofl.secure.SecAggSettings`."""
        from silofl.secure import SecAggSettings

        return SecAggSettings(self.bits, self.min_survivors, self.neighbours, self.threshold)

    def mechanism(self, dim: int, parties: int):
        """The round's encoding (the same at every site and the server: public inputs only)."""
        from silofl.privacy.discrete import exact_range

        return exact_range(
            dim=dim, clip=self.range, bits=self.bits, parties=parties, min_survivors=self.min_survivors
        )


@dataclass
class NoisePlacementOptions(MethodOptions):
    """Where an example-level method averaged by a server adds its DP noise (``noise_placement``): each site
    its own (local), or a share of one pooled mechanism's through the secure sum (pooled,
    :mod:`silofl.fl.exchange.pooled`) where the method :attr:`supports_pooled` — else refused with its
    :attr:`pooled_refusal`."""

    noise_placement: str = dataclasses.field(
        default="local",
        metadata={
            "help": "Example-level methods averaged by a server: local (each site's DP-SGD adds its own full "
            "noise) | pooled (with --secure-aggregation: each site adds a share of one pooled DP-GD step's "
            "noise, full batch; silofl.fl.exchange.pooled).",
            "panel": "privacy",
        },
    )

    supports_pooled: ClassVar[bool] = False  # a method whose sites and server take pooled noise says so
    # why a method refuses pooled noise (one line; None: the generic refusal)
    pooled_refusal: ClassVar[str | None] = None

    def resolve(self, run: Any):
        q, steps = getattr(self, "sample_rate", 1.0), getattr(self, "local_steps", 1)
        if self.noise_placement == "pooled" and (q is None or steps is None):
            filled = {"sample_rate": 1.0 if q is None else q, "local_steps": 1 if steps is None else steps}
            return dataclasses.replace(self, **filled).resolve(run)  # type: ignore[arg-type]
        return super().resolve(run)

    def validate_pooled(self, run: Any) -> None:
        """One-line ConfigErrors for what pooled noise does not cover (module doc of
        :mod:`silofl.fl.exchange.pooled`)."""
        if not self.supports_pooled:
            raise ConfigError(
                self.pooled_refusal or "noise_placement pooled is not implemented for this method"
            )
        if not getattr(run, "secure_aggregation", False):
            raise ConfigError(
                "noise_placement pooled needs --secure-aggregation: the server may see only the sum"
            )
        if run.privacy == "off":
            raise ConfigError("noise_placement pooled places DP noise: it needs privacy on")
        if getattr(run, "target_epsilons", None):
            raise ConfigError(
                "noise_placement pooled: every site adds a share of one noise, so one target_epsilon"
            )
        if getattr(self, "sample_rate", 1.0) != 1.0:
            raise ConfigError(
                "noise_placement pooled takes full-batch steps (sample_rate 1): no analysis of the "
                "subsampled discrete mechanism is implemented, so no amplification can be claimed"
            )
        if getattr(self, "local_steps", 1) != 1:
            raise ConfigError("noise_placement pooled takes one pooled step a round: local_steps must be 1")
        if getattr(self, "optimizer", "sgd") != "sgd" or getattr(self, "augmult", 0):
            raise ConfigError(
                "noise_placement pooled steps at the server with SGD on the pooled gradient (momentum: "
                "server_momentum): set optimizer sgd, and no augmult"
            )

    def validate(self, run: Any) -> None:
        super().validate(run)
        if self.noise_placement not in ("local", "pooled"):
            raise ConfigError(
                f"unknown noise_placement {self.noise_placement!r}; choose one of: local, pooled"
            )
        if self.noise_placement == "pooled":
            self.validate_pooled(run)


@dataclass
class SecureAveragingOptions(NoisePlacementOptions, SecAggOptions):
    """FedAvg's and FML's secure aggregation settings (used with the run's ``secure_aggregation``; the shared
    ones: :class:`SecAggOptions`)."""

    secagg_bits: int = dataclasses.field(
        default=32,
        metadata={
            "help": "--secure-aggregation, methods averaged by a server: bits per coordinate (default 32: "
            "the wire carries 32 bits per coordinate up to 32).",
            "panel": "privacy",
        },
    )
    secagg_range: float = dataclasses.field(
        default=100.0,
        metadata={
            "help": "--secure-aggregation, methods averaged by a server: the L2 bound R on a site's weighted "
            "model move per round; a longer move is clipped to R at the site (logged), the sum never wraps "
            "around.",
            "panel": "privacy",
        },
    )

    def secure_average(self, run: Any) -> SecureAverageSettings | None:
        """The sites' and the server's settings (None when secure aggregation is off)."""
        if not getattr(run, "secure_aggregation", False):
            return None
        return SecureAverageSettings(
            bits=self.secagg_bits,
            min_survivors=self.min_survivors(run),
            neighbours=self.secagg_neighbours,
            threshold=self.secagg_threshold,
            range=float(self.secagg_range),
        )

    def validate(self, run: Any) -> None:
        super().validate(run)
        if not getattr(run, "secure_aggregation", False):
            return
        if not (math.isfinite(self.secagg_range) and self.secagg_range > 0):
            raise ConfigError(f"secagg_range must be positive and finite, got {self.secagg_range}")
        self.check_secure(run, lambda: self.secure_average(run))


def _float_keys(state: dict[str, torch.Tensor]) -> list[str]:
    return [k for k, v in state.items() if v.is_floating_point()]


def _flat(state: dict[str, torch.Tensor], keys: list[str]) -> np.ndarray:
    return torch.cat([state[k].detach().reshape(-1).double().cpu() for k in keys]).numpy()


class SecureCentralSite(SecureParty, CentralSite):
    """A FedAvg / FML site that uploads only masked encodings of its weighted model move (module doc)."""

    secure: SecureAverageSettings | None = None
    secure_rng: Any = None
    range_clipped = 0  # rounds whose move exceeded the range bound R and was clipped

    def enable_secure(self, settings: SecureAverageSettings, seed: int | None) -> None:
        """Turn secure aggregation on with ``settings``; the rounding's randomness is the site's own (secret
        unless this is a seeded research run)."""
        from silofl.privacy.discrete import DiscreteRandom

        self.secure = settings
        self.secure_rng = DiscreteRandom(None if seed is None else party_seeds(seed, self.cid, 5)[4])

    def secure_protocol(self):
        return self.secure.protocol() if self.secure is not None else None

    def on_train_upload(self, msg: Message) -> Message:
        """Train one round and upload the masked encoding of the weighted move; a plain upload (the
        model in the clear) is refused while secure aggregation is on at this site."""
        if self.secure is None:
            return super().on_train_upload(msg)
        from silofl.privacy.discrete import encode
        from silofl.secure import SecAggRefused

        rnd, server = int(msg.meta["round"]), int(msg.meta["server"])
        try:
            parts, graph_seed, rseed = self.secure_request(msg, "model")  # refused before training
            w = self._weight(msg.meta)
            keys = _float_keys(self.shared.state_dict())
            dim = sum(self.shared.state_dict()[k].numel() for k in keys)
            try:
                mech = self.secure.mechanism(dim, len(parts))
            except ConfigError as e:
                raise SecAggRefused(str(e)) from None
            before = _flat(self.shared.state_dict(), keys)
            self.train(rnd)
            x = w * (_flat(self.shared.state_dict(), keys) - before)
            norm = float(np.linalg.norm(x))
            if not math.isfinite(norm):
                raise SecAggRefused("the model's move is not finite")
            if norm > self.secure.range:
                self.range_clipped += 1
                log.warning(
                    "client %d, round %d: its weighted model move has norm %.4g, above the secure "
                    "aggregation range %g: clipped to it",
                    self.cid,
                    rnd,
                    norm,
                    self.secure.range,
                )
            enc = encode(x, mech, rotation_seed=rseed, rng=self.secure_rng)
            return self.secure_upload(rnd, server, enc, parts, graph_seed)
        except (SecAggRefused, ValueError, RuntimeError) as e:
            return self._refuse("mask", rnd, str(e))

    def _weight(self, meta: dict) -> float:
        from silofl.secure import SecAggRefused

        if meta.get("uniform"):
            return 1.0
        scale = meta.get("weight_scale")
        if not isinstance(scale, int | float) or isinstance(scale, bool) or not scale >= self.n > 0:
            raise SecAggRefused(f"weight scale {scale!r}: not a number at least this site's size {self.n}")
        return float(self.n) / float(scale)


class SecureCentralized(Centralized):
    """The averaging server with secure aggregation (module doc): it decodes only the survivors' sum."""

    def __init__(
        self,
        cfg,
        n_sites: int,
        spec,
        device,
        settings: SecureAverageSettings,
        uniform: bool = False,
        server_optimizer: str | None = None,
    ):
        super().__init__(cfg, n_sites, spec, device, uniform=uniform, server_optimizer=server_optimizer)
        self.secure = settings
        state = self.server.state()
        self.float_keys = _float_keys(state)
        self.dim = sum(state[k].numel() for k in self.float_keys)
        mech = settings.mechanism(self.dim, n_sites)  # ConfigError now, not in round 1
        seeded = cfg.seed is not None
        rng = random.Random(party_seeds(cfg.seed, n_sites)[2]) if seeded else random.SystemRandom()
        self.secagg = SecureRound(settings.protocol(), mech.padded_dim(), rng)
        self.released = self.abandoned = 0
        self.history: list[dict] = []

    ROUND_LABEL = "secure aggregation"  # how the log names an abandoned round

    def run_round(self, rnd: int) -> RoundEvents:
        """One secure round: the chosen sites' masked uploads, the survivors' sum decoded and released
        (:meth:`_release`), or the round abandoned with nothing released."""
        events = RoundEvents()
        active = self.retire(rnd, events)
        if not active:
            return events
        chosen = self.secagg.participants(self, active, events)
        stats: dict = {"round": rnd, "participants": len(chosen)}
        try:
            mech, meta = self._round_mechanism(chosen)
            res = self.secagg.run(self, rnd, chosen, events, meta=meta)
            total, reason = res.total, res.reason
        except ConfigError as e:
            total, reason = None, str(e)
        if total is None:
            self.abandoned += 1
            stats.update({"abandoned": True, "reason": reason})
            log.warning("%s: round %d abandoned: %s — nothing released", self.ROUND_LABEL, rnd, reason)
        else:
            self._release(rnd, mech, res, stats, meta)
        self.history.append(stats)
        self.broadcast(rnd, active, events)
        return events

    def _round_mechanism(self, chosen: list[int]) -> tuple[Any, dict | None]:
        """The round's discrete mechanism for ``chosen`` and the meta its uploads carry (ConfigError: the
        round is abandoned)."""
        sizes = [float(self.info[k]["n"]) for k in chosen]
        meta = {"uniform": self.uniform, "weight_scale": max(sizes, default=1.0)}
        return self.secure.mechanism(self.dim, max(1, len(chosen))), meta

    def _release(self, rnd: int, mech: Any, res: Any, stats: dict, meta: dict | None) -> None:
        """Decode the survivors' weighted sum, check it is plausible, move the global model by its mean."""
        from silofl.privacy.discrete import decode

        self.released += 1
        assert res.rotation_seed is not None and meta is not None
        released = torch.from_numpy(decode(res.total, mech, rotation_seed=res.rotation_seed))
        stats["survivors"] = len(res.survivors)
        stats["step"] = plausible(released, mech, len(res.survivors), rnd)
        if stats["step"]:
            scale = meta["weight_scale"]
            weights = [1.0 if self.uniform else float(self.info[k]["n"]) / scale for k in res.survivors]
            self._apply(rnd, released / sum(weights))

    def _apply(self, rnd: int, mean: torch.Tensor) -> None:
        """The global model moves by the decoded mean move (through the server optimizer, if any)."""
        from silofl.training.local_sgd import unflat

        srv = self.server
        current = {k: v.detach().clone() for k, v in srv.state().items()}
        w = torch.cat([current[k].reshape(-1).double() for k in self.float_keys])
        moved = unflat(w + mean.to(w.device), {k: current[k] for k in self.float_keys})
        average = {k: moved[k].to(current[k].dtype) if k in moved else current[k] for k in current}
        if srv.opt is not None:
            average = srv._server_step(current, average)
        srv.model.load_state_dict(average, strict=srv.keys is None)
        srv.version = rnd

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.released = int(state.get("secure_released", 0))
        self.abandoned = int(state.get("secure_abandoned", 0))
        self.secagg.keys_ready = False  # sites resumed from checkpoints hold no keys: agree on new ones

    def state_dict(self) -> dict:
        return {**super().state_dict(), "secure_released": self.released, "secure_abandoned": self.abandoned}

    def round_history(self) -> list[dict]:
        return self.history

    def privacy_summary(self) -> dict:
        s, n = self.secure, self.n_sites
        proto = s.protocol()
        k = proto.degree(n)
        return {
            "secure_aggregation": True,
            "noise_placement": "site: example-level DP-SGD (each upload is DP before it is masked)"
            if self.cfg.is_private
            else "none (no DP)",
            "server_sees": "only the weighted sum of the surviving sites' model moves (quantised), never one "
            "site's model",
            "epsilon_vs_server": None,
            "min_survivors": s.min_survivors,
            "bits_per_coordinate": s.bits,
            "secagg_range": s.range,
            "secagg_neighbours": k,
            "secagg_threshold": proto.shares_needed(k),
            "rounds_released": self.released,
            "rounds_abandoned": self.abandoned,
            "note_secure_aggregation": (
                "the example-level ε (each site's, above) is unchanged and holds against the server too: "
                "every upload is DP at its site; secure aggregation adds that the server sees only the sum "
                "of the survivors' weighted model moves (weights from the public data sizes), each clipped "
                "to secagg_range and encoded so that the sum never wraps around the group. Abandoned rounds "
                "released nothing."
            ),
        }
