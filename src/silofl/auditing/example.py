"""Auditing an example-level method (ProxyFL, FedAvg, FML, AvgPush, CWT, Regular, Joint).

The run is an ordinary ``silofl run`` (its folder is ``OUT/run``) with two research hooks
(:class:`~silofl.runner.loop.RunHooks`): the included canaries are appended to the audited site's training
data before any site is built, and the engine is a :class:`~silofl.auditing.tap.TappedEngine` whose
observer reads what leaves the audited site.

Canary scores, from the released shared models only (φ = log p_y − log(1 − p_y) of the canary's label):

* ``final`` — φ under the last model the site released (a black-box, last-iterate auditor);
* ``rounds`` — Σ over rounds of what each round's local training did to the canary: φ(model the site
  released) − φ(model it started the round from), standardised across the canaries within the round
  (minus the round's mean, over its standard deviation: label-free, so early rounds' large drift does not
  drown later ones). The starting model is what the site received (the neighbour's proxy, the server's
  broadcast) or, in ProxyFL's first round, its random initialisation, which does not depend on any data;
  both are known to an auditor who sees the exchanges.

Methods in which nothing leaves a site (Regular, Joint) are scored on the site's DP model after each
round, as if it were released, and the result says so.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from silofl.auditing import attacks
from silofl.auditing.bound import one_run_bound
from silofl.auditing.canaries import CANARY_DESCRIPTION, AuditData, Pool, Rows, draw
from silofl.auditing.settings import AuditSettings
from silofl.auditing.tap import TappedEngine, model_tensors, released_by
from silofl.comm.messages import Message
from silofl.core.errors import ConfigError
from silofl.data import SplitData
from silofl.runner.config import RunConfig
from silofl.runner.loop import RunHooks
from silofl.runner.loop import run as run_loop

log = logging.getLogger("silofl")

TRAIN_STEPS = ("train_send", "train_upload", "train")


class SharedModelObserver:
    """Scores the canaries under every model the audited site releases (module doc)."""

    def __init__(self, site: int, canaries: Rows):
        self.site = site
        self.canaries = canaries
        self.scorer: torch.nn.Module | None = None
        self.start: np.ndarray | None = None
        self.rounds = np.zeros(len(canaries))
        self.final: np.ndarray | None = None
        self.last_state: dict[str, torch.Tensor] | None = None
        self.releases = 0
        self.trained = 0
        self.history: list[dict] = []

    def _phi(self, state: dict[str, torch.Tensor], site_obj) -> np.ndarray:
        if self.scorer is None:
            self.scorer = site_obj.shared_spec.build().to(self.canaries.x.device)
        self.scorer.load_state_dict({k: v.to(self.canaries.x.device) for k, v in state.items()})
        return attacks.phi(attacks.model_logits(self.scorer, self.canaries.x), self.canaries.y)

    def before(self, step: str, requests: dict[int, Message], engine: TappedEngine) -> None:
        """Before the audited site trains: φ of every canary under the model it starts the round from."""
        if step in TRAIN_STEPS and self.site in requests:
            site: Any = engine.sites[self.site]
            self.start = self._phi(site.shared_state(), site)

    def after(
        self, step: str, requests: dict[int, Message], replies: dict[int, Message], engine: TappedEngine
    ) -> None:
        """After it trained: φ under what it released (or its shared model), and the round's standardised
        change."""
        if step not in TRAIN_STEPS or self.site not in replies or self.start is None:
            return
        site: Any = engine.sites[self.site]
        packets = released_by(self.site, replies)
        if packets:
            state = model_tensors(packets[0])
            self.releases += 1
        else:
            state = site.shared_state()
        self.trained += 1
        now = self._phi(state, site)
        change = now - self.start
        sd = float(change.std())
        self.rounds += (change - change.mean()) / sd if sd > 0 else 0.0
        self.final, self.last_state, self.start = now, state, None
        self.history.append(
            {"round": int(requests[self.site].meta.get("round", self.trained)), "released": bool(packets)}
        )


def _moved(rows: Rows, device: torch.device) -> Rows:
    return Rows(rows.x.to(device), rows.y.to(device), rows.source, rows.index)


def run_config(cfg: RunConfig, s: AuditSettings, out: Path) -> RunConfig:
    """The configuration the audited run runs (its folder ``out/run``, the audit's seed); serving ranks of a
    torch.distributed audit build their sites from it."""
    info = cfg.info
    if info.client_level:
        raise ConfigError(
            f"{cfg.method} protects whole clients: it is audited with canary clients (auditing.clients)"
        )
    if s.site >= cfg.clients:
        raise ConfigError(f"--audited-site {s.site} is not one of the {cfg.clients} clients")
    # the tapped engine is in-process (one process runs every site: a simulation), so sites report their
    # non-private figures, labelled, as an in-process `silofl run` does, unless the config says otherwise
    nonprivate = cfg.report_nonprivate if cfg.report_nonprivate is not None else True
    return dataclasses.replace(
        cfg.replace(out=str(out / "run"), seed=s.seed), checkpoint_every=None, report_nonprivate=nonprivate
    )


def audit(
    cfg: RunConfig, s: AuditSettings, out: Path, progress: bool = False, console=None
) -> tuple[dict, dict]:
    """Run ``cfg`` with canaries at site ``s.site``; (audit.json content, plot/CSV material)."""
    info = cfg.info
    cfg = run_config(cfg, s, out)
    t0 = time.perf_counter()
    summary, held = _run_with_canaries(cfg, s, info.traits.pooled, progress, console)
    run_s = time.perf_counter() - t0
    obs: SharedModelObserver = held["observer"]
    data: AuditData = held["data"]
    site: Any = held["engine"].sites[obs.site]
    if obs.final is None or obs.last_state is None:
        raise ConfigError("the audited site never trained: nothing to audit (raise --rounds or the budget)")
    resolved = RunConfig.from_dict(summary_config(out / "run"), strict=False).resolve()
    canary_scores = {"final": obs.final, "rounds": obs.rounds}
    delta = resolved.delta
    bound = one_run_bound(
        canary_scores, data.included, delta if resolved.is_private else 1e-5, s.confidence, s.derived(0)
    )

    # membership inference on real examples
    t1 = time.perf_counter()
    steps = site.rounds_trained * site.steps_per_round
    mi, curves = _membership_inference(s, resolved, site, obs, data, held["members"], steps)
    attack_s = time.perf_counter() - t1
    seconds = {"run": run_s, "attacks": attack_s}
    return _report(cfg, s, resolved, summary, held, site, bound, steps, mi, curves, canary_scores, seconds)


def _run_with_canaries(cfg: RunConfig, s: AuditSettings, pooled: bool, progress, console):
    """Run ``cfg`` on a tapped engine with the canaries added to site ``s.site``; (summary, what it held)."""
    held: dict = {}

    def add_canaries(run_cfg: RunConfig, split: SplitData) -> SplitData:
        a = s.site
        x_a, y_a = split.parts[a]
        ds = split.dataset
        used = np.concatenate(split.indices) if split.indices else np.zeros(0, dtype=np.int64)
        pool = Pool(ds.x_train, ds.y_train, used, ds.x_test, ds.y_test)
        data = draw(
            pool,
            y_a,
            ds.num_classes,
            canaries=s.canaries,
            nonmembers=s.nonmembers or len(y_a),
            references=s.reference_models,
            reference_size=len(y_a),
            seed=s.derived(1),
            kind=s.canary_kind,
        )
        dev = x_a.device
        data = AuditData(
            _moved(data.canaries, dev),
            data.canary_true_labels,
            data.included,
            _moved(data.nonmembers, dev),
            _moved(data.population, dev),
            [_moved(r, dev) for r in data.references],
            data.notes,
        )
        cin = data.canaries_in
        parts = list(split.parts)
        parts[a] = (torch.cat([x_a, cin.x]), torch.cat([y_a, cin.y]))
        idx = split.indices[a] if split.indices else np.arange(len(y_a))
        held.update(data=data, members=Rows(x_a, y_a, ["train"] * len(y_a), np.asarray(idx)), split=split)
        held["observer"] = SharedModelObserver(0 if pooled else a, data.canaries)
        return dataclasses.replace(split, parts=parts)

    def engine_factory(make, n_sites):
        engine = TappedEngine({k: make(k) for k in range(n_sites)}, [held["observer"]])
        held["engine"] = engine
        return engine

    summary = run_loop(
        cfg,
        progress=progress,
        console=console,
        engine_factory=engine_factory,
        hooks=RunHooks(split=add_canaries),
    )
    return summary, held


def _membership_inference(s: AuditSettings, resolved: RunConfig, site: Any, obs, data, members, steps: int):
    """Membership inference on the site's real examples against each model it holds: (figures, curves)."""
    o = resolved.options
    assert resolved.batch_size is not None  # filled from the data by the run
    shared_recipe = attacks.Recipe(
        steps=steps,
        batch_size=resolved.batch_size,
        lr=o.lr,
        weight_decay=o.weight_decay,
        private=resolved.is_private,
        noise_multiplier=resolved.noise_multiplier,
        clip=resolved.clip,
    )
    targets: dict[str, tuple[str, attacks.Target, list[attacks.Target], attacks.Recipe, str]] = {}
    device = data.canaries.x.device
    shared_model = attacks.with_state(site.shared_spec, obs.last_state, device)
    refs_shared = [
        attacks.as_target(
            attacks.train_reference(site.shared_spec, r, shared_recipe, s.derived(100 + j), device)
        )
        for j, r in enumerate(data.references)
    ]
    what = (
        "the last model the site released"
        if obs.releases
        else "the site's final DP model (nothing left the site)"
    )
    targets[site.shared_field] = (
        site.shared_spec.name,
        attacks.as_target(shared_model),
        refs_shared,
        shared_recipe,
        what,
    )
    if getattr(site, "private", None) is not None:
        private_recipe = attacks.Recipe(
            steps=steps, batch_size=resolved.batch_size, lr=o.lr, weight_decay=o.weight_decay
        )
        refs_private = [
            attacks.as_target(
                attacks.train_reference(site.private_spec, r, private_recipe, s.derived(200 + j), device)
            )
            for j, r in enumerate(data.references)
        ]
        targets["private"] = (
            site.private_spec.name,
            attacks.as_target(site.private),
            refs_private,
            private_recipe,
            "the site's private model (never released; audited as if it were)",
        )
    mi, curves = {}, {}
    for name, (arch, target, refs, recipe, desc) in targets.items():
        figures, curves[name] = attacks.membership_inference(
            target, refs, members, data.nonmembers, data.population
        )
        mi[name] = {"model": arch, "what": desc, "reference_recipe": recipe.describe(), "attacks": figures}
    return mi, curves


def _report(cfg, s, resolved, summary, held, site, bound, steps, mi, curves, canary_scores, seconds):
    """(audit.json content, plot/CSV material) of an example-level audit."""
    obs: SharedModelObserver = held["observer"]
    data: AuditData = held["data"]
    delta = resolved.delta
    g = resolved.guarantee()  # the run's (not formal when seeded)
    mech = dataclasses.replace(resolved, seed=None).guarantee()  # the mechanism's, with secret randomness
    eps_acc = site.epsilon()
    notes = list(data.notes)
    if not obs.releases:
        notes.append(
            f"nothing leaves a site in {cfg.method}: the site's DP model after each round was scored as if "
            "it were released"
        )
    if resolved.is_private and not mech.formal:
        notes.append(
            "the accountant's ε is NOT a formal guarantee in this mode (paper mode): a lower bound above it "
            "would be a measured violation, not a bug"
        )
    if not resolved.is_private:
        notes.append("no DP: there is no accountant ε; the bound is computed at δ = 1e-5")
    members = held["members"]
    audit_json = {
        "kind": "example-level",
        "title": f"{cfg.method} ({resolved.privacy}) on {resolved.dataset}, site {s.site}",
        "research_note": s.research_note,
        "seed": s.seed,
        "method": cfg.method,
        "privacy_mode": resolved.privacy,
        "formal_guarantee": bool(mech.formal) if resolved.is_private else False,
        "seeded": s.seeded,
        "guarantee_note": g.note,
        "unit": g.unit,
        "epsilon_lower_bound": bound["epsilon_lower_bound"],
        "confidence": s.confidence,
        "epsilon_accountant": eps_acc,
        "accountant": summary["privacy"]["accountant"],
        "delta": delta if resolved.is_private else 1e-5,
        "noise_multiplier": resolved.noise_multiplier if resolved.is_private else None,
        "sample_rate": site.sample_rate,
        "steps": steps,
        "rounds": summary["rounds_run"],
        "bound": bound,
        "canaries": {
            "m": s.canaries,
            "included": int(data.included.sum()),
            "excluded": int((~data.included).sum()),
            "inclusion_probability": 0.5,
            "kind": CANARY_DESCRIPTION[s.canary_kind],
            "audited_site": s.site,
            "site_examples_real": len(members),
            "site_examples_with_canaries": site.n,
            "scores": {
                "final": "φ of the canary label under the last model the site released",
                "rounds": "Σ over rounds of φ(released) − φ(model the round started from), standardised "
                "across canaries within each round",
            },
            "releases_scored": obs.releases,
            "rounds_scored": obs.trained,
        },
        "membership_inference": {
            "members": f"the audited site's {len(members)} real training examples",
            "nonmembers": f"{len(data.nonmembers)} examples no site trains on, with the site's class "
            "proportions",
            "population": f"{len(data.population)} further such examples (RMIA's z)",
            "reference_models": f"{len(data.references)} per target, standalone (not federated), each on "
            f"{len(data.references[0]) if data.references else 0} examples no site trains on, "
            "disjoint from every candidate",
            "targets": mi,
        },
        "accuracy": {k: v for k, v in summary["final"].items() if k.endswith("_acc")},
        "run_folder": "run",
        "seconds": seconds,
        "notes": notes,
    }
    split = {
        "members": members.ids(),
        "nonmembers": data.nonmembers.ids(),
        "population": data.population.ids(),
        "references": [r.ids() for r in data.references],
        "canaries": data.canaries.ids(),
        "canary_labels": data.canaries.y.cpu().tolist(),
        "canary_true_labels": data.canary_true_labels.tolist(),
        "included": data.included.astype(int).tolist(),
    }
    return audit_json, {
        "canary_scores": canary_scores,
        "included": data.included,
        "curves": curves,
        "split": split,
    }


def summary_config(run_dir: Path) -> dict:
    """The resolved configuration the audited run wrote to its folder."""
    from silofl.runner.folder import read_config

    return read_config(run_dir)
