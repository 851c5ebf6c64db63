"""Generate docs/client_dp.md from a `silofl compare --config bench/client_dp_study.yaml` folder.

    python -m studies.client_dp_doc reports/client-dp [--fixed-v reports/client-dp-fixed-v] \
        [--full-data reports/client-dp-full] [--clip-sampling reports/client-dp-clip] > docs/client_dp.md

``--fixed-v`` adds the runs of `silofl compare --config bench/client_dp_fixed_v.yaml` (v = 6 at both
units) to the comparison with the issue's pilot; ``--full-data`` the pilot's cell on all 60,000 training
images (`bench/client_dp_full_data.yaml`); ``--clip-sampling`` adaptive clipping and Poisson client sampling
(`bench/client_dp_clip_sampling.yaml`).

Every figure is read from the runs' summary.json / config.yaml; plots and a JSON of the tables are
written next to the document (docs/client_dp_*.png, docs/data/client_dp.json).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from silofl.fl.registry import methods  # noqa: E402
from silofl.runner.folder import mean_std, read_config  # noqa: E402

# each non-private client-level method and the DP method with its server optimizer (rows of one table)
DP_TWIN = {
    name: twin
    for name, info in methods().items()
    if info.traits.nonprivate
    for twin, other in methods().items()
    if not other.traits.nonprivate and other.client_level and other.cls.optimizer == info.cls.optimizer
}

DOCS = Path(__file__).resolve().parent.parent / "docs"
OPTIMIZERS = {
    "dp-fedavg": "DP-FedAvg",
    "dp-fedadam": "DP-FedAdam",
    "dp-fednova": "DP-FedNova",
    "dp2-rmsprop": "DP²-RMSProp",
}
CONDITIONS = {
    "none": "w/o intermediaries",
    "subclient": "adaptive v, sub-client unit",
    "hospital": "adaptive v, hospital unit",
}
COND_SHORT = {"none": "w/o", "subclient": "w/ (sub-client)", "hospital": "w/ (hospital)"}


def load_runs(folder: Path) -> list[dict]:
    """One row per finished run under a report folder (its settings and final figures)."""
    runs = []
    for s_path in sorted(folder.glob("runs/*/*/seed*/summary.json")):
        cfg = read_config(s_path.parent)
        s = json.loads(s_path.read_text())
        private = cfg["privacy"] != "off"
        iv = cfg["intermediaries"]
        cond = (
            "nodp"
            if not private
            else "none"
            if iv == "none"
            else cfg["privacy_unit"]
            if iv == "adaptive"
            else f"v={iv} {cfg['privacy_unit']}"
        )
        hist = s.get("server_rounds", [])
        runs.append(
            {
                "method": DP_TWIN.get(cfg["method"], cfg["method"]),
                "N": cfg["clients"],
                "z": cfg["noise_multiplier"] if private else None,
                "cond": cond,
                "seed": cfg["seed"],
                "acc": s["final"]["global_acc"]["mean"],
                "eps_h": s["privacy"].get("epsilon_hospital"),
                "eps_s": s["privacy"].get("epsilon_subclient"),
                "delta": s["privacy"]["delta"],
                "history": hist,
                "v_mean": statistics.fmean(h["v"] for h in hist) if hist else None,
                "v_last": statistics.fmean(h["v"] for h in hist[-10:]) if hist else None,
                "wall": s["wall_time_s"],
                "rounds": s["rounds_run"],
                "n": cfg["samples_per_client"],
                "cfg": cfg,
            }
        )
    return runs


def cell(vals: list[float], nd: int = 3) -> str:
    """A mean ± std table cell."""
    ms = mean_std(vals)
    return "—" if ms["mean"] is None else f"{ms['mean']:.{nd}f} ± {ms['std']:.{nd}f}"


def pm(d: dict, nd: int = 3) -> str:
    """Mean ± std of the values, formatted."""
    return "—" if d["mean"] is None else f"{d['mean']:.{nd}f} ± {d['std']:.{nd}f}"


def one(d: dict, nd: int = 1) -> str:
    """The single run matching the filters."""
    return "—" if d["mean"] is None else f"{d['mean']:.{nd}f}"


def pick(runs, **kw) -> list[dict]:
    """The rows matching every key = value filter."""
    return [r for r in runs if all(r[k] == v for k, v in kw.items())]


def accuracy_table(runs, n: int, zs: list[float]) -> tuple[str, dict]:
    """The Markdown accuracy table of the client-level study."""
    head = ["server optimizer", "no DP"] + [f"z={z} {COND_SHORT[c]}" for z in zs for c in CONDITIONS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    data = {}
    for m, name in OPTIMIZERS.items():
        row = [name, cell([r["acc"] for r in pick(runs, method=m, N=n, cond="nodp")])]
        data[m] = {"nodp": mean_std([r["acc"] for r in pick(runs, method=m, N=n, cond="nodp")])}
        for z in zs:
            for c in CONDITIONS:
                vals = [r["acc"] for r in pick(runs, method=m, N=n, z=z, cond=c)]
                row.append(cell(vals))
                data[m][f"z={z} {c}"] = {**mean_std(vals), "seeds": len(vals)}
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines), data


def epsilon_table(runs, n: int, zs: list[float]) -> tuple[str, dict]:
    """The Markdown table of ε per unit of the client-level study."""
    head = ["z", "condition", "v (mean over rounds)", "ε hospital", "ε sub-client", "guarantee of the run"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    data = {}
    for z in zs:
        for c, label in CONDITIONS.items():
            rs = pick(runs, N=n, z=z, cond=c)
            if not rs:
                continue
            eh, es = mean_std([r["eps_h"] for r in rs]), mean_std([r["eps_s"] for r in rs])
            v = mean_std([r["v_mean"] for r in rs])
            unit = "hospital" if c in ("none", "hospital") else "sub-client only"
            lines.append(
                f"| {z} | {label} | {v['mean']:.1f} ± {v['std']:.1f} | {eh['mean']:.2f} ± {eh['std']:.2f} | "
                f"{es['mean']:.2f} ± {es['std']:.2f} | {unit} |"
            )
            data[f"z={z} {c}"] = {"eps_hospital": eh, "eps_subclient": es, "v_mean": v}
    return "\n".join(lines), data


def curves(runs, key: str, **kw) -> tuple[list[int], list[float]]:
    """Accuracy per round of each (method, condition), pooled over seeds."""
    by_round = defaultdict(list)
    for r in pick(runs, **kw):
        for h in r["history"]:
            if h.get(key) is not None:
                by_round[h["round"]].append(h[key])
    xs = sorted(by_round)
    return xs, [statistics.fmean(by_round[x]) for x in xs]


def plot_rounds(runs, ns: list[int], z: float, path: Path) -> None:
    """Accuracy, v and clip against rounds for one cell of the study."""
    keys = (
        ("xi", "ξ = ‖noise‖ / ‖Σ clipped Δ‖"),
        ("phi", "φ = Σ‖clipped Δ‖ / ‖Σ clipped Δ‖"),
        ("v", "v (sub-clients)"),
    )
    fig, axes = plt.subplots(len(ns), len(keys), figsize=(14, 3.6 * len(ns)), squeeze=False)
    for i, n in enumerate(ns):
        for j, (key, label) in enumerate(keys):
            ax = axes[i][j]
            for c, name in CONDITIONS.items():
                xs, ys = curves(runs, key, method="dp-fedavg", N=n, z=z, cond=c)
                if xs:
                    ax.plot(xs, ys, label=name, lw=1.3)
            if key != "v":
                ax.set_yscale("log")
            ax.set_title(f"N={n}, z={z}, DP-FedAvg: {label}", fontsize=9)
            ax.set_xlabel("round")
            ax.grid(alpha=0.3)
            if i == 0 and j == 0:
                ax.legend(fontsize=8)
    fig.suptitle(
        "Per-round diagnostics, mean over seeds (ξ, φ measured on the un-noised sum: not privatised)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_accuracy(runs, ns: list[int], zs: list[float], path: Path) -> None:
    """The accuracy-vs-noise plot of the study."""
    fig, axes = plt.subplots(1, len(ns), figsize=(6.5 * len(ns), 4.2), squeeze=False)
    markers = dict(zip(OPTIMIZERS, "osD^", strict=True))
    colors = {"none": "tab:blue", "subclient": "tab:green", "hospital": "tab:red"}
    for ax, n in zip(axes[0], ns, strict=True):
        for m, name in OPTIMIZERS.items():
            for c, label in CONDITIONS.items():
                ys = [
                    mean_std([r["acc"] for r in pick(runs, method=m, N=n, z=z, cond=c)])["mean"] for z in zs
                ]
                ax.plot(
                    zs,
                    ys,
                    marker=markers[m],
                    color=colors[c],
                    lw=0.8,
                    alpha=0.85,
                    label=f"{name}, {label}" if n == ns[0] else None,
                )
            nodp = mean_std([r["acc"] for r in pick(runs, method=m, N=n, cond="nodp")])["mean"]
            if nodp is not None:
                ax.axhline(nodp, color="grey", lw=0.6, ls=":")
        ax.set_title(f"N = {n} clients (dotted: no DP)", fontsize=10)
        ax.set_xlabel("noise multiplier z")
        ax.set_ylabel("global model accuracy (mean of seeds)")
        ax.set_xticks(zs)
        ax.grid(alpha=0.3)
    fig.legend(loc="lower center", ncol=4, fontsize=7)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def clip_sampling_section(folder: Path, data: dict) -> list[str]:
    """Adaptive vs fixed clip, full participation vs Poisson client sampling."""
    rows = defaultdict(list)
    for r in load_runs(folder):
        cfg = r["cfg"]
        key = (r["method"], "adaptive" if cfg["adaptive_clip"] else "fixed", cfg["client_rate"])
        hist = r["history"]
        rows[key].append(
            {
                "acc": r["acc"],
                "eps": r["eps_h"],
                "clip": hist[-1]["clip"] if hist else None,
                "updates": statistics.fmean(h["updates"] for h in hist) if hist else None,
            }
        )
    if not rows:
        return []
    out = [
        "## Adaptive clipping and client sampling",
        "",
        "N = 20 clients × 600 images, z = 1, no intermediaries, 50 rounds, seeds 0–2. Adaptive clipping "
        "targets the",
        "median update norm from C0 = 1 (noised count std 2.5, learning rate 0.2); q is the Poisson rate of "
        "clients",
        "per round. ε per hospital at δ = 1e-5.",
        "",
        "| server optimizer | clip | q | accuracy | ε hospital | final clip C | updates per round |",
        "|---|---|---|---|---|---|---|",
    ]
    for (m, clip, q), rs in sorted(rows.items()):
        acc = mean_std([x["acc"] for x in rs])
        out.append(
            f"| {OPTIMIZERS.get(m, m)} | {clip} | {q:g} | {pm(acc)} | "
            f"{one(mean_std([x['eps'] for x in rs]), 2)} | "
            f"{one(mean_std([x['clip'] for x in rs]), 3)} | {one(mean_std([x['updates'] for x in rs]))} |"
        )
        data.setdefault("clip_sampling", {})[f"{m} {clip} q={q}"] = {"accuracy": acc, "runs": len(rs)}
    return out + [
        "",
        "When every update is clipped, the server's step (mean of clipped updates plus noise) is "
        "proportional to C.",
        "A smaller C is therefore also a smaller step, and part of adaptive clipping's gain here may be that "
        "step size.",
        "The main study keeps C = 1 and the server learning rates fixed for every condition.",
        "",
    ]


def main(argv: list[str]) -> None:
    """Write docs/client_dp.md from the study's report folders (arguments: see the module doc)."""
    import argparse

    ap = argparse.ArgumentParser(usage=__doc__)
    ap.add_argument("folder")
    ap.add_argument("--fixed-v", default=None)
    ap.add_argument("--full-data", default=None)
    ap.add_argument("--clip-sampling", default=None)
    a = ap.parse_args(argv)
    folder = Path(a.folder)
    runs = load_runs(folder)
    fixed = load_runs(Path(a.fixed_v)) if a.fixed_v else []
    full = load_runs(Path(a.full_data)) if a.full_data else []
    if not runs:
        sys.exit(f"no finished runs under {folder}/runs")
    ns = sorted({r["N"] for r in runs})
    zs = sorted({r["z"] for r in runs if r["z"] is not None})
    seeds = sorted({r["seed"] for r in runs})
    cfg0 = runs[0]["cfg"]
    (DOCS / "data").mkdir(parents=True, exist_ok=True)
    plot_rounds(runs, ns, 1.0 if 1.0 in zs else zs[0], DOCS / "client_dp_rounds.png")
    plot_accuracy(runs, ns, zs, DOCS / "client_dp_accuracy.png")
    sizes = {n: pick(runs, N=n)[0]["n"] for n in ns}
    out = [
        "# Client-level DP with adaptive intermediaries: measured",
        "",
        "Generated by `bash bench/client_dp_study.sh`, which ends with `python -m studies.client_dp_doc "
        "reports/client-dp "
        "--fixed-v reports/client-dp-fixed-v --full-data reports/client-dp-full --clip-sampling "
        "reports/client-dp-clip "
        "> docs/client_dp.md`.",
        "It reads the runs of `silofl compare --config bench/client_dp_study.yaml` (preset `client-dp`),",
        "`bench/client_dp_fixed_v.yaml`, `bench/client_dp_full_data.yaml` and "
        "`bench/client_dp_clip_sampling.yaml`.",
        "Nothing here is typed by hand.",
        "",
        "## Set-up",
        "",
        "- Fashion-MNIST, IID split: "
        + ", ".join(f"N = {n} clients × {sizes[n]} training images" for n in ns)
        + " (12,000 images in both splits, to keep the 240 runs within a CPU session); the full 10,000-image "
        "test set.",
        f"- Model {cfg0['proxy_model']} (784-256-10), {cfg0['rounds']} rounds, full participation, local "
        f"SGD: "
        f"{cfg0['local_epochs']} epoch, batch {cfg0['batch_size']}, lr {cfg0['local_lr']}; clip C = "
        f"{cfg0['clip']} "
        "(fixed), server learning rates: DP-FedAvg/FedNova 1.0, FedAdam 0.03 (β = 0.9/0.99, τ = 1e-3, no "
        "bias "
        "correction), DP²-RMSProp 0.03 (0.003 without DP) in adaptive phases with a bias-corrected "
        "preconditioner and 1.0 in SGD phases (delay 5 rounds).",
        "  The server learning rates were picked in a short pilot (N = 6, z = 1, seed 0, 30 rounds, 2–3 "
        "values each).",
        f"- Seeds {', '.join(map(str, seeds))}; every accuracy is the global model's, mean ± std over seeds.",
        f"- δ = {runs[0]['delta'] or cfg0['delta']:g}; every ε is Opacus' RDP accountant fed with the "
        f"mechanism run: "
        "one Gaussian release per round, q = 1, the round's noise multiplier for each unit.",
        "- Adaptive v: v = √(N·λ̂), λ̂ = ‖noise‖ / (noised Σ‖clipped Δ‖), clamped to [1, ⌊n/B⌋] = "
        + ", ".join(f"[1, {sizes[n] // cfg0['batch_size']}] at N = {n}" for n in ns)
        + "; the norm sum is released with noise multiplier 5z and the update noise raised so the total "
        "stays z.",
        "",
        "Conditions:",
        "- **w/o**: one update per client, clipped to C. Hospital and sub-client coincide (v = 1).",
        "- **w/ (sub-client)**: the paper's setting. Each sub-client is clipped to C, noise z·C.",
        "  The run's ε is per sub-client.",
        "  A hospital moves the sum by v·C, so its ε is accounted with multiplier z/v (reported as ε "
        "hospital).",
        "- **w/ (hospital)**: silofl's default. Each sub-client is clipped to C/v, so a hospital moves the "
        "sum by at most C.",
        "  The run's ε is per hospital.",
        "",
    ]
    data = {"sizes": sizes, "accuracy": {}, "epsilon": {}}
    for n in ns:
        t, d = accuracy_table(runs, n, zs)
        e, de = epsilon_table(runs, n, zs)
        data["accuracy"][n], data["epsilon"][n] = d, de
        out += [
            f"## N = {n} clients",
            "",
            "Test accuracy (global model):",
            "",
            t,
            "",
            f"Privacy spent after {cfg0['rounds']} rounds (all optimizers pooled; ε at δ = "
            f"{cfg0['delta']:g}):",
            "",
            e,
            "",
        ]
    # what the pilot measured vs what we measured, same cell
    if 6 in ns and 1.0 in zs:
        get = {
            c: mean_std([r["acc"] for r in pick(runs, method="dp-fedavg", N=6, z=1.0, cond=c)])
            for c in CONDITIONS
        }
        vs = {
            c: mean_std([r["v_mean"] for r in pick(runs, method="dp-fedavg", N=6, z=1.0, cond=c)])
            for c in CONDITIONS
        }
        out += [
            "## Against the issue's pilot (N = 6, z = 1, DP-FedAvg)",
            "",
            "| condition | pilot (published code's semantics) | silofl, measured | mean v |",
            "|---|---|---|---|",
            f"| w/o intermediaries | 0.58 | {pm(get['none'])} | 1 |",
            f"| w/ intermediaries, sub-client unit | 0.81 (v ≈ 6) | {pm(get['subclient'])} | "
            f"{one(vs['subclient'])} |",
            f"| w/ intermediaries, hospital unit | ≈ 0.52 | {pm(get['hospital'])} | {one(vs['hospital'])} |",
        ]
        for cond in sorted({r["cond"] for r in fixed}):
            rs = pick(fixed, method="dp-fedavg", N=6, z=1.0, cond=cond)
            acc = mean_std([r["acc"] for r in rs])
            eh, es = mean_std([r["eps_h"] for r in rs]), mean_std([r["eps_s"] for r in rs])
            out.append(
                f"| fixed {cond.replace(' ', ', ')} unit (ε hospital {one(eh)}, sub-client {one(es)}) "
                f"| — | {pm(acc)} | {cond.split()[0][2:]} |"
            )
            data.setdefault("fixed_v", {})[cond] = {"accuracy": acc, "eps_hospital": eh, "eps_subclient": es}
        for c in CONDITIONS:
            rs = pick(full, method="dp-fedavg", N=6, z=1.0, cond=c)
            if rs:
                acc, v = mean_std([r["acc"] for r in rs]), mean_std([r["v_mean"] for r in rs])
                eh, es = mean_std([r["eps_h"] for r in rs]), mean_std([r["eps_s"] for r in rs])
                out.append(
                    f"| {CONDITIONS[c]}, all 60,000 images (6 × {rs[0]['n']}; ε hospital {one(eh)}, "
                    f"sub-client {one(es)}) | — | {pm(acc)} | {one(v)} |"
                )
                data.setdefault("full_data", {})[c] = {"accuracy": acc, "v_mean": v, "seeds": len(rs)}
        out.append("")
        data["pilot_cell"] = {"accuracy": get, "v_mean": vs}
    # per-seed comparison of the conditions, every optimizer, z and N
    wins = defaultdict(lambda: [0, 0])
    for r in pick(runs, cond="subclient") + pick(runs, cond="hospital"):
        base = pick(runs, method=r["method"], N=r["N"], z=r["z"], cond="none", seed=r["seed"])
        if base:
            wins[r["cond"]][0] += r["acc"] > base[0]["acc"]
            wins[r["cond"]][1] += 1
    out += [
        "## Paired by seed",
        "",
        "How often adaptive intermediaries beat no intermediaries, with the same optimizer, z, N and seed:",
        "",
    ]
    for c in ("subclient", "hospital"):
        w, tot = wins[c]
        out.append(f"- {CONDITIONS[c]}: {w} of {tot} runs")
    data["wins"] = dict(wins)
    same = [
        (a, b)
        for a in pick(runs, method="dp-fednova")
        for b in pick(runs, method="dp-fedavg")
        if (a["N"], a["z"], a["cond"], a["seed"]) == (b["N"], b["z"], b["cond"], b["seed"])
    ]
    if same and all(a["acc"] == b["acc"] for a, b in same):
        out += [
            "",
            f"DP-FedNova equals DP-FedAvg exactly in all {len(same)} paired runs.",
            "The IID split gives equal shares, so every (sub-)client takes the same number of local steps.",
            "With τ_j = τ̄ the normalisation Δ_j·τ̄/τ_j is the identity; FedNova differs only when step "
            "counts differ",
            "(tested in `tests/methods/test_client_dp.py`).",
        ]
    if a.clip_sampling:
        out += ["", *clip_sampling_section(Path(a.clip_sampling), data)]
    walls = [r["wall"] for r in runs]
    out += [
        "",
        "## Plots",
        "",
        "![accuracy against z](client_dp_accuracy.png)",
        "",
        "![xi, phi and v per round](client_dp_rounds.png)",
        "",
        "## Cost",
        "",
        f"{len(runs)} runs, {statistics.fmean(walls):.1f} s per run on average (min {min(walls):.1f} s, max "
        f"{max(walls):.1f} s), two runs at a time, one thread each, on the 2-core CPU.",
        "",
    ]
    (DOCS / "data" / "client_dp.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1:])
