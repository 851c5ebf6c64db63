"""The decision report of a finished run (:mod:`.decision_report`): each site's saved models scored on
its own held-out rows and on external ones, against going alone on the same rows.

Held-out sets per site (none of their rows trains or tunes anything):

- **internal**: the site's own held-out rows or persons where the split has them (per-site tables or folders,
  the ``site`` partition); for a simulated split of a benchmark (``p_major``, ``dirichlet``, ``iid``) a
  per-site draw from the benchmark's test split with the site's own label mix (its skew), seeded by the
  run's split seed, so the run and its going-alone reference score the same rows;
- **external**: the common test set as the site sees it; with the ``site`` partition also every other
  site's held-out rows (``others``).

Going alone (:mod:`silofl.runner.alone`, ``--vs-alone``: the same split and rows): for per-site tables the
stronger on each site's own validation rows of Regular without DP (learning rate tuned) and a scikit-learn
logistic regression (C tuned), as ``OUT/alone/alone.json`` records and each site's row names, with as many
trials as the run's own tuning ran (``tuning_trials``, from ``silofl tune``'s recipe; else a default of 4:
``decision.json``'s ``going_alone_budget`` and the notes say which); for other
data the Regular run without DP in ``OUT/alone``. A table run without ``--vs-alone`` is compared with a
scikit-learn logistic regression fitted on the site's training rows (C by cross-validation on them). A run
scored on its validation split (a tuning trial) gets no decision: its test rows are not read.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from silofl.runner.config import RunConfig
from silofl.runner.decision_report import HeldOut, decide, site_decision, write

log = logging.getLogger("silofl")
SKEW_SALT = 0x5EED_0043  # the per-site skewed draws from a benchmark's test split
SKEW_ROWS = 1000  # at most this many rows per site's skewed internal set


def skewed_internal(y_train: torch.Tensor, y_test: torch.Tensor, seed: int, k: int) -> np.ndarray:
    """Rows of the test split with the label mix of a site's training labels ``y_train``: as many as the
    rarest needed class allows (at most :data:`SKEW_ROWS`), drawn without replacement, seeded by the split
    seed and the site."""
    classes = int(max(int(y_train.max()), int(y_test.max()))) + 1
    p = np.bincount(y_train.cpu().numpy(), minlength=classes) / max(1, len(y_train))
    t = y_test.cpu().numpy()
    avail = np.bincount(t, minlength=classes)
    need = p > 0
    m = int(min(SKEW_ROWS, np.floor(np.min(avail[need] / p[need])))) if need.any() else 0
    rng = np.random.default_rng([int(seed), SKEW_SALT, k])
    rows = [
        rng.choice(np.flatnonzero(t == c), size=int(round(p[c] * m)), replace=False)
        for c in np.flatnonzero(need)
        if int(round(p[c] * m)) > 0
    ]
    return np.sort(np.concatenate(rows)) if rows else np.zeros(0, dtype=np.int64)


def held_out_sets(cfg: RunConfig, split, seed: int | None) -> list[dict[str, tuple]]:
    """Each site's held-out sets: name → (x, y, persons or None, label)."""
    n = len(split.parts)
    sets: list[dict[str, tuple]] = [{} for _ in range(n)]
    internal_persons = getattr(split, "internal_persons", None)
    for k in range(n):
        if split.internal is not None and len(split.internal) == n:
            x, y = split.internal[k]
            persons = internal_persons[k] if internal_persons is not None else None
            sets[k]["internal"] = (
                x,
                y,
                persons,
                "the site's own held-out " + ("persons" if persons is not None else "rows"),
            )
        elif seed is not None and split.test[1].dim() == 1:
            rows = torch.as_tensor(skewed_internal(split.parts[k][1], split.test[1], seed, k))
            x, y = split.test
            sets[k]["internal"] = (x[rows], y[rows], None, "test-split rows drawn with the site's label mix")
        ext = split.external[k] if split.external is not None and len(split.external) == n else split.test
        sets[k]["external"] = (ext[0], ext[1], None, split.test_set)
    if split.internal is not None and len(split.internal) == n and split.preprocessing is None and n > 1:
        for k in range(n):  # one shared encoding: the other sites' held-out rows are external to this one
            xs = [split.internal[j][0] for j in range(n) if j != k]
            ys = [split.internal[j][1] for j in range(n) if j != k]
            sets[k]["others"] = (torch.cat(xs), torch.cat(ys), None, "the other sites' held-out rows")
    return sets


