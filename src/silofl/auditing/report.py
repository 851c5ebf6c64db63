"""An audit's folder: audit.json, audit.md, attacks.csv, canary_scores.csv, split.json and audit.png.

``audit.json`` holds the headline (``epsilon_lower_bound`` with its ``confidence``,
``epsilon_accountant``, ``delta``), the bound's hypotheses, the canary settings and coins' outcome, and
the membership-inference figures per target and attack; ``attacks.csv`` is the same attack table;
``canary_scores.csv`` every canary's scores and coin; ``split.json`` which rows were members,
non-members, population, reference data and canaries (``train:i`` / ``test:i`` rows of the data set).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from silofl.auditing.gauss import epsilon_text
from silofl.core.errors import ConfigError
from silofl.runner.folder import clean_json

FILES = ("audit.json", "audit.md", "attacks.csv", "canary_scores.csv", "split.json", "audit.png")
EXTRA_FILES = ("inversion.png",)  # written by the attacks asked for with --attack (silofl.auditing.settings)


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse a folder that holds another audit (unless ``overwrite``), or a file."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a folder")
    if out.is_dir() and any((out / f).exists() for f in (*FILES, *EXTRA_FILES, "run")) and not overwrite:
        raise ConfigError(
            f"{out} already holds an audit; choose another --out or replace it with --overwrite"
        )


def clear(out: Path) -> None:
    """Remove a previous audit's files (for --overwrite)."""
    import shutil

    for f in (*FILES, *EXTRA_FILES):
        (out / f).unlink(missing_ok=True)
    if (out / "run").is_dir():
        shutil.rmtree(out / "run")


def fmt(v, nd: int = 3) -> str:
    """A figure for a Markdown cell: ``nd`` decimals, — for None."""
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def attack_rows(mi: dict) -> list[dict]:
    """One row per (target, attack)."""
    rows = []
    for target, t in mi.get("targets", {}).items():
        for attack, f in t["attacks"].items():
            rows.append(
                {
                    "target": target,
                    "model": t["model"],
                    "attack": attack,
                    "auc": f["auc"],
                    "tpr_at_0.1%_fpr": f["tpr_at_0.1%_fpr"],
                    "tpr_at_1%_fpr": f["tpr_at_1%_fpr"],
                    "balanced_accuracy": f["balanced_accuracy"],
                    "members": f["members"],
                    "nonmembers": f["nonmembers"],
                }
            )
    return rows


def markdown(audit: dict) -> str:
    """audit.md: the bound next to the accountant's ε, the attacks, the notes."""
    b = audit["bound"]
    lines = [
        f"# silofl audit: {audit['title']}",
        "",
        f"{audit['research_note']}",
        "",
        f"The accountant's ε: {audit.get('guarantee_note', '')}",
        "",
        "| empirical ε lower bound | confidence | ε accountant | δ | what ε protects | formal guarantee "
        "(mechanism) | canaries (in / out) | score, k | correct / guesses | largest ε this audit could show "
        "|",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| {fmt(audit['epsilon_lower_bound'])} | {audit['confidence']:.0%} | "
        f"{fmt(audit['epsilon_accountant'])} | "
        f"{audit['delta']:g} | {audit['unit']} | {'yes' if audit['formal_guarantee'] else 'no'} | "
        f"{audit['canaries']['included']} / {audit['canaries']['excluded']} | {b['score']}, {b['k_pos']} | "
        f"{b['correct']} / {b['guesses']} | {fmt(b['max_auditable_epsilon'])} |",
        "",
    ]
    if audit.get("bounds"):
        lines += [
            f"Canaries: {audit['canaries']['kind']}. Each threat model's scores give the "
            f"Steinke–Nasr–Jagielski "
            "bound and, beside it, the Gaussian-pair estimate of Agrawal et al. (an estimate under a "
            "Gaussian-scores assumption, not "
            f"a guarantee); the headline is the {audit['threat_model']} row, fixed in advance. With "
            f"{audit['canaries']['m']} canaries no audit can certify more than "
            f"ε = {fmt(audit.get('certifiable_epsilon_max'))} (SNJ, every guess right).",
            "",
            "| threat model | SNJ ε lower bound | correct / guesses | canary AUC | Gaussian-pair ε estimate "
            "| μ̂ (lower) |",
            "|---|---|---|---|---|---|",
        ]
        for tm, bt in audit["bounds"].items():
            sn, ga = bt["snj"], bt["gauss"]
            auc = next(iter(sn["canary_auc"].values()))
            lines.append(
                f"| {tm} | {fmt(sn['epsilon_lower_bound'])} | {sn['correct']} / {sn['guesses']} | {fmt(auc)} "
                f"| "
                f"{epsilon_text(ga)} | {fmt(ga['mu_hat'])} ({fmt(ga['mu_lower'])}) |"
            )
        lines.append("")
    rows = attack_rows(audit.get("membership_inference", {}))
    if rows:
        lines += [
            "Membership inference on real examples:",
            "",
            "| target | attack | AUC | TPR @ 0.1% FPR | TPR @ 1% FPR | members | non-members |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['target']} ({r['model']}) | {r['attack']} | {fmt(r['auc'])} | {fmt(r['tpr_at_0.1%_fpr'])} "
            f"| "
            f"{fmt(r['tpr_at_1%_fpr'])} | {r['members']} | {r['nonmembers']} |"
            for r in rows
        ]
        lines.append("")
    for name in audit.get("attacks_run", []):  # the attacks asked for with --attack
        from silofl.auditing.settings import AUDIT_ATTACKS

        lines += AUDIT_ATTACKS.get(name).markdown(audit[name])
    for note in audit.get("notes", []):
        lines.append(f"- {note}")
    return "\n".join(lines) + "\n"


