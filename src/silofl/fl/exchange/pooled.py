"""Pooled noise for example-level methods under secure aggregation (``noise_placement: pooled``; issue 44).

Without pooling, FedAvg with one local DP step a round is DP-GD on the pooled data with every site adding its
*own* full noise: the average carries √K times the noise of one pooled mechanism. With secure aggregation the
server learns only the sum, so each site adds a *share* (Heikkilä et al., "Differentially private cross-silo
federated learning", 2020; the discrete noise of Agarwal, Kairouz & Liu, NeurIPS 2021):

1. every participating site clips each of its examples' gradients to C and sums them over all its rows
   (full batch, q = 1: no amplification by subsampling is claimed);
2. it encodes the float sum into Z_(2^bits) (:func:`silofl.privacy.discrete.encode_sum`: rotation, scale γ,
   plain randomised rounding) and adds a Skellam share of variance (z·C·γ)²/m, so that the m sites of the
   survivors floor (``secagg_min_survivors``) carry the noise of one pooled DP-GD step of multiplier z;
3. it masks the encoding (:mod:`silofl.secure`), the survivors unmask, and the server decodes only the sum;
4. the server divides by the survivors' pooled batch Σ n_k (public sizes, as FedAvg's weights) and steps:
   Δ = −lr·(ĝ + weight_decay·w), then its optimizer (server momentum) as FedAvg does on the average move.

Accounting (each site, from the mechanisms it ran; :func:`silofl.privacy.discrete.epsilon_per_threat`): the
unit is one example (row) of the site; against outsiders and the server the whole noise of the survivors
floor counts, against the server plus c colluding sites only the m − c honest survivors' shares (c from the
site's policy; 1 in the simulator unless set). A round whose survivors fall below the floor releases
nothing. Each pooled round a site masks is one ledger entry ``secagg-discrete`` with ``unit: "row"`` and
``placement: "secure"`` (counted when uploaded, whether or not the server decodes: it can only over-count).
Budget-first runs calibrate z on the discrete mechanism itself (:func:`calibrate_for_epsilon`), so the ε
printed is the one that ran, rounding and the group included.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from silofl.comm.messages import Message
from silofl.core.errors import BudgetExhausted, ConfigError
from silofl.fl.exchange.secure_average import SecureCentralized, SecureCentralSite

log = logging.getLogger("silofl")

__all__ = ["LEDGER_KIND", "PooledCentralized", "PooledSettings", "PooledSite", "pooled_settings"]

LEDGER_KIND = "secagg-discrete"  # the kind client-level secure rounds write too (SEAMS, Seam 2)
DEFAULT_COLLUDERS = 1  # the colluding sites a simulated site assumes when no policy says otherwise
CHUNK = 512  # rows per clipped-sum pass (bounds the memory of per-example gradients)


@functools.lru_cache(maxsize=64)
def _mechanism(
    dim: int,
    clip: float,
    bits: int,
    parties: int,
    min_survivors: int,
    rows: int,
    z: float | None,
    target: float | None,
    rounds: int,
    delta: float,
):
    """The pooled mechanism, budget-first (``target``: z calibrated on the discrete accountant for
    ``rounds``) or with a given ``z``; cached: every site and the server compute the same public one."""
    from silofl.privacy.discrete import calibrate_for_epsilon, calibrate_pooled

    kw = dict(dim=dim, clip=clip, bits=bits, parties=parties, min_survivors=min_survivors)
    if target is not None:
        return calibrate_for_epsilon(target, delta=delta, rounds=rounds, rows=rows, **kw)  # type: ignore[arg-type]
    assert z is not None
    return calibrate_pooled(noise_multiplier=z, rows=rows, **kw)  # type: ignore[arg-type]


@dataclass(frozen=True)
class PooledSettings:
    """The pooled mechanism's public settings, the same at every site and the server."""

    bits: int
    min_survivors: int
    neighbours: int | None
    threshold: int | None
    clip: float
    rows: int  # the most rows a site sums (the group is sized for parties × rows examples at C)
    noise_multiplier: float | None  # z, given; None: calibrated from target_epsilon
    target_epsilon: float | None
    rounds: int
    delta: float

    def protocol(self):
        """These settings as the protocol's :class:`~silofl.secure.SecAggSettings`."""
        from silofl.secure import SecAggSettings

        return SecAggSettings(self.bits, self.min_survivors, self.neighbours, self.threshold)

    def mechanism(self, dim: int, parties: int):
        """The round's :func:`~silofl.privacy.discrete.calibrate_pooled` mechanism for ``parties`` sites."""
        return _mechanism(
            int(dim),
            float(self.clip),
            int(self.bits),
            int(parties),
            int(self.min_survivors),
            int(self.rows),
            self.noise_multiplier,
            self.target_epsilon,
            int(self.rounds),
            float(self.delta),
        )


