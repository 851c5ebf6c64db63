"""The report of a ``silofl compare``: table (Markdown, CSV, JSON) and plots.

Accuracies are pooled over clients and seeds (mean ± std of every client's final value in every
seed); ε is the final ε averaged over clients and seeds, marked † where it is not a formal
guarantee; bytes are measured by the transport (per client: sent + received; total: everything
sent, server included).
"""

from __future__ import annotations

import csv
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from silofl.fl.registry import ACC_FIELDS as ACC_KEYS  # noqa: E402
from silofl.runner.folder import clean_json, mean_std, values_by_round  # noqa: E402
from silofl.training.metrics import METRICS, acc_field_of, higher_is_better, metric_field, metric_label  # noqa: E402


def _ms(vals: list[float]) -> dict:
    return {**mean_std(vals), "n": sum(v is not None for v in vals)}


def summarize(runs, results) -> tuple[list[dict], list[dict]]:
    """Rows per (variant, method label) and the list of failed runs."""
    groups: dict[tuple[str, str], list] = defaultdict(list)
    failed = []
    for r in runs:
        res = results.get(r.rid, {"error": "not run"})
        if "error" in res:
            failed.append({"run": r.rid, "error": res["error"]})
        else:
            groups[(r.variant, r.label)].append((r, res["summary"]))
    planned = {r.rid for r in runs}
    failed += [
        {"run": k, "error": v["error"]} for k, v in results.items() if k not in planned and "error" in v
    ]
    rows = []
    for (variant, label), items in groups.items():
        sums = [s for _, s in items]
        per = [c for s in sums for c in s["final"]["per_client"]]
        metric = getattr(
            items[0][0].cfg, "metric", "accuracy"
        )  # the comparison's --metric (all its runs share it)
        head = sums[0]["headline"]
        head = metric_field(
            acc_field_of(head) or head, metric
        )  # a run written with another --metric: this one's
        row: dict[str, Any] = {
            "variant": variant,
            "method": label,
            "headline": head,
            "seeds": [r.seed for r, _ in items],
        }
        for k in ACC_KEYS:
            row[k] = _ms([c.get(k) for c in per])
        for k in ACC_KEYS:  # every model's other metrics (silofl.training.metrics)
            for m in METRICS:
                if m != "accuracy":
                    row[metric_field(k, m)] = _ms([c.get(metric_field(k, m)) for c in per])
        row["metric"] = metric
        row["headline_acc"] = row[head]
        row["epsilon"] = _ms([c.get("epsilon") for c in per])
        for unit in ("hospital", "subclient"):  # client-level DP: both privacy units
            if sums[0]["privacy"].get(f"epsilon_{unit}") is not None:
                row[f"epsilon_{unit}"] = _ms([s["privacy"][f"epsilon_{unit}"] for s in sums])
        row["delta"] = sums[0]["privacy"]["delta"]
        # the mode's guarantee; a comparison's runs are seeded research runs (said under the table)
        row["formal_guarantee"] = sums[0]["privacy"].get(
            "formal_if_seed_secret", sums[0]["privacy"]["formal_guarantee"]
        )
        row["seeded"] = bool(sums[0].get("randomness", {}).get("seeded", True))
        row["privacy"] = sums[0]["privacy"]["mode"] if sums[0]["privacy"]["delta"] is not None else "off"
        row["bytes_per_client"] = statistics.fmean(s["bytes"]["per_client_mean"] for s in sums)
        row["bytes_total"] = statistics.fmean(s["bytes"]["total_sent"] for s in sums)
        row["wall_time_s"] = _ms([s["wall_time_s"] for s in sums])
        row["rounds"] = max(s["rounds_run"] for s in sums)
        row["runs"] = [r.rid for r, _ in items]
        rows.append(row)
    return rows, failed


def _fmt(d: dict, nd: int = 4) -> str:
    return "—" if d is None or d.get("mean") is None else f"{d['mean']:.{nd}f} ± {d['std']:.{nd}f}"


def _bytes(n: float) -> str:
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= f:
            return f"{n / f:.2f} {unit}"
    return f"{n:.0f} B"


