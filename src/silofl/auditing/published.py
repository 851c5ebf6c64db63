"""Auditing a PubSub-ML published model (``silofl audit --pubsub-model KIND``).

A publisher holds ``samples_per_client`` rows of the data set (flattened to features) and publishes one
model of ``KIND`` at ``--epsilon`` (and δ for ``dp-nn``) with :func:`silofl.pubsub.dp_models.train` — the
code ``silofl pubsub publish`` runs. The m mislabelled canaries (:mod:`silofl.auditing.canaries`) join its
rows independently with probability ½; the published model is the only release, so each canary's score is
φ of its label under that model (``final``). The bound is taken at the model's own δ: 0 for diffprivlib's
pure ε-DP models, the run's δ for ``dp-nn``.

The public feature bounds the publisher declares are the data set's value range per feature (for images,
the range of the normalised pixel encoding), as a site would declare them from its data's format.
"""

from __future__ import annotations

import math
import secrets
import time

import numpy as np
import torch

from silofl.auditing import attacks
from silofl.auditing.bound import one_run_bound
from silofl.auditing.canaries import CANARY_DESCRIPTION, Pool, Rows, draw
from silofl.auditing.settings import AuditSettings
from silofl.core.errors import ConfigError
from silofl.data import load_dataset
from silofl.privacy.guarantee import SEEDED_NOTE
from silofl.pubsub import dp_models
from silofl.pubsub.model import PublishedModel, outputs
from silofl.runner.config import RunConfig


def _target(m: PublishedModel) -> attacks.Target:
    return lambda x: torch.log(outputs(m, x.reshape(len(x), -1)).clamp_min(1e-300)).numpy()