def pooled_settings(opts: Any, plan: Any) -> PooledSettings:
    """The run's pooled settings (``opts``: SecureAveragingOptions with ``noise_placement: pooled``)."""
    sizes = tuple(getattr(plan, "site_sizes", ()) or ())
    rows = max(sizes) if sizes else getattr(plan, "samples_per_client", None)
    if not rows:
        raise ConfigError(
            "noise_placement pooled needs the sites' sizes (samples_per_client) to size the group"
        )
    target = plan.target_epsilon if getattr(plan, "noise_calibrated", False) else None
    return PooledSettings(
        bits=opts.secagg_bits,
        min_survivors=opts.min_survivors(plan),
        neighbours=opts.secagg_neighbours,
        threshold=opts.secagg_threshold,
        clip=float(plan.clip),
        rows=int(rows),
        noise_multiplier=None if target is not None else float(plan.noise_multiplier),
        target_epsilon=float(target) if target is not None else None,
        rounds=int(plan.rounds),
        delta=float(plan.delta),
    )


def _param_keys(model: torch.nn.Module) -> list[str]:
    """The model's float state keys, refused unless they are exactly its trainable parameters (pooled noise
    releases gradients; a float buffer would move without a gradient)."""
    state = [k for k, v in model.state_dict().items() if v.is_floating_point()]
    params = [n for n, p in model.named_parameters() if p.requires_grad]
    if state != params:
        raise ConfigError(
            "noise_placement pooled releases gradients: the shared model must hold only trainable float "
            f"parameters (it has {sorted(set(state) ^ set(params))[:3]} besides)"
        )
    return params


