"""Generate docs/proxyfl.md from run folders and bench JSON files (nothing in it is typed by hand).

    .venv/bin/python -m studies.proxyfl_doc --strict runs/main-strict --paper runs/main-paper \
        --seeds strict=runs/main-strict,runs/strict-s1,runs/strict-s2 --seeds
        paper=runs/main-paper,runs/paper-s1,runs/paper-s2 \
        --seeds "strict, optimizer_state reset"=runs/strict-reset-s0,runs/strict-reset-s1,runs/strict-reset-s2
        \
        --bench-step bench/out/dp_step.json --bench-round bench/out/proxyfl_round.json --out docs/proxyfl.md
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from silofl.runner.folder import read_config, read_metrics  # noqa: E402
from silofl.runner.plots import series  # noqa: E402


def ms(d: dict, nd: int = 4) -> str:
    """Mean ± std of a summary's {mean, std}, formatted."""
    return "—" if d["mean"] is None else f"{d['mean']:.{nd}f} ± {d['std']:.{nd}f}"


def run_rows(runs: dict[str, Path]) -> list[str]:
    """Table rows of the main runs (mode, guarantee, settings, final figures)."""
    rows = [
        "| mode | formal guarantee | optimizer state | rounds | private acc | proxy acc | ε (δ) | accountant "
        "| wall time | s/round | command |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, d in runs.items():
        s = json.loads((d / "summary.json").read_text())
        cfg = read_config(d)
        fin, priv = s["final"], s["privacy"]
        cmd = (
            f"`silofl run --method proxyfl --dataset {cfg['dataset']} --clients {cfg['clients']} --rounds "
            f"{cfg['rounds']} "
            f"--seed {cfg['seed']} --privacy {cfg['privacy']} --eval-every {cfg['eval_every']} --out {d}`"
        )
        eps = (
            f"{fin['epsilon']['mean']:.2f} ({priv['delta']:g})" if fin["epsilon"]["mean"] is not None else "—"
        )
        rows.append(
            f"| {mode} | {'yes' if priv['formal_guarantee'] else '**no**'} | {cfg['optimizer_state']} | "
            f"{s['rounds_run']} | {ms(fin['private_acc'])} | "
            f"{ms(fin['proxy_acc'])} | {eps} | {priv['accountant']} | {s['wall_time_s']:.0f} s | "
            f"{s['seconds_per_round']:.2f} | {cmd} |"
        )
    return rows


def seed_section(specs: list[str]) -> list[str]:
    """Per mode: each seed's client-mean accuracy, then mean ± std over seeds."""
    import statistics

    lines = [
        "## Over seeds (8-client mean per run; mean ± std over runs)",
        "",
        "| variant | seeds | threads | private acc | proxy acc | ε | per-seed private | per-seed proxy |",
        "|---|---|---|---|---|---|---|---|",
    ]
    means = {}
    for spec in specs:
        mode, dirs = spec.split("=", 1)
        sums = [json.loads((Path(d) / "summary.json").read_text()) for d in dirs.split(",")]
        seeds = [read_config(Path(d))["seed"] for d in dirs.split(",")]
        pv = [x["final"]["private_acc"]["mean"] for x in sums]
        px = [x["final"]["proxy_acc"]["mean"] for x in sums]
        eps = {round(x["final"]["epsilon"]["mean"], 2) for x in sums}
        sd = statistics.pstdev
        means[mode] = (statistics.fmean(pv), statistics.fmean(px))
        threads = ",".join(str(x["threads"]) for x in sums)
        lines.append(
            f"| {mode} | {','.join(map(str, seeds))} | {threads} | {statistics.fmean(pv):.4f} ± {sd(pv):.4f} "
            f"| "
            f"{statistics.fmean(px):.4f} ± {sd(px):.4f} | {', '.join(map(str, sorted(eps)))} | "
            f"{', '.join(f'{v:.4f}' for v in pv)} | {', '.join(f'{v:.4f}' for v in px)} |"
        )
    lines += [
        "",
        "A run is reproducible bit for bit with the same config, seed and thread count (tested; a 300-round "
        "rerun gave identical metrics); a different thread count reorders float reductions and moves the "
        "last digits, which then grow over training.",
    ]
    if {"strict", "paper"} <= set(means):
        lines += [
            "",
            f"Accuracy cost of strict mode over seeds (paper − strict): private "
            f"{means['paper'][0] - means['strict'][0]:+.4f}, proxy "
            f"{means['paper'][1] - means['strict'][1]:+.4f}.",
        ]
    return lines + [""]


def epsilon_section(summary: dict) -> list[str]:
    """ε of the main job's exact mechanism from several accountants, computed now."""
    import logging

    from dp_accounting import dp_event, rdp
    from dp_accounting.pld import pld_privacy_accountant
    from opacus.accountants import PRVAccountant, RDPAccountant

    from silofl.privacy.analysis import DEFAULT_ORDERS

    logging.getLogger("absl").setLevel(logging.ERROR)
    acc = summary["accounting"][0]
    sigma, q, steps, delta = acc["noise_multiplier"], acc["sample_rate"], acc["steps"], acc["delta"]
    event = dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma))
    rows = [("silofl (opacus.rdp, cached per-step RDP)", acc["epsilon"])]
    o = RDPAccountant()
    o.history = [(sigma, q, steps)]
    rows.append(("Opacus RDPAccountant", o.get_epsilon(delta)))
    g = rdp.RdpAccountant(orders=list(DEFAULT_ORDERS))
    g.compose(event, steps)
    rows.append(("dp-accounting RDP, same orders", g.get_epsilon(delta)))
    p = PRVAccountant()
    p.history = [(sigma, q, steps)]
    rows.append(("Opacus PRVAccountant (`--accountant prv`)", p.get_epsilon(delta)))
    pld = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    pld.compose(event, steps)
    rows.append(("dp-accounting PLD", pld.get_epsilon(delta)))
    lines = [
        f"## ε of the main job's mechanism (σ = {sigma}, q = {q}, {steps} steps, δ = {delta:g})",
        "",
        "| accountant | ε |",
        "|---|---|",
        *[f"| {n} | {e:.3f} |" for n, e in rows],
        "",
        "RDP is an upper bound; PRV and PLD are tighter numerical accountants and agree with each other. "
        "dp-accounting's RDP reports more here because its fractional-order series does not converge at the "
        "orders 1.1–1.7 that are optimal at this large ε, and it drops them; where it converges (the regimes "
        "in `tests/privacy/test_accountant.py`) the test requires agreement with Opacus within 2%.",
        "",
    ]
    return lines


