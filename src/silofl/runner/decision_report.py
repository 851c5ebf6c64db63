"""Should my site keep this model? The decision report: one row per site, its answer on its own patients.

For every model a site could keep (the shared DP model, its own private, personal or combined model) the
report gives the figure of the run's metric on the site's **internal** held-out rows (its own distribution:
rows or persons it never trained or tuned on) and on **external** ones (the common test set as the site sees
it; the other sites' held-out rows where the sites share one encoding), each with a percentile bootstrap
interval (:mod:`silofl.training.bootstrap`), and its **gain over going alone** — the stronger of the site's
own references (silofl's Regular without DP on the same rows; for tables a scikit-learn model; the caller
passes the one chosen on the site's validation rows, or several, and then the stronger on each held-out set
is taken, which favours going alone) — with a paired interval on the same resampled rows. A site with too
few held-out rows or persons for an interval gets its figures alone, labelled, and no verdict.
The site's ε, δ and the parties it holds against come next to it, and one verdict line in plain words.

This module is pure: it gets each model's outputs on each held-out set (:mod:`silofl.runner.decision`
computes them) and returns plain JSON (``decision.json``), Markdown (``report.md``) and a console table.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from silofl.training.bootstrap import MIN_UNITS, interval, metric_statistic, paired_difference
from silofl.training.metrics import higher_is_better, metric_label

ROLE_LABELS = {
    "proxy": "shared DP model",
    "global": "shared model",
    "private": "own private model",
    "personal": "own personal model",
    "combined": "combined model",
}
SET_LABELS = {"internal": "own held-out", "external": "external"}
DECISION_FILE, REPORT_FILE = "decision.json", "report.md"
WORK = 2_000_000  # rows × resamples per interval: a large common test set gets fewer resamples (at least 200)


def resamples_for(n: int) -> int:
    """Bootstrap resamples for a held-out set of ``n`` rows: 1000, fewer (down to 200) on a large set, so that
    a run with many sites and a 10 000-row test set is not dominated by its report (recorded per interval)."""
    return int(min(1000, max(200, WORK // max(1, n))))


@dataclass(frozen=True)
class HeldOut:
    """One held-out set of one site: its targets, each row's person (or None: rows are the units) and what
    it is."""

    y: torch.Tensor
    clusters: np.ndarray | None
    label: str


def _signed(metric: str, d: dict) -> dict:
    """A paired difference as a gain (positive: better), for a metric where lower is better too."""
    if higher_is_better(metric):
        return d
    flip = {k: (-d[k] if d.get(k) is not None else None) for k in ("estimate", "low", "high")}
    return {**d, **flip, "low": flip["high"], "high": flip["low"]}


def _better(metric: str, a: float, b: float) -> bool:
    return a > b if higher_is_better(metric) else a < b


def _reference(metric: str, held: HeldOut, refs: dict[str, torch.Tensor], seed: int | None) -> dict | None:
    """The stronger going-alone reference on ``held`` (by its figure there: the choice favours going alone),
    with its figure and interval."""
    best = None
    for name, out in refs.items():
        n = len(held.y)
        fig = interval(metric_statistic(metric, out, held.y), n, held.clusters, resamples_for(n), seed=seed)
        if fig["estimate"] is None:
            continue
        if best is None or _better(metric, fig["estimate"], best[1]["estimate"]):
            best = (name, fig, out)
    if best is None:
        return None
    return {"name": best[0], "figure": best[1], "outputs": best[2]}


def site_decision(
    site: str,
    metric: str,
    sets: dict[str, HeldOut],
    models: dict[str, dict[str, torch.Tensor]],
    references: dict[str, dict[str, torch.Tensor]],
    privacy: dict,
    seed: int | None = None,
) -> dict:
    """One site's row: ``models`` role → held-out set name → the model's outputs on it; ``references``: name
    → set → a going-alone model's outputs on the same rows; ``privacy``: ``{epsilon, delta, threat}``."""
    refs = {}
    for s, held in sets.items():
        r = _reference(metric, held, {n: o[s] for n, o in references.items() if s in o}, seed)
        if r is not None:
            refs[s] = r
    rows: dict[str, dict] = {}
    for role, outs in models.items():
        label = ROLE_LABELS.get(role, role)
        if role in ("global", "proxy"):  # the model every site shares: DP or not, as the run was
            label = "shared DP model" if privacy.get("epsilon") is not None else "shared model (no DP)"
        entry: dict = {"label": label, "gain": {}}
        for s, held in sets.items():
            if s not in outs:
                continue
            mine = metric_statistic(metric, outs[s], held.y)
            n, reps = len(held.y), resamples_for(len(held.y))
            entry[s] = interval(mine, n, held.clusters, reps, seed=seed)
            if s in refs:
                base = metric_statistic(metric, refs[s]["outputs"], held.y)
                diff = paired_difference(mine, base, n, held.clusters, seed=seed, resamples=reps)
                entry["gain"][s] = _signed(metric, diff)
        rows[role] = entry
    row = {
        "site": site,
        **privacy,
        "sets": {s: {"label": h.label, "rows": len(h.y)} for s, h in sets.items()},
        "reference": {s: {"name": r["name"], "figure": r["figure"]} for s, r in refs.items()},
        "models": rows,
    }
    few = too_few(row)
    if few is not None:  # the fallback, labelled: figures without intervals, and why
        row["fallback"] = f"no interval on the site's own held-out set: {few}"
    row["verdict"] = verdict(row, metric)
    return row