# ---------------------------------------------------------------------------------------------- site side
class PooledSite(SecureCentralSite):
    """A FedAvg site that uploads the masked encoding of its clipped full-batch gradient sum with its noise
    share (module doc), and accounts for it with the discrete mechanism that ran."""

    pooled: PooledSettings | None = None
    colluders = DEFAULT_COLLUDERS  # the site's policy sets its own (SitePolicy.colluders)

    def enable_pooled(self, settings: PooledSettings, seed: int | None) -> None:
        """Turn pooled noise on; the rounding's and the noise's randomness is the site's own (secret unless
        this is a seeded research run)."""
        from silofl.core.randomness import party_seeds
        from silofl.privacy.discrete import DiscreteRandom

        if self.dp is None:
            raise ConfigError("noise_placement pooled is a DP mechanism: it needs privacy on")
        self.pooled = settings
        self.secure_rng = DiscreteRandom(None if seed is None else party_seeds(seed, self.cid, 5)[4])
        self.param_keys = _param_keys(self.shared)
        self.dim = sum(int(self.shared.state_dict()[k].numel()) for k in self.param_keys)
        self.released_mechs: list = []  # the mechanism of every round this site masked (this run)

    def secure_protocol(self):
        return self.pooled.protocol() if self.pooled is not None else super().secure_protocol()

    # ------------------------------------------------------------------ accounting
    def pooled_epsilons(self, extra: list | None = None) -> dict[str, float]:
        """ε per threat (:data:`~silofl.privacy.discrete.THREATS`) of the rounds this site masked (plus
        ``extra`` mechanisms), one example the unit."""
        from silofl.privacy.discrete import epsilon_per_threat

        assert self.pooled is not None
        return epsilon_per_threat(
            [*self.released_mechs, *(extra or [])],
            rounds=1,
            delta=self.pooled.delta,
            colluders=int(self.colluders),
        )

    def _fits_budget(self, mech) -> bool:
        target = self.settings.target_epsilon
        return target is None or self.pooled_epsilons([mech])["server"] <= target * (1 + 1e-6)

    def _require_lifetime(self, mech) -> None:
        """SecAggRefused when the round would take the site past the lifetime budget of its ledger: its one
        accountant, every mechanism the ledger records (DP-SGD, releases, secure rounds) composed."""
        from silofl.privacy.site_accountant import SiteAccountant, planned_secure
        from silofl.secure import SecAggRefused

        books = SiteAccountant(self.ledger, colluders=int(self.colluders))
        if books.lifetime is None:  # a simulated site without a folder: its run's budget alone
            return
        try:
            books.require([planned_secure([mech], unit="row")], what="this pooled round")
        except BudgetExhausted as e:
            raise SecAggRefused(str(e)) from None

    def can_continue(self) -> bool:
        if self.pooled is None:
            return super().can_continue()
        return self._fits_budget(self.pooled.mechanism(self.release_dim(), max(self.pooled.min_survivors, 1)))

    def release_dim(self) -> int:
        """The length of the vector this site releases each round (the model's gradient)."""
        return self.dim

    def epsilon(self) -> float | None:
        if self.pooled is None:
            return super().epsilon()
        return self.pooled_epsilons()["server"]

    def privacy_report(self) -> dict:
        rep = super().privacy_report()
        if self.pooled is None:
            return rep
        eps = self.pooled_epsilons()
        last = self.released_mechs[-1] if self.released_mechs else None
        return {
            **rep,
            "accountant": "skellam-rdp (silofl.privacy.discrete: the pooled mechanism that ran)",
            "noise_placement": "pooled",
            "placement": "secure",
            "unit": "row",
            "epsilon": eps["server"],
            "epsilon_vs_outsiders": eps["outsiders"],
            "epsilon_vs_server": eps["server"],
            "epsilon_vs_server_plus_colluders": eps["colluders"],
            "colluders": int(self.colluders),
            "noise_multiplier": last.noise_multiplier() if last is not None else None,
            "rounds_within_budget": None,
            "sample_rate": 1.0,
            "steps": len(self.released_mechs),
            "pooled_rounds": len(self.released_mechs),
            "delta": self.pooled.delta,
        }

    # ------------------------------------------------------------------ the round
    def clipped_sum(self) -> np.ndarray:
        """Σ_i clip_C(∇ℓ_i) over all this site's rows (float64, the parameters' order), no noise."""
        assert self.dp is not None
        named = dict(self.shared.named_parameters())
        total = {k: torch.zeros_like(named[k], dtype=torch.float64) for k in self.param_keys}
        for lo in range(0, self.n, CHUNK):
            xb, yb = self.x[lo : lo + CHUNK], self.y[lo : lo + CHUNK]
            no_logp = torch.zeros(len(yb), 1, device=xb.device)
            _, grads, _ = self.dp.clipper.clipped_sum(xb, self._shared_loss, (yb, no_logp), self.dp.clip)
            for k in self.param_keys:
                g = grads.get(named[k])
                if g is not None:
                    total[k] += g.detach().double()
        return torch.cat([total[k].reshape(-1).cpu() for k in self.param_keys]).numpy()

    def on_train_upload(self, msg: Message) -> Message:
        """The masked encoding of this site's clipped gradient sum plus its noise share; nothing in the
        clear, nothing when the round would cross this site's budget or the group cannot hold it."""
        if self.pooled is None:
            return super().on_train_upload(msg)
        from silofl.privacy.discrete import encode_sum
        from silofl.secure import SecAggRefused

        rnd, server = int(msg.meta["round"]), int(msg.meta["server"])
        try:
            parts, graph_seed, rseed = self.secure_request(msg, "gradient")  # refused before computing
            if self.n > self.pooled.rows:
                raise SecAggRefused(f"{self.n} rows exceed the {self.pooled.rows} the group was sized for")
            try:
                mech = self.pooled.mechanism(self.dim, len(parts))
            except ConfigError as e:
                raise SecAggRefused(str(e)) from None
            if not self._fits_budget(mech):
                raise SecAggRefused(
                    f"this round would take the site's ε above {self.settings.target_epsilon:g}"
                )
            self._require_lifetime(mech)
            enc = encode_sum(
                self.clipped_sum(),
                mech,
                rotation_seed=rseed,
                rng=self.secure_rng,
                bound=self.n * self.pooled.clip,
            )
            out = self.secure_upload(rnd, server, enc, parts, graph_seed)
        except (SecAggRefused, ValueError, RuntimeError) as e:
            return self._refuse("mask", rnd, str(e))
        if self.settings.ema_decay and self.rounds_trained > 0:
            self._commit_ema()  # the weights the last round ended with (the broadcast), as train() does
        self.record_pooled(rnd, mech)
        self.local_round(rnd)
        return out

    def local_round(self, rnd: int) -> None:
        """The round's training of the models that never leave the site (no DP: nothing of them is sent),
        against the shared model received — which pooled noise never moves at the site. Here: a private
        model trained by mutual learning (FML) takes the round's steps on the KL to the shared model's
        outputs, as its partner steps do without pooling; a method training its own way (Ditto's personal
        model, APFL's mixture) overrides this."""
        from silofl.privacy.sampling import poisson_batch
        from silofl.training import dml_loss
        from silofl.training.poisson import partner_view

        if self.private is None or self.private_opt is None or not self.mutual_learning_partner:
            return
        self.private.train()
        for _ in range(self.steps_per_round):
            idx = poisson_batch(self.n, self.sample_rate, self.sampler).to(self.x.device)
            if not len(idx):
                continue
            xb, yb = self.x[idx], self.y[idx]
            with torch.no_grad():
                view = partner_view(self.shared(xb), yb)
            loss = dml_loss(self.private(xb), yb, view, self.alpha).mean()
            self.private_opt.zero_grad(set_to_none=True)
            loss.backward()
            self.private_opt.step()

    def record_pooled(self, rnd: int, mech) -> None:
        """The round in this site's books: its ledger first (durably), then the run's list."""
        if self.ledger is not None:
            self.ledger.append(
                LEDGER_KIND,
                run=self.run_label,
                round=rnd,
                mechanisms=[mech.to_dict()],
                unit="row",
                placement="secure",
            )
        self.released_mechs.append(mech)
        self.rounds_trained += 1

    def state_dict(self) -> dict:
        out = super().state_dict()
        if self.pooled is not None:
            out["pooled_mechanisms"] = [m.to_dict() for m in self.released_mechs]
            out["secure_rng"] = self.secure_rng.state_dict()
        return out

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if self.pooled is not None:
            from silofl.privacy.discrete import DiscreteMechanism

            self.released_mechs = [DiscreteMechanism.from_dict(m) for m in state.get("pooled_mechanisms", [])]
            if "secure_rng" in state:
                self.secure_rng.load_state_dict(state["secure_rng"])