def publisher_data(cfg: RunConfig, s: AuditSettings):
    """What an audited publisher holds: (resolved config, whether it publishes without DP, split seed, the
    data set, flattened training and test inputs, the publisher's rows, the models' input bounds)."""
    cfg = cfg.resolve()
    nonprivate = not cfg.is_private
    if not nonprivate and s.epsilon is None:
        raise ConfigError("--pubsub-model needs --epsilon, the published model's ε (or --privacy off)")
    # which rows the publisher holds: like a run's data split, not a secret (recorded), seeded by --seed or
    # fresh
    split_seed = s.seed if s.seed is not None else secrets.randbits(32)
    ds = load_dataset(
        cfg.dataset, cfg.data_dir, image_size=cfg.image_size, max_bag_size=cfg.max_bag_size, seed=split_seed
    )
    x_train = ds.x_train.reshape(len(ds.x_train), -1).double()
    x_test = ds.x_test.reshape(len(ds.x_test), -1).double()
    n = cfg.samples_per_client or min(1000, len(ds.y_train) // 2)
    if n > len(ds.y_train):
        raise ConfigError(f"--samples-per-client {n} exceeds the {len(ds.y_train)} training examples")
    rng = np.random.default_rng(np.random.SeedSequence(split_seed))
    rows = np.sort(rng.choice(len(ds.y_train), size=n, replace=False))
    allx = torch.cat([x_train, x_test])
    bounds = dp_models.Bounds(allx.min(0).values.numpy(), allx.max(0).values.numpy())
    return cfg, nonprivate, split_seed, ds, x_train, x_test, rows, bounds


def audit(cfg: RunConfig, s: AuditSettings) -> tuple[dict, dict]:
    """Publish one model with canaries; (audit.json content, plot/CSV material)."""
    kind = s.pubsub_model
    if kind not in dp_models.CLASSIFIERS:
        raise ConfigError(
            f"--pubsub-model must be a classifier: {', '.join(dp_models.CLASSIFIERS)} (got {kind!r})"
        )
    cfg, nonprivate, split_seed, ds, x_train, x_test, rows, bounds = publisher_data(cfg, s)
    n = len(rows)
    members = Rows(x_train[torch.as_tensor(rows)], ds.y_train[torch.as_tensor(rows)], ["train"] * n, rows)
    data = draw(
        Pool(x_train, ds.y_train, rows, x_test, ds.y_test),
        members.y,
        ds.num_classes,
        canaries=s.canaries,
        nonmembers=s.nonmembers or n,
        references=s.reference_models,
        reference_size=n,
        seed=s.derived(1),
        kind=s.canary_kind,
    )
    features = [f"x{i}" for i in range(x_train.shape[1])]
    classes = list(range(ds.num_classes))
    epsilon = s.epsilon if s.epsilon is not None else 1.0

    def publish(r: Rows, seed: int | None) -> PublishedModel:
        return dp_models.train(
            kind,
            r.x.numpy(),
            r.y.numpy(),
            publisher="audited",
            features=features,
            task="classification",
            bounds=bounds,
            epsilon=epsilon,
            delta=cfg.delta,
            classes=classes,
            seed=seed,
            nonprivate=nonprivate,
            epochs=s.pubsub_epochs,
        )

    cin = data.canaries_in
    t0 = time.perf_counter()
    model = publish(
        Rows(torch.cat([members.x, cin.x]), torch.cat([members.y, cin.y])),
        s.seed + 7 if s.seed is not None else None,
    )  # the audited mechanism: secure unless seeded
    train_s = time.perf_counter() - t0
    target = _target(model)
    scores = {"final": attacks.phi(target(data.canaries.x), data.canaries.y)}
    bound_delta = 1e-5 if nonprivate else cfg.delta if kind == "dp-nn" else 0.0
    bound = one_run_bound(scores, data.included, bound_delta, s.confidence, s.derived(0))
    t1 = time.perf_counter()
    refs = [_target(publish(r, s.derived(100 + j))) for j, r in enumerate(data.references)]
    figures, curves = attacks.membership_inference(target, refs, members, data.nonmembers, data.population)
    attack_s = time.perf_counter() - t1
    seconds = {"publish": train_s, "attacks": attack_s}
    audit_json, split = _report(
        cfg, s, kind, model, data, members, bound, bound_delta, figures, split_seed, nonprivate, seconds
    )
    return audit_json, {
        "canary_scores": scores,
        "included": data.included,
        "curves": {"published": curves},
        "split": split,
    }


def _report(cfg, s, kind, model, data, members, bound, bound_delta, figures, split_seed, nonprivate, seconds):
    """(audit.json content, split) of an audit of a published model with input-space canaries."""
    n, cin = len(members), data.canaries_in
    epsilon = s.epsilon if s.epsilon is not None else 1.0
    eps_acc = None if nonprivate or not math.isfinite(model.epsilon) else float(model.epsilon)
    notes = list(data.notes)
    if nonprivate:
        notes.append("no DP (PubSub-ML*): there is no accountant ε; the bound is computed at δ = 1e-5")
    elif kind != "dp-nn":
        notes.append(f"{kind} is pure ε-DP (diffprivlib): the bound is computed at δ = 0")
    audit_json = {
        "kind": "pubsub",
        "title": f"PubSub-ML published {kind} on {cfg.dataset}"
        + (" (no DP)" if nonprivate else f", ε = {epsilon:g}"),
        "research_note": s.research_note,
        "seed": s.seed,
        "method": f"pubsub:{kind}",
        "privacy_mode": "off" if nonprivate else "strict",
        "formal_guarantee": not nonprivate,
        "guarantee_note": (
            "formal ε-DP (δ = 0) of diffprivlib" if kind != "dp-nn" else "formal (ε, δ)-DP of DP-SGD"
        )
        + (f"; {SEEDED_NOTE}" if s.seeded and not nonprivate else ""),
        "seeded": s.seeded,
        "split_seed": split_seed,
        "unit": "one row of the publisher's data",
        "epsilon_lower_bound": bound["epsilon_lower_bound"],
        "confidence": s.confidence,
        "epsilon_accountant": eps_acc,
        "accountant": model.mechanism.get("accountant", model.mechanism.get("name")),
        "delta": bound_delta,
        "mechanism": model.mechanism,
        "bound": bound,
        "canaries": {
            "m": s.canaries,
            "included": int(data.included.sum()),
            "excluded": int((~data.included).sum()),
            "inclusion_probability": 0.5,
            "kind": CANARY_DESCRIPTION[s.canary_kind],
            "publisher_rows_real": n,
            "publisher_rows_with_canaries": n + len(cin),
            "scores": {"final": "φ of the canary label under the published model"},
        },
        "membership_inference": {
            "members": f"the publisher's {n} real rows",
            "nonmembers": f"{len(data.nonmembers)} rows it does not hold, with its class proportions",
            "population": f"{len(data.population)} further such rows (RMIA's z)",
            "reference_models": f"{len(data.references)} models of the same kind and ε, each on {n} rows "
            "disjoint from every candidate",
            "targets": {
                "published": {
                    "model": kind,
                    "what": "the published model",
                    "reference_recipe": f"{kind} at the same ε",
                    "attacks": figures,
                }
            },
        },
        "seconds": seconds,
        "notes": notes,
    }
    split = {
        "members": members.ids(),
        "nonmembers": data.nonmembers.ids(),
        "population": data.population.ids(),
        "references": [r.ids() for r in data.references],
        "canaries": data.canaries.ids(),
        "canary_labels": data.canaries.y.tolist(),
        "canary_true_labels": data.canary_true_labels.tolist(),
        "included": data.included.astype(int).tolist(),
    }
    return audit_json, split
