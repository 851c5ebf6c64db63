"""Plots of a run: accuracy (mean ± std over clients) and ε against rounds."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from silofl.fl.registry import ACC_FIELDS as ACC_KEYS  # noqa: E402


def series(records: list[dict], key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rounds, mean, std) over clients of one metric."""
    by_round: dict[int, list[float]] = defaultdict(list)
    for r in records:
        if r.get(key) is not None:
            by_round[r["round"]].append(float(r[key]))
    rounds = np.array(sorted(by_round))
    vals = [np.array(by_round[t]) for t in rounds]
    return rounds, np.array([v.mean() for v in vals]), np.array([v.std() for v in vals])


def plot_run(
    records: list[dict], out: str | Path, title: str = "", epsilon_note: str = "", delta: float | None = None
) -> Path:
    """Two panels: accuracy vs round, ε vs round (one line per client). Returns the PNG path."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    # sites without a shared test set (a deployed run) score only their own held-out rows: those figures
    sfx = (
        ""
        if any(r.get(k) is not None or r.get(_c_index(k)) is not None for r in records for k in ACC_KEYS)
        else "_internal"
    )
    # a survival run has no accuracy: its C-index instead (silofl.training.tasks)
    survival = not any(r.get(k + sfx) is not None for r in records for k in ACC_KEYS) and any(
        r.get(_c_index(k) + sfx) is not None for r in records for k in ACC_KEYS
    )
    drawn = False
    for key in ACC_KEYS:
        rounds, mean, std = series(records, (_c_index(key) if survival else key) + sfx)
        if len(rounds) == 0:
            continue
        drawn = True
        ax1.plot(rounds, mean, label=key.replace("_acc", ""))
        ax1.fill_between(rounds, mean - std, mean + std, alpha=0.2)
    ax1.set_xlabel("round")
    name = "C-index" if survival else "accuracy"
    shown = f"{name} on each site's own held-out rows" if sfx else f"test {name}"
    ax1.set_ylabel(f"{shown} (mean ± std over clients)")
    ax1.grid(alpha=0.3)
    if drawn:
        ax1.legend()
    clients = sorted({r["client"] for r in records})
    any_eps = False
    for c in clients:
        pts = [
            (r["round"], r["epsilon"]) for r in records if r["client"] == c and r.get("epsilon") is not None
        ]
        if pts:
            any_eps = True
            xs, ys = zip(*pts, strict=True)
            ax2.plot(xs, ys, label=f"client {c}", lw=1)
    ax2.set_xlabel("round")
    ax2.set_ylabel(f"ε at δ = {delta:g}" if delta else "ε")
    ax2.set_title(epsilon_note or ("no DP: ε not defined" if not any_eps else ""), fontsize=9)
    ax2.grid(alpha=0.3)
    if any_eps and len(clients) <= 16:
        ax2.legend(fontsize=7, ncol=2)
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(out)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _c_index(acc_key: str) -> str:
    """The C-index field of the model whose accuracy field is ``acc_key`` (``global_acc`` →
    ``global_c_index``)."""
    return acc_key.removesuffix("_acc") + "_c_index"


SERVER_PANELS = (
    ("xi", "ξ = ‖noise‖ / ‖Σ clipped‖"),
    ("phi", "φ = Σ‖clipped Δ‖ / ‖Σ clipped‖"),
    ("v", "sub-clients v per client"),
    ("clip", "clip C"),
)


def plot_server_rounds(history: list[dict], out: str | Path, title: str = "") -> Path:
    """Client-level DP diagnostics against rounds: ξ, φ (log scale), v and the clip."""
    fig, axes = plt.subplots(1, len(SERVER_PANELS), figsize=(15, 3.6))
    for ax, (key, label) in zip(axes, SERVER_PANELS, strict=True):
        pts = [(h["round"], h[key]) for h in history if h.get(key) is not None]
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, lw=1.2)
            if key in ("xi", "phi") and min(ys) > 0:
                ax.set_yscale("log")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    fig.suptitle(title + " (ξ, φ: diagnostics on the un-noised sum, not privatised)", fontsize=10)
    fig.tight_layout()
    path = Path(out)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