# ---------------------------------------------------------------------------------------------- server side
class PooledCentralized(SecureCentralized):
    """The pooled noise server: it decodes only the survivors' noisy gradient sum and steps (module doc)."""

    def __init__(
        self,
        cfg,
        n_sites: int,
        spec,
        device,
        settings: PooledSettings,
        uniform: bool = False,
        server_optimizer: str | None = None,
    ):
        super().__init__(
            cfg,
            n_sites,
            spec,
            device,
            settings,
            uniform=uniform,
            server_optimizer=server_optimizer,  # type: ignore[arg-type]
        )
        self.pooled = settings
        _param_keys(self.server.model)
        o = cfg.options
        self.lr, self.weight_decay = float(o.lr), float(o.weight_decay)
        self.released_rounds: list[dict] = []  # per released round: its survivors and mechanism

    ROUND_LABEL = "pooled noise"

    def _round_mechanism(self, chosen: list[int]) -> tuple[Any, dict | None]:
        if len(chosen) < self.pooled.min_survivors:
            raise ConfigError(
                f"{len(chosen)} site(s) with keys, below the survivors floor {self.pooled.min_survivors}"
            )
        return self.pooled.mechanism(self.dim, len(chosen)), None

    def _release(self, rnd: int, mech: Any, res: Any, stats: dict, meta: dict | None) -> None:
        """Decode the survivors' noisy gradient sum, check it is plausible, step the global model."""
        from silofl.privacy.discrete import decode, pooled_sum_bound

        self.released += 1
        assert res.rotation_seed is not None
        g = torch.from_numpy(decode(res.total, mech, rotation_seed=res.rotation_seed))
        rows = sum(int(self.info[k]["n"]) for k in res.survivors)
        bound = pooled_sum_bound(mech, self.pooled.rows, len(res.survivors))
        norm = float(torch.linalg.vector_norm(g))
        stats.update({"survivors": len(res.survivors), "pooled_rows": rows, "step": norm <= bound})
        self.released_rounds.append(
            {"round": rnd, "survivors": list(res.survivors), "mechanism": mech.to_dict()}
        )
        if norm > bound:
            log.warning(
                "pooled noise, round %d: the decoded sum's norm %.4g exceeds %.4g: no step", rnd, norm, bound
            )
            return
        w = torch.cat([self.server.state()[k].reshape(-1).double().cpu() for k in self.float_keys])
        self._apply(rnd, -self.lr * (g / rows + self.weight_decay * w))

    def state_dict(self) -> dict:
        return {**super().state_dict(), "pooled_rounds": self.released_rounds}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.released_rounds = list(state.get("pooled_rounds", []))

    def epsilon_of(self, k: int, colluders: int = 0) -> float:
        """Site ``k``'s ε against the server (plus ``colluders``) over the released rounds holding its sum."""
        from silofl.privacy.discrete import DiscreteMechanism, epsilon

        mechs = [
            DiscreteMechanism.from_dict(r["mechanism"]) for r in self.released_rounds if k in r["survivors"]
        ]
        return epsilon(mechs, rounds=1, delta=self.pooled.delta, colluders=colluders)

    def privacy_summary(self) -> dict:
        p, n = self.pooled, self.n_sites
        proto = p.protocol()
        deg = proto.degree(n)
        mech = p.mechanism(self.dim, n)
        per_site = {str(k): self.epsilon_of(k) for k in range(n)}
        return {
            "secure_aggregation": True,
            "noise_placement": "pooled: each site adds a Skellam share; the survivors floor carries the "
            "noise of one pooled DP-GD step (silofl.fl.exchange.pooled)",
            "unit": "row (one example of one site)",
            "server_decodes": "only the noisy sum of the survivors' clipped gradient sums",
            "noise_multiplier_pooled": mech.noise_multiplier(),
            "noise_calibrated_on": "the discrete accountant" if p.target_epsilon is not None else "given σ",
            "min_survivors": p.min_survivors,
            "bits_per_coordinate": p.bits,
            "secagg_neighbours": deg,
            "secagg_threshold": proto.shares_needed(deg),
            "rounds_released": self.released,
            "rounds_abandoned": self.abandoned,
            "epsilon_vs_server": max(per_site.values(), default=0.0),
            "epsilon_vs_server_per_site": per_site,
            f"epsilon_vs_server_plus_{DEFAULT_COLLUDERS}_colluders": max(
                (self.epsilon_of(k, DEFAULT_COLLUDERS) for k in range(n)), default=0.0
            ),
            "delta": p.delta,
            "sample_rate": 1.0,
            "note_pooled": (
                "ε per threat, one example of one site the unit, from the Skellam mechanism that ran "
                "(rounding and the group included, no amplification claimed: full batch): against outsiders "
                f"and the server the noise of min_survivors = {p.min_survivors} sites; against the server "
                f"plus c colluding sites that of the {p.min_survivors} − c honest ones (each site's own c in "
                "its report). Rounds with fewer survivors were abandoned and released nothing."
            ),
        }