def _fmt(v: float | None, sign: bool = False) -> str:
    if v is None:
        return "n/a"
    return f"{v:+.3f}" if sign else f"{v:.3f}"


def _with_interval(d: dict | None, sign: bool = False) -> str:
    if d is None or d.get("estimate") is None:
        return "n/a" if d is None or not d.get("note") else f"n/a ({d['note']})"
    if d.get("low") is None:
        return f"{_fmt(d['estimate'], sign)} ({d.get('note') or 'no interval'})"
    return f"{_fmt(d['estimate'], sign)} [{_fmt(d['low'], sign)}, {_fmt(d['high'], sign)}]"


def _budget(row: dict) -> str:
    eps = row.get("epsilon")
    if eps is None:
        return "without DP"
    return f"at ε = {eps:.2f} {row.get('threat') or ''}".rstrip()


def too_few(row: dict) -> str | None:
    """Why the site's own held-out set gives no interval when it is too small for one (fewer than
    :data:`silofl.training.bootstrap.MIN_UNITS` rows or persons, or none), else None."""
    held = row["sets"].get("internal")
    if held is None:
        return None
    figs = [e["internal"] for e in row["models"].values() if e.get("internal")]
    units = figs[0]["units"] if figs else held["rows"]
    unit = figs[0]["unit"] if figs else "rows"
    if units >= MIN_UNITS:
        return None
    return f"{units} held-out {unit}, too few for a bootstrap interval (at least {MIN_UNITS})"


def verdict(row: dict, metric: str) -> str:
    """One line in plain words: the model with the largest gain on the site's own held-out rows whose whole
    interval is a gain; else that no model gains there (a loss named when a whole interval is one)."""
    label = metric_label(metric)
    few = too_few(row)
    if few is not None:
        return f"no verdict on your own patients: {few}; the figures stand alone, without an interval"
    gains = [(r, e["gain"]["internal"]) for r, e in row["models"].items() if "internal" in e["gain"]]
    if not row["reference"].get("internal"):
        return "no going-alone reference on your own held-out rows in this run (--vs-alone adds one)"
    gains = [(r, g) for r, g in gains if g.get("estimate") is not None]
    if not gains:
        return f"no {label} on your own held-out rows: the figure is undefined there"
    if all(g.get("low") is None for _, g in gains):  # no interval for any gain: no verdict either
        role, g = max(gains, key=lambda rg: rg[1]["estimate"])
        return (
            f"no verdict on your own patients: {g.get('note') or 'no interval'} (best: the "
            f"{row['models'][role]['label']} {_fmt(g['estimate'], True)} {label}, without an interval)"
        )
    sure = [(r, g) for r, g in gains if g.get("low") is not None and g["low"] > 0]
    if sure:
        role, g = max(sure, key=lambda rg: rg[1]["estimate"])
        name = row["models"][role]["label"]
        return f"on your own patients: {_with_interval(g, True)} {label} with the {name} {_budget(row)}"
    worse = [(r, g) for r, g in gains if g.get("high") is not None and g["high"] < 0]
    role, g = max(gains, key=lambda rg: rg[1]["estimate"])
    if len(worse) == len(gains):
        return (
            f"a loss on your own patients at this budget: going alone is better "
            f"(best: the {row['models'][role]['label']} {_with_interval(g, True)} {label})"
        )
    return (
        f"no gain on your own patients at this budget (best: the {row['models'][role]['label']} "
        f"{_with_interval(g, True)} {label}, interval includes no gain)"
    )


