"""Auditing a client-level method (DP-FedAvg, DP-FedAdam, DP-FedNova, DP²-RMSProp; with intermediaries).

Client-level DP protects a whole client, so the canaries are canary *clients* (Andrew et al., "One-shot
empirical privacy estimation for federated learning", ICLR 2024): m of them, each joining the run
independently with probability ½ (Steinke et al.'s coins). A canary client is a hospital of the
protocol — it says hello with a public data size, takes every broadcast, and when selected uploads the
largest update the server accepts from one hospital: a fixed random direction u_i (unit norm, supported
on a random set of coordinates) scaled to the announced bound — its v sub-client updates all point
along u_i, each at the sub-client bound, so together they move the sum by exactly one hospital's
sensitivity (C with ``privacy_unit: hospital``; v·C with ``subclient``, where the run's own ε is per
sub-client and the canary's unit is the hospital, ``epsilon_hospital``). Real hospitals are untouched.

What the auditor sees is what the server releases: the global model it broadcasts after every round
(the noised aggregate's consequence). Scores per canary:

* ``final`` — ⟨θ_T − θ_0, u_i⟩, the final model's movement along the canary's direction;
* ``rounds`` — Σ_t of ⟨θ_t − θ_{t−1}, u_i⟩ standardised across canaries within the round (equal to
  ``final`` up to scale for DP-FedAvg with a constant server step; different for adaptive optimizers).

Random directions in a d-dimensional model are nearly orthogonal to each other and to the real
updates, so each score is about the canary's own contribution plus the server's Gaussian noise.

The canaries join the run as clients, so the server averages over more clients: the global model's
accuracy in an audit run is not the method's accuracy (the run folder records it; compare with a run
without canaries).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import numpy as np
import torch

from silofl.auditing import attacks
from silofl.auditing.bound import one_run_bound
from silofl.auditing.canaries import Pool, Rows, draw
from silofl.auditing.settings import AuditSettings
from silofl.auditing.tap import TappedEngine, model_tensors
from silofl.comm.messages import Message, Packet
from silofl.comm.wire import encode
from silofl.core.errors import ConfigError
from silofl.data import SplitData
from silofl.fl.exchange.client_level import ClientLevelSite
from silofl.models import ModelSpec
from silofl.runner.config import RunConfig
from silofl.runner.loop import RunHooks
from silofl.runner.loop import run as run_loop
from silofl.site.subclients import NORM_SUM, STEPS, UNCLIPPED, UNITS, SubclientSettings

SUPPORT = 1024  # coordinates a canary direction is spread over (all of them in a smaller model)


@dataclasses.dataclass
class Directions:
    """m sparse unit vectors in R^d: u_i has ``values[i]`` at coordinates ``support[i]``."""

    d: int
    support: np.ndarray  # [m, s] int
    values: np.ndarray  # [m, s] float, each row of unit norm

    @classmethod
    def draw(cls, m: int, d: int, seed: int) -> Directions:
        rng = np.random.default_rng(seed)
        s = min(SUPPORT, d)
        support = np.stack([rng.choice(d, size=s, replace=False) for _ in range(m)])
        values = rng.choice([-1.0, 1.0], size=(m, s)) / math.sqrt(s)
        return cls(d, support, values)

    def vector(self, i: int, norm: float) -> torch.Tensor:
        """u_i scaled to ``norm``, as one flat float32 vector of the model's size."""
        u = torch.zeros(self.d, dtype=torch.float32)
        u[torch.as_tensor(self.support[i])] = torch.as_tensor(self.values[i] * norm, dtype=torch.float32)
        return u

    def project(self, w: np.ndarray) -> np.ndarray:
        """⟨w, u_i⟩ for every canary."""
        return (w[self.support] * self.values).sum(1)