def plot(
    path: Path, audit: dict, canary_scores: dict[str, np.ndarray], included: np.ndarray, curves: dict
) -> None:
    """audit.png: score distributions of included vs excluded canaries, and the attacks' ROC curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from silofl.auditing import attacks

    names = list(canary_scores)
    fig, axes = plt.subplots(1, len(names) + 1, figsize=(4.6 * (len(names) + 1), 4))
    for ax, name in zip(axes[:-1], names, strict=True):
        s = np.asarray(canary_scores[name], float)
        bins = np.linspace(s.min(), s.max(), 40) if s.max() > s.min() else 10
        ax.hist(s[included], bins=bins, alpha=0.6, label=f"included ({int(included.sum())})")
        ax.hist(s[~included], bins=bins, alpha=0.6, label=f"excluded ({int((~included).sum())})")
        ax.set_title(f"canary score: {name}")
        ax.set_xlabel("score (higher: more likely included)")
        ax.legend(fontsize=8)
    ax = axes[-1]
    for name in names:
        if 0 < included.sum() < len(included):
            c = attacks.roc_points(np.asarray(canary_scores[name], float), included)
            ax.plot(c["fpr"], c["tpr"], label=f"canaries: {name}", lw=2)
    for target, per_attack in curves.items():
        for attack, c in per_attack.items():
            ax.plot(c["fpr"], c["tpr"], label=f"{target}: {attack}", lw=1)
    ax.plot([1e-4, 1], [1e-4, 1], "k:", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(1e-3, 1)
    ax.set_ylim(1e-3, 1)
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    ax.set_title("ROC")
    ax.legend(fontsize=7)
    fig.suptitle(
        f"{audit['title']}: ε lower bound {fmt(audit['epsilon_lower_bound'], 2)} "
        f"({audit['confidence']:.0%}), accountant ε {fmt(audit['epsilon_accountant'], 2)}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(
    out: Path,
    audit: dict,
    canary_scores: dict[str, np.ndarray],
    included: np.ndarray,
    curves: dict,
    split: dict,
) -> None:
    """Write the audit's files into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    audit["files"] = list(FILES) + [f for f in EXTRA_FILES if (out / f).exists()]
    (out / "audit.json").write_text(json.dumps(clean_json(audit), indent=2, allow_nan=False) + "\n")
    (out / "audit.md").write_text(markdown(audit))
    rows = attack_rows(audit.get("membership_inference", {}))
    cols = [
        "target",
        "model",
        "attack",
        "auc",
        "tpr_at_0.1%_fpr",
        "tpr_at_1%_fpr",
        "balanced_accuracy",
        "members",
        "nonmembers",
    ]
    with open(out / "attacks.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    ids = split.get("canaries", [f"canary:{i}" for i in range(len(included))])
    with open(out / "canary_scores.csv", "w", newline="") as f:
        w2 = csv.writer(f)
        w2.writerow(["canary", "row", "included", *canary_scores])
        for i in range(len(included)):
            w2.writerow(
                [i, ids[i], int(included[i]), *(f"{float(s[i]):.6g}" for s in canary_scores.values())]
            )
    (out / "split.json").write_text(json.dumps(split) + "\n")
    plot(out / "audit.png", audit, canary_scores, included, curves)