def _load(models: Path, k: int, role: str):
    from silofl.models import load_model

    if role == "combined":
        from silofl.site.combine import load_combined

        return load_combined(models, k)[0]
    return load_model(models / f"client{k}_{role}")[0]


@torch.no_grad()
def outputs_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 500) -> torch.Tensor:
    """A model's outputs per held-out row: its logits (or a survival model's outputs), or per image the
    counts the segmentation figures reduce."""
    from silofl.training.segmentation import segmentation_counts

    model = model.eval().to(x.device)
    outs = []
    for i in range(0, len(y), batch):
        o = model(x[i : i + batch])
        outs.append(segmentation_counts(o, y[i : i + batch]).cpu() if y.dim() == 3 else o.float().cpu())
    if not outs:  # no held-out rows: an empty output of the model's own width
        o = model(x[:0])
        return segmentation_counts(o, y[:0]).cpu() if y.dim() == 3 else o.float().cpu()
    return torch.cat(outs)


def roles(models: Path, k: int) -> list[str]:
    """The models site ``k`` could keep, as saved in ``models`` (a combination's parts are not kept
    alone)."""
    found = sorted(f.stem.split("_", 1)[1] for f in models.glob(f"client{k}_*.safetensors"))
    found = [r for r in found if r not in ("own", "combiner") and not r.startswith("combiner")]
    if (models / f"client{k}_combined.json").is_file() and "combined" not in found:
        found.append("combined")
    return found