def comparison_plot(runs: dict[str, Path], out: Path) -> None:
    """Private and proxy accuracy against rounds for the compared runs."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for mode, d in runs.items():
        recs = read_metrics(d)
        for key, ls in (("private_acc", "-"), ("proxy_acc", "--")):
            r, m, sd = series(recs, key)
            ax.plot(r, m, ls, label=f"{mode} {key.replace('_acc', '')}")
            ax.fill_between(r, m - sd, m + sd, alpha=0.15)
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy, mean ± std over 8 clients")
    ax.set_title("ProxyFL on Fashion-MNIST: strict vs paper privacy mode")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    """Write docs/proxyfl.md from the ProxyFL runs and benchmarks (arguments: ``--help``)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--strict", type=Path, required=True)
    ap.add_argument("--paper", type=Path, required=True)
    ap.add_argument(
        "--seeds", action="append", default=[], help="LABEL=DIR,DIR,…: runs of one variant over seeds"
    )
    ap.add_argument("--bench-step", type=Path)
    ap.add_argument("--bench-round", type=Path)
    ap.add_argument("--out", type=Path, default=Path("docs/proxyfl.md"))
    a = ap.parse_args(argv)
    runs = {"strict": a.strict, "paper": a.paper}
    img = a.out.parent / "proxyfl_strict_vs_paper.png"
    a.out.parent.mkdir(parents=True, exist_ok=True)
    comparison_plot(runs, img)
    sums = {m: json.loads((d / "summary.json").read_text()) for m, d in runs.items()}
    lines = [
        "# ProxyFL: measured results",
        "",
        f"Generated by `{' '.join(shlex.quote(x) for x in ['.venv/bin/python', *sys.argv])}` — do not edit "
        f"by hand.",
        "",
        "## Main job: 8 clients, Fashion-MNIST, paper settings",
        "",
        "1000 training images per client (p_major 0.8), LeNet5 private / MLP proxy, Poisson batches with q = "
        "250/1000, "
        "σ = C = 1, Adam (lr 1e-3, weight decay 1e-4), one epoch (4 steps) per round, exponential graph, "
        "PushSum self-weight 0, evaluated on the full 10k test set every 10 rounds. Accuracy is the last "
        "evaluation "
        "(round 300); wall time is the whole command on this 2-core machine with nothing else running.",
        "",
        *run_rows(runs),
        "",
    ]
    d_priv = sums["paper"]["final"]["private_acc"]["mean"] - sums["strict"]["final"]["private_acc"]["mean"]
    d_prox = sums["paper"]["final"]["proxy_acc"]["mean"] - sums["strict"]["final"]["proxy_acc"]["mean"]
    lines += [
        f"**Accuracy cost of strict mode** (paper − strict, mean over clients, one seed): private "
        f"{d_priv:+.4f}, "
        f"proxy {d_prox:+.4f}. Both runs spend the same DP-SGD mechanism (same σ, q, steps, so the same ε), "
        f"but only "
        "the strict run's ε is a formal guarantee (see README, *Privacy modes*).",
        "",
        f"![strict vs paper]({img.name})",
        "",
    ]
    if a.seeds:
        lines += seed_section(a.seeds)
    lines += epsilon_section(sums["strict"])
    if a.bench_step and a.bench_step.is_file():
        b = json.loads(a.bench_step.read_text())
        meta = b["meta"]
        lines += [
            "## DP step cost (`bench/dp_step.py`)",
            "",
            f"`.venv/bin/python bench/dp_step.py --json {a.bench_step}` — batch {meta['batch']}, "
            f"{meta['threads']} threads, "
            f"{meta['reps']} interleaved repetitions, medians in ms; ratio to the non-DP step measured in "
            f"the same run.",
            "",
            "| step | variant | ms | × non-DP |",
            "|---|---|---|---|",
        ]
        for step, vals in b["ms"].items():
            base = vals["non-DP"]
            for k, v in vals.items():
                lines.append(f"| {step} | {k} | {v:.2f} | {v / base:.2f} |")
        lines.append("")
    if a.bench_round and a.bench_round.is_file():
        r = json.loads(a.bench_round.read_text())
        lines += [
            "## A ProxyFL round vs the obvious Opacus implementation (`bench/proxyfl_round.py`)",
            "",
            f"`.venv/bin/python bench/proxyfl_round.py --privacy {r['privacy']} --rounds {r['rounds']} "
            f"--json {a.bench_round}` — "
            f"8 clients, {r['threads']} threads, training + exchange + one ε query per client per round, "
            f"evaluation excluded, "
            "rounds interleaved.",
            "",
            "| implementation | median s/round |",
            "|---|---|",
            f"| silofl | {r['silofl_median_s']:.3f} |",
            f"| Opacus `make_private` (hooks) | {r['opacus_median_s']:.3f} |",
            "",
            f"Speed-up: **{r['speedup']:.2f}×**. ε after {r['rounds'] + 1} rounds: silofl "
            f"{r['epsilon_silofl']:.3f}, "
            f"Opacus {r['epsilon_opacus']:.3f} (same mechanism, same accountant).",
            "",
        ]
    a.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {a.out} and {img}")


if __name__ == "__main__":
    main()