def markdown_table(rows: list[dict]) -> str:
    """The comparison's main table in Markdown (its figures: the rows' --metric, accuracy by default)."""
    show_variant = len({r["variant"] for r in rows}) > 1
    metric = rows[0].get("metric", "accuracy") if rows else "accuracy"
    name = "acc" if metric == "accuracy" else metric_label(metric)
    fields = [metric_field(k, metric) for k in ("private_acc", "proxy_acc", "global_acc")]
    head = (["variant"] if show_variant else []) + [
        "method",
        "judged by",
        f"private {name}",
        f"proxy {name}",
        f"global {name}",
        "ε",
        "bytes / client",
        "bytes total",
        "wall s",
        "rounds",
        "seeds",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r["epsilon"]["mean"] is None:
            eps = "no DP"
        else:
            eps = f"{r['epsilon']['mean']:.2f}{'' if r['formal_guarantee'] else ' †'}"
            if "epsilon_hospital" in r:
                eps = (
                    f"{r['epsilon_hospital']['mean']:.2f} hospital / {r['epsilon_subclient']['mean']:.2f} "
                    f"sub-client"
                )
        cells = ([r["variant"]] if show_variant else []) + [
            r["method"],
            r["headline"].removesuffix("_" + METRICS[metric]),
            _fmt(r[fields[0]]),
            _fmt(r[fields[1]]),
            _fmt(r[fields[2]]),
            eps,
            _bytes(r["bytes_per_client"]),
            _bytes(r["bytes_total"]),
            f"{r['wall_time_s']['mean']:.0f}",
            str(r["rounds"]),
            ",".join(map(str, r["seeds"])),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _figures_note(rows: list[dict]) -> str:
    metric = rows[0].get("metric", "accuracy") if rows else "accuracy"
    if metric == "accuracy":
        return "Accuracies"
    return (
        f"Figures: {metric_label(metric)} on the test set "
        f"({'lower' if not higher_is_better(metric) else 'higher'} is "
        "better; results.json holds every metric)"
    )


def _curves(runs, results, key_of) -> dict:
    """(variant, label) -> {round: [values over clients and seeds]} of the metric key_of(summary)."""
    out: dict = defaultdict(lambda: defaultdict(list))
    for r in runs:
        res = results.get(r.rid, {})
        if "summary" not in res:
            continue
        for rnd, vals in values_by_round(r.cfg.out, key_of(res["summary"])).items():
            out[(r.variant, r.label)][rnd] += vals
    return out


def _headline_of(runs):
    """summary ↦ the field the comparison is judged by: the method's judged model scored by the runs'
    --metric."""
    metric = getattr(runs[0].cfg, "metric", "accuracy") if runs else "accuracy"
    return lambda s: metric_field(acc_field_of(s["headline"]) or s["headline"], metric)


def _metric_name(runs) -> str:
    return metric_label(getattr(runs[0].cfg, "metric", "accuracy")) if runs else "accuracy"


def plot_accuracy_vs_round(runs, results, path: Path) -> Path:
    """Accuracy against rounds (mean ± std band), one panel per variant."""
    curves = _curves(runs, results, _headline_of(runs))
    variants = list(dict.fromkeys(r.variant for r in runs))
    cols = min(4, len(variants))
    nrows = -(-len(variants) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(6.5 * cols, 4.5 * nrows), squeeze=False)
    for ax in axes.flat[len(variants) :]:
        ax.set_visible(False)
    for ax, v in zip(axes.flat, variants, strict=False):
        for (var, label), by_round in curves.items():
            if var != v:
                continue
            xs = np.array(sorted(by_round))
            m = np.array([np.mean(by_round[x]) for x in xs])
            sd = np.array([np.std(by_round[x]) for x in xs])
            ax.plot(xs, m, label=label)
            ax.fill_between(xs, m - sd, m + sd, alpha=0.15)
        ax.set_title(v if len(variants) > 1 else "")
        ax.set_xlabel("round")
        ax.set_ylabel(f"test {_metric_name(runs)} of the judged model\n(mean ± std over clients and seeds)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no finished run", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_accuracy_vs_epsilon(runs, results, path: Path) -> Path | None:
    """Accuracy against ε as the rounds go, one line per (variant, method); None if no DP run."""
    acc = _curves(runs, results, _headline_of(runs))
    eps = _curves(runs, results, lambda s: "epsilon")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    drawn = False
    multi = len({r.variant for r in runs}) > 1
    delta = None
    for key, by_round in acc.items():
        e = eps.get(key)
        if not e:
            continue
        xs = sorted(set(by_round) & set(e))
        if not xs:
            continue
        ax.plot(
            [np.mean(e[x]) for x in xs],
            [np.mean(by_round[x]) for x in xs],
            label=f"{key[0]} · {key[1]}" if multi else key[1],
        )
        drawn = True
    for r in runs:
        if r.cfg.is_private:
            delta = r.cfg.delta
            break
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel(f"ε at δ = {delta:g} (as the rounds go)")
    ax.set_ylabel(f"test {_metric_name(runs)} of the judged model (mean)")
    ax.grid(alpha=0.3)
    n = len(ax.get_legend_handles_labels()[0])
    if n > 12:  # many variants × methods: the legend goes beside the axes, in columns
        fig.set_size_inches(7 + 3.2 * -(-n // 30), 4.5 + 0.12 * min(n, 30))
        ax.legend(fontsize=6, ncol=-(-n // 30), loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # keeps a legend placed beside the axes
    plt.close(fig)
    return path


def plot_communication(comm: list[dict], path: Path) -> Path:
    """Measured MB per round against the number of clients."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = [("o", "-", 9), ("s", "--", 6), ("^", ":", 9), ("x", "-.", 6)]  # overlapping lines stay visible
    for i, m in enumerate(dict.fromkeys(r["method"] for r in comm)):
        pts = sorted((r["clients"], r["bytes_per_round"]) for r in comm if r["method"] == m)
        marker, ls, size = styles[i % len(styles)]
        ax.plot(
            [p[0] for p in pts],
            [p[1] / 1e6 for p in pts],
            marker=marker,
            ls=ls,
            ms=size,
            label=m,
            fillstyle="none" if i % 2 else "full",
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("number of clients K")
    ax.set_ylabel("MB sent per round, all nodes (measured)")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(out: Path, runs, results, comm, cc) -> dict:
    """report.md, results.csv, results.json and the plots of a comparison."""
    rows, failed = summarize(runs, results)
    plots = [plot_accuracy_vs_round(runs, results, out / "accuracy_vs_round.png").name] if rows else []
    if rows:
        p = plot_accuracy_vs_epsilon(runs, results, out / "accuracy_vs_epsilon.png")
        if p:
            plots.append(p.name)
    if comm:
        plots.append(plot_communication(comm, out / "communication_vs_clients.png").name)
    report = {
        "rows": rows,
        "failed": failed,
        "communication": comm,
        "plots": plots,
        "resumed": sorted(k for k, v in results.items() if v.get("resumed")),
        "compare": {"methods": cc.methods, "seeds": cc.seeds, "preset": cc.preset},
    }
    (out / "results.json").write_text(json.dumps(clean_json(report), indent=2) + "\n")
    _write_csv(out / "results.csv", rows)
    md = ["# silofl compare report", ""]
    if rows:
        md += [
            markdown_table(rows),
            "",
            f"{_figures_note(rows)}: mean ± std over every client's final value in every seed. ε: final, at "
            f"δ = {next((r['delta'] for r in rows if r['delta']), 0):g}, from the runs' accountants; † = "
            "not a formal guarantee (paper privacy mode). Bytes: measured on the serialized messages."
            + (
                " Every run is a seeded research run (reproducible): its ε holds only while the seed stays "
                "secret."
                if any(r.get("seeded") for r in rows)
                else ""
            ),
            "",
        ]
    if failed:
        md += ["## Failed runs", ""] + [f"- `{f['run']}`: {f['error']}" for f in failed] + [""]
    if comm:
        md += [
            "## Communication per round (measured)",
            "",
            "| method | K | bytes / round | bytes / client / round |",
            "|---|---|---|---|",
        ]
        md += [
            f"| {r['method']} | {r['clients']} | {_bytes(r['bytes_per_round'])} | "
            f"{_bytes(r['bytes_per_client_per_round'])} |"
            for r in comm
        ]
        md.append("")
    md += [f"![{p}]({p})" for p in plots]
    (out / "report.md").write_text("\n".join(md) + "\n")
    return report


def _write_csv(path: Path, rows: list[dict]) -> None:
    """results.csv: one line per variant, the figures of results.json's rows."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "variant",
                "method",
                "headline",
                "headline_mean",
                "headline_std",
                "private_mean",
                "private_std",
                "proxy_mean",
                "proxy_std",
                "global_mean",
                "global_std",
                "epsilon",
                "delta",
                "formal_guarantee",
                "bytes_per_client",
                "bytes_total",
                "wall_time_s",
                "rounds",
                "seeds",
                "metric",
            ]
        )
        for r in rows:
            m = r.get("metric", "accuracy")  # private/proxy/global columns: the comparison's metric
            pv, px, gl = (r[metric_field(k, m)] for k in ("private_acc", "proxy_acc", "global_acc"))
            w.writerow(
                [
                    r["variant"],
                    r["method"],
                    r["headline"],
                    r["headline_acc"]["mean"],
                    r["headline_acc"]["std"],
                    pv["mean"],
                    pv["std"],
                    px["mean"],
                    px["std"],
                    gl["mean"],
                    gl["std"],
                    r["epsilon"]["mean"],
                    r["delta"],
                    r["formal_guarantee"],
                    r["bytes_per_client"],
                    r["bytes_total"],
                    r["wall_time_s"]["mean"],
                    r["rounds"],
                    " ".join(map(str, r["seeds"])),
                    m,
                ]
            )