def scored(models: Path, k: int, held: dict[str, tuple], only: list[str] | None = None) -> dict:
    """role → set → outputs of site ``k``'s saved models on its held-out sets."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for role in only if only is not None else roles(models, k):
        net = _load(models, k, role)
        out[role] = {s: outputs_of(net, x, y) for s, (x, y, _, _) in held.items()}
    return out


def logistic_reference(x: torch.Tensor, y: torch.Tensor, held: dict[str, tuple], classes: int) -> dict | None:
    """A scikit-learn logistic regression fitted on a site's training rows only (C by 3-fold cross-validation
    on them): set → its log-probabilities over every class; None when the site has one class or few rows."""
    from sklearn.linear_model import LogisticRegressionCV

    xs, ys = x.flatten(1).cpu().numpy(), y.cpu().numpy()
    present = np.unique(ys)  # a class the site lacks is no reason to skip it: its present classes count
    if len(present) < 2 or np.bincount(ys)[present].min() < 3 or len(ys) < 10:
        return None
    folds = int(min(3, np.bincount(ys)[present].min()))
    clf = LogisticRegressionCV(Cs=5, cv=folds, max_iter=500).fit(xs, ys)
    out = {}
    for s, (hx, _, _, _) in held.items():
        lp = np.full((len(hx), classes), -1e9)
        lp[:, clf.classes_] = clf.predict_log_proba(hx.flatten(1).cpu().numpy())
        out[s] = torch.from_numpy(lp)
    return out


def threat_of(cfg: RunConfig, summary: dict, k: int) -> dict:
    """The site's ε, δ and the parties it holds against, as the run's summary states them."""
    rows = summary["final"]["per_client"]
    eps = rows[k].get("epsilon") if k < len(rows) else None
    if eps is None or not cfg.is_private:
        return {"epsilon": None, "delta": None, "threat": None}
    p = summary["privacy"]
    if cfg.info.traits.level == "client":
        accounting = summary.get("accounting") or []
        vs = accounting[k].get("epsilon_vs_server") if k < len(accounting) else None
        threat = "against outsiders (the server adds the noise and is trusted)"
        if vs is not None:
            threat += f"; against the server ε = {vs:.2f}"
    elif str(p.get("noise_placement", "")).startswith("pooled"):  # each site adds only a share
        threat = (
            "against the server and outsiders (each site adds a share of the noise under secure aggregation)"
        )
        plus = p.get("epsilon_vs_server_plus_1_colluders")
        if isinstance(plus, (int, float)):
            threat += f"; against the server + 1 colluding site ε = {plus:.2f}"
    else:
        threat = "against the server and the other sites (noise added at the site)"
    if not p.get("formal_guarantee"):
        seeded = p.get("formal_if_seed_secret")
        threat += (
            " — seeded: holds only while the seed stays secret" if seeded else " — NOT a formal guarantee"
        )
    return {"epsilon": float(eps), "delta": cfg.delta, "threat": threat, "unit": p.get("unit")}


def decision_of(cfg: RunConfig, split, summary: dict, out: Path, alone: Path | None = None) -> dict | None:
    """The run's decision (decision.json's content) from its saved models, and ``alone``'s (a going-alone run
    folder on the same split) where given; None when it cannot be made (a tuning trial, no saved models)."""
    if cfg.eval_split == "validation":
        return None
    models = out / "models"
    n = len(split.parts)
    if not models.is_dir() or n != summary.get("sites_trained", n):
        return None
    seed = summary.get("data_split_seed")
    held = held_out_sets(cfg, split, seed)
    from silofl.runner.alone import read_record, reference_outputs

    table = cfg.dataset == "table" and split.parts[0][1].dim() == 1
    names = split.sites or [f"client{k}" for k in range(n)]
    record = read_record(alone)
    classes = int(split.dataset.num_classes)
    rows = []
    for k in range(n):
        sets = {
            s: HeldOut(y, np.asarray(p) if p is not None else None, lab)
            for s, (_, y, p, lab) in held[k].items()
        }
        site = record["sites"][k] if record is not None and k < len(record["sites"]) else None
        if record is not None or alone is not None:
            refs = reference_outputs(site, alone, k, split.parts[k], held[k], classes)
        else:  # no going-alone run: a logistic regression on the site's training rows (tables)
            x_k, y_k = split.parts[k]
            lr = logistic_reference(x_k, y_k, held[k], classes) if table else None
            refs = {"scikit-learn logistic regression": lr} if lr is not None else {}
        rows.append(
            site_decision(
                str(names[k]),
                cfg.metric,
                sets,
                scored(models, k, held[k]),
                refs,
                threat_of(cfg, summary, k),
                seed,
            )
        )
        if site is not None:  # how going alone was chosen: each kind's validation figure, the one kept
            rows[-1]["going_alone"] = site
    notes = [
        "intervals: 95% percentile bootstrap over the held-out rows (persons where the site has an id "
        "column); gains: paired, on the same resampled rows",
        _reference_note(record, alone),
    ]
    d = decide(rows, cfg.metric, notes)
    if record is not None:  # going alone's trial budget, matched to the run's own tuning where it records one
        d["going_alone_budget"] = {
            "trials": record["trials"],
            "source": record.get("trials_source"),
            "tuning_trials": record.get("tuning_trials"),
            "text": record.get("budget"),
        }
    return d


def _reference_note(record: dict | None, alone: Path | None) -> str:
    if record is not None:
        return (
            "going alone: per site the stronger on its own validation rows (never its test rows) of silofl's "
            f"Regular without DP over {record['trials']} learning rates and a scikit-learn logistic "
            f"regression over {record['trials']} values of C, retrained on all of its training rows; each "
            f"site's row names the one chosen ({record.get('budget') or 'trial budget not recorded'})"
        )
    if alone is not None:
        return "going alone: silofl's Regular without DP on the same rows, at the run's learning rate"
    return (
        "going alone: a scikit-learn logistic regression on the site's training rows (C by cross-validation "
        "on them); --vs-alone adds silofl's Regular and tunes both on each site's validation rows"
    )


_DEFERRED: contextvars.ContextVar[bool] = contextvars.ContextVar("silofl_decision_deferred", default=False)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Within it, :func:`report` writes the decision but prints no table: a going-alone baseline trained
    after the run (``--vs-alone``) reports it again, with that baseline, and prints it once."""
    token = _DEFERRED.set(True)
    try:
        yield
    finally:
        _DEFERRED.reset(token)


def report(
    cfg: RunConfig, split, summary: dict, out: Path, console=None, alone: Path | None = None
) -> dict | None:
    """Write ``decision.json`` and ``report.md`` into the run folder and print the table; the decision, or
    None (and nothing written) when the run has none."""
    from silofl.core.errors import ConfigError, DataError

    try:
        d = decision_of(cfg, split, summary, out, alone)
    except (ConfigError, DataError, RuntimeError, ValueError) as e:
        # a saved model the report cannot rebuild or score (a method's own model kind): the run's results are
        # written and stand; the report says why it is missing
        log.warning("decision report not written: %s", e)
        return None
    if d is None:
        return None
    write(d, out)
    if console is not None and not _DEFERRED.get():
        from silofl.runner.decision_report import print_table

        print_table(d, console)
    return d


def read(out: Path) -> dict | None:
    """A run folder's decision.json, or None."""
    p = out / "decision.json"
    return json.loads(p.read_text()) if p.is_file() else None