class CanaryClient(ClientLevelSite):
    """A canary hospital (module doc): no data, a public size, a crafted update of one hospital's bound."""

    def __init__(
        self, cid: int, spec: ModelSpec, settings: SubclientSettings, n_public: int, direction: torch.Tensor
    ):
        self._n = n_public
        empty_x = torch.zeros((0, *spec.input_shape))
        super().__init__(cid, empty_x, torch.zeros(0, dtype=torch.long), spec, settings)
        self.direction = direction  # unit norm

    @property
    def n(self) -> int:
        return self._n

    def train(self, rnd: int) -> bytes:
        s = self.settings
        units = 1 if s.privacy_unit == "hospital" else self.v
        # v sub-client updates along u, each exactly at the sub-client bound: one hospital's sensitivity
        total = self.v * self.clip
        update = self.direction * total
        self.rounds_trained += 1
        steps = self.v * s.local_epochs * max(1, self._n // max(1, self.v) // s.batch_size)
        return encode(
            {
                "update": update,
                UNCLIPPED: torch.tensor(0.0, dtype=torch.float64),
                NORM_SUM: torch.tensor(float(total), dtype=torch.float64),
                UNITS: torch.tensor(float(units), dtype=torch.float64),
                STEPS: torch.tensor(float(steps), dtype=torch.float64),
            },
            meta={"round": rnd, "src": self.cid, "v": self.v},
        )

    def final_models(self):
        return {}


class GlobalModelObserver:
    """Projects every broadcast global model's movement on the canary directions."""

    def __init__(self, server: int, names: list[str], directions: Directions):
        self.server, self.names, self.dirs = server, names, directions
        self.first: np.ndarray | None = None
        self.prev: np.ndarray | None = None
        self.rounds = np.zeros(len(directions.support))
        self.last_state: dict[str, torch.Tensor] | None = None
        self.broadcasts = 0

    def before(self, step: str, requests: dict[int, Message], engine: TappedEngine) -> None:
        """Nothing to see before a call: the broadcast is read after it."""
        return None

    def after(
        self, step: str, requests: dict[int, Message], replies: dict[int, Message], engine: TappedEngine
    ) -> None:
        """After ``receive_global``: project the server's broadcast model's movement on every canary."""
        if step != "receive_global":
            return
        packet: Packet | None = next(
            (p for m in requests.values() for p in m.packets if p.src == self.server), None
        )
        if packet is None:
            return
        state = model_tensors(packet)
        w = torch.cat([state[k].reshape(-1).double().cpu() for k in self.names]).numpy()
        if self.prev is not None:
            proj = self.dirs.project(w - self.prev)
            sd = float(proj.std())
            if sd > 0:
                self.rounds += (proj - proj.mean()) / sd
        else:
            self.first = w
        self.prev, self.last_state = w, state
        self.broadcasts += 1

    def final(self) -> np.ndarray:
        """The ``final`` score: ⟨θ_T − θ_0, u_i⟩ for every canary."""
        assert self.first is not None and self.prev is not None
        return self.dirs.project(self.prev - self.first)


def audit(
    cfg: RunConfig, s: AuditSettings, out: Path, progress: bool = False, console=None
) -> tuple[dict, dict]:
    """Run ``cfg`` with canary clients; (audit.json content, plot/CSV material)."""
    if s.site >= cfg.clients:
        raise ConfigError(f"--audited-site {s.site} is not one of the {cfg.clients} clients")
    # the tapped engine is in-process (one process runs every site: a simulation), so sites report their
    # non-private figures, labelled, as an in-process `silofl run` does, unless the config says otherwise
    nonprivate = cfg.report_nonprivate if cfg.report_nonprivate is not None else True
    cfg = dataclasses.replace(
        cfg.replace(out=str(out / "run"), seed=s.seed), checkpoint_every=None, report_nonprivate=nonprivate
    )
    coins = np.random.default_rng(np.random.SeedSequence(s.derived(2))).random(s.canaries) < 0.5
    from silofl.auditing.settings import AUDIT_ATTACKS, AttackContext

    extra_attacks = {name: AUDIT_ATTACKS.get(name)(s) for name in s.attacks}  # --attack NAME
    t0 = time.perf_counter()
    summary, held = _run_with_canaries(cfg, s, coins, extra_attacks, progress, console)
    run_s = time.perf_counter() - t0
    obs: GlobalModelObserver = held["observer"]
    if obs.broadcasts < 2 or obs.last_state is None:
        raise ConfigError("the server never released a model after the first round: nothing to audit")
    from silofl.runner.folder import read_config

    rc = RunConfig.from_dict(read_config(out / "run"), strict=False).resolve()
    scores = {"final": obs.final(), "rounds": obs.rounds}
    delta = rc.delta if rc.is_private else 1e-5
    bound = one_run_bound(scores, coins, delta, s.confidence, s.derived(0))

    # membership inference on the audited hospital's real examples
    t1 = time.perf_counter()
    mia = _membership_inference(held, s, rc, obs.last_state)
    attack_s = time.perf_counter() - t1
    eps_h = summary["privacy"].get("epsilon_hospital") if rc.is_private else None
    ctx = AttackContext(cfg=rc, split=held["split"], site=s.site, out=out, epsilon=eps_h)
    extra_results = {name: a.run(ctx) for name, a in extra_attacks.items()}
    seconds = {"run": run_s, "attacks": attack_s}
    return _report(s, rc, summary, held, coins, scores, bound, delta, mia, seconds, extra_results)


def _run_with_canaries(cfg: RunConfig, s: AuditSettings, coins, extra_attacks: dict, progress, console):
    """Run ``cfg`` on a tapped engine with the included canary clients added; (summary, what the run held)."""
    held: dict = {}

    def keep_split(run_cfg: RunConfig, split: SplitData) -> SplitData:
        held.update(split=split, cfg=run_cfg)
        return split

    def add_canary_clients(make, n_sites):
        rc = held["cfg"]
        o = rc.options
        spec = ModelSpec(o.proxy_model, held["split"].input_shape, held["split"].num_classes)
        names = [k for k, _ in spec.build().named_parameters()]
        d = sum(p.numel() for p in spec.build().parameters())
        dirs = Directions.draw(s.canaries, d, s.derived(3))
        settings = SubclientSettings(
            seed=rc.seed,
            batch_size=rc.batch_size,
            local_epochs=o.local_epochs,
            local_lr=o.local_lr,
            private=rc.is_private,
            privacy_unit=o.privacy_unit,
            normalise=False,
            clip=rc.clip,
        )
        n_public = max(len(p[1]) for p in held["split"].parts)
        members = [i for i in range(s.canaries) if coins[i]]
        held.update(dirs=dirs, names=names, spec=spec, n_real=n_sites, canary_ids=members)

        def make_all(k: int):
            if k < n_sites:
                return make(k)
            return CanaryClient(k, spec, settings, n_public, dirs.vector(members[k - n_sites], 1.0))

        return make_all, n_sites + len(members)

    def engine_factory(make, n_sites):
        obs = GlobalModelObserver(n_sites, held["names"], held["dirs"])
        more = [o for a in extra_attacks.values() for o in a.observers(n_sites)]
        engine = TappedEngine({k: make(k) for k in range(n_sites)}, [obs, *more])
        held.update(engine=engine, observer=obs)
        return engine

    summary = run_loop(
        cfg,
        progress=progress,
        console=console,
        engine_factory=engine_factory,
        hooks=RunHooks(split=keep_split, sites=add_canary_clients),
    )
    return summary, held


def _membership_inference(held: dict, s: AuditSettings, rc: RunConfig, last_state):
    """Membership inference on the audited hospital's real examples against the server's final model:
    (the drawn candidates, the members, the reference recipe, figures, curves)."""
    split: SplitData = held["split"]
    x_a, y_a = split.parts[s.site]
    ds = split.dataset
    used = np.concatenate(split.indices) if split.indices else np.zeros(0, dtype=np.int64)
    n_real_total = sum(len(p[1]) for p in split.parts)
    data = draw(
        Pool(ds.x_train, ds.y_train, used, ds.x_test, ds.y_test),
        y_a,
        ds.num_classes,
        canaries=0,
        nonmembers=s.nonmembers or len(y_a),
        references=s.reference_models,
        reference_size=n_real_total,
        seed=s.derived(1),
    )
    dev = x_a.device
    move = lambda r: Rows(r.x.to(dev), r.y.to(dev), r.source, r.index)  # noqa: E731
    members = Rows(
        x_a,
        y_a,
        ["train"] * len(y_a),
        np.asarray(split.indices[s.site]) if split.indices else np.arange(len(y_a)),
    )
    spec: ModelSpec = held["spec"]
    o = rc.options
    assert rc.batch_size is not None  # filled from the data by the run
    recipe = attacks.Recipe(
        steps=max(1, rc.rounds * o.local_epochs * (n_real_total // rc.batch_size)),
        batch_size=rc.batch_size,
        lr=o.local_lr,
        optimizer="sgd",
    )
    refs = [
        attacks.as_target(attacks.train_reference(spec, move(r), recipe, s.derived(100 + j), dev))
        for j, r in enumerate(data.references)
    ]
    target = attacks.with_state(spec, last_state, dev)
    figures, curves = attacks.membership_inference(
        attacks.as_target(target), refs, members, move(data.nonmembers), move(data.population)
    )
    return data, members, recipe, figures, curves


def _report(s, rc, summary, held, coins, scores, bound, delta, mia, seconds, extras) -> tuple[dict, dict]:
    """(audit.json content, plot/CSV material) of a client-level audit."""
    data, members, recipe, figures, curves = mia
    split: SplitData = held["split"]
    spec: ModelSpec = held["spec"]
    obs: GlobalModelObserver = held["observer"]
    o = rc.options
    priv = summary["privacy"]
    g = rc.guarantee()  # the run's (not formal when seeded)
    mech = dataclasses.replace(rc, seed=None).guarantee()  # the mechanism's, with secret randomness
    eps_h = priv.get("epsilon_hospital") if rc.is_private else None
    notes = list(data.notes)
    if rc.is_private and o.privacy_unit == "subclient":
        notes.append(
            f"the run is calibrated per sub-client (its ε {priv.get('epsilon_subclient'):.3f}); a canary is "
            "a hospital, so the bound is compared with epsilon_hospital"
        )
    if not rc.is_private:
        notes.append("no DP: there is no accountant ε; the bound is computed at δ = 1e-5")
    notes.append(
        f"{len(held['canary_ids'])} canary clients joined {held['n_real']} real ones: the server averaged "
        "over all of them, so the audit run's accuracy is not the method's"
    )
    audit_json = {
        "kind": "client-level",
        "title": f"{rc.method} ({'no DP' if not rc.is_private else o.privacy_unit + ' unit'}, intermediaries "
        f"{o.intermediaries}) on {rc.dataset}",
        "research_note": s.research_note,
        "seed": s.seed,
        "method": rc.method,
        "privacy_mode": rc.privacy,
        "formal_guarantee": bool(mech.formal),
        "seeded": s.seeded,
        "guarantee_note": g.note,
        "unit": "one hospital (client-level DP: all of its data at once)",
        "epsilon_lower_bound": bound["epsilon_lower_bound"],
        "confidence": s.confidence,
        "epsilon_accountant": eps_h,
        "epsilon_run_unit": priv.get(f"epsilon_{o.privacy_unit}") if rc.is_private else None,
        "accountant": priv["accountant"],
        "delta": delta,
        "noise_multiplier": rc.noise_multiplier if rc.is_private else None,
        "client_rate": o.client_rate,
        "rounds": summary["rounds_run"],
        "bound": bound,
        "canaries": {
            "m": s.canaries,
            "included": int(coins.sum()),
            "excluded": int((~coins).sum()),
            "inclusion_probability": 0.5,
            "kind": f"canary clients: a random unit direction on {held['dirs'].support.shape[1]} of the "
            f"model's {held['dirs'].d} coordinates, "
            "uploaded at one hospital's bound every round they are selected",
            "real_clients": held["n_real"],
            "public_size": max(len(p[1]) for p in split.parts),
            "scores": {
                "final": "⟨θ_T − θ_0, u_i⟩ on the server's last broadcast",
                "rounds": "Σ_t ⟨θ_t − θ_{t−1}, u_i⟩ standardised across canaries within each round",
            },
            "broadcasts_scored": obs.broadcasts,
        },
        "membership_inference": {
            "members": f"hospital {s.site}'s {len(members)} real training examples",
            "nonmembers": f"{len(data.nonmembers)} examples no hospital trains on, with its class "
            "proportions",
            "population": f"{len(data.population)} further such examples (RMIA's z)",
            "reference_models": f"{len(data.references)}, standalone (no DP, not federated), each on "
            f"{len(data.references[0]) if data.references else 0} examples no hospital trains on "
            "(as many as all hospitals hold), disjoint from every candidate",
            "targets": {
                "global": {
                    "model": spec.name,
                    "what": "the server's final global model",
                    "reference_recipe": recipe.describe(),
                    "attacks": figures,
                }
            },
        },
        "accuracy": {k: v for k, v in summary["final"].items() if k.endswith("_acc")},
        "run_folder": "run",
        "seconds": seconds,
        "notes": notes,
        "attacks_run": list(extras),
        **extras,
    }
    split_json = {
        "members": members.ids(),
        "nonmembers": data.nonmembers.ids(),
        "population": data.population.ids(),
        "references": [r.ids() for r in data.references],
        "canaries": [f"canary-client:{i}" for i in range(s.canaries)],
        "included": coins.astype(int).tolist(),
        "canary_sites": {str(held["n_real"] + j): i for j, i in enumerate(held["canary_ids"])},
    }
    return audit_json, {
        "canary_scores": scores,
        "included": coins,
        "curves": {"global": curves},
        "split": split_json,
    }