def decide(rows: list[dict], metric: str, notes: list[str] | None = None) -> dict:
    """decision.json's content: the sites' rows and, below them, the mean over sites of each model's figures
    and gains."""
    mean: dict[str, dict] = {}
    roles = sorted({r for row in rows for r in row["models"]})
    for role in roles:
        m: dict = {}
        for s in ("internal", "external"):
            figs = [row["models"][role].get(s, {}).get("estimate") for row in rows if role in row["models"]]
            gains = [
                row["models"][role]["gain"].get(s, {}).get("estimate")
                for row in rows
                if role in row["models"]
            ]
            m[s] = _mean(figs)
            m[f"gain_{s}"] = _mean(gains)
        m["label"] = next(row["models"][role]["label"] for row in rows if role in row["models"])
        mean[role] = m
    return {
        "metric": metric,
        "metric_label": metric_label(metric),
        "higher_is_better": higher_is_better(metric),
        "rows": rows,
        "mean_over_sites": mean,
        "notes": list(notes or []),
    }


def _mean(values: list) -> float | None:
    ok = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.fmean(ok) if ok else None


def markdown(decision: dict) -> str:
    """report.md: a table with one line per site and model, each site's verdict, the mean over sites."""
    label = decision["metric_label"]
    lines = [
        f"# Should each site keep a model of this run? ({label}, 95% percentile bootstrap intervals)",
        "",
        f"| site | model | {label}, own held-out | {label}, external | gain over going alone, own | "
        "gain, external | ε (δ) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in decision["rows"]:
        eps = "no DP" if row.get("epsilon") is None else f"{row['epsilon']:.2f} ({row.get('delta'):g})"
        for entry in row["models"].values():
            lines.append(
                f"| {row['site']} | {entry['label']} | {_with_interval(entry.get('internal'))} | "
                f"{_with_interval(entry.get('external'))} | "
                f"{_with_interval(entry['gain'].get('internal'), True)} | "
                f"{_with_interval(entry['gain'].get('external'), True)} | {eps} |"
            )
    lines += ["", "## Verdicts", ""]
    for row in decision["rows"]:
        ref = row["reference"].get("internal")
        against = f" (going alone: {ref['name']}{_chosen(row.get('going_alone'))})" if ref else ""
        lines.append(f"- **{row['site']}**: {row['verdict']}{against}")
    lines += [
        "",
        "## Mean over sites",
        "",
        "| model | own held-out | external | gain, own | gain, external |",
    ]
    lines.append("|---|---|---|---|---|")
    for role, m in decision["mean_over_sites"].items():
        lines.append(
            f"| {m.get('label', ROLE_LABELS.get(role, role))} | {_fmt(m['internal'])} | "
            f"{_fmt(m['external'])} | "
            f"{_fmt(m['gain_internal'], True)} | {_fmt(m['gain_external'], True)} |"
        )
    if decision["notes"]:
        lines += ["", *[f"- {n}" for n in decision["notes"]]]
    return "\n".join(lines) + "\n"


def _chosen(alone: dict | None) -> str:
    """How going alone was chosen on the site's validation rows, in a few words."""
    if not alone:
        return ""
    reg, sk = alone.get("regular") or {}, alone.get("sklearn") or {}
    parts = []
    if reg.get("validation") is not None:
        parts.append(f"Regular at lr {reg['lr']:.3g} {reg['validation']:.3f}")
    if sk.get("validation") is not None:
        parts.append(f"logistic regression at C {sk['C']:g} {sk['validation']:.3f}")
    return f"; on its validation rows: {', '.join(parts)}" if parts else ""


def write(decision: dict, folder: str | Path) -> tuple[Path, Path]:
    """Write ``decision.json`` and ``report.md`` into ``folder``."""
    d = Path(folder)
    (d / DECISION_FILE).write_text(json.dumps(decision, indent=2) + "\n")
    (d / REPORT_FILE).write_text(markdown(decision))
    return d / DECISION_FILE, d / REPORT_FILE


def print_table(decision: dict, console) -> None:
    """The report on the console: one line per site and model, the verdicts, the mean over sites."""
    from rich.table import Table

    label = decision["metric_label"]
    t = Table(title=f"Decision per site ({label}, 95% intervals)")
    for col in ("site", "model", "own held-out", "external", "gain, own", "ε"):
        t.add_column(col)
    for row in decision["rows"]:
        eps = "no DP" if row.get("epsilon") is None else f"{row['epsilon']:.2f}"
        for entry in row["models"].values():
            t.add_row(
                row["site"],
                entry["label"],
                _with_interval(entry.get("internal")),
                _with_interval(entry.get("external")),
                _with_interval(entry["gain"].get("internal"), True),
                eps,
            )
    console.print(t)
    for row in decision["rows"]:
        console.print(f"{row['site']}: {row['verdict']}")
