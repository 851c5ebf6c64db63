"""Every method's printed ε next to an independent recomputation with Google's dp-accounting.

One short run per registered method under the default settings (secret randomness: no seed), then, for every
accountant in its ``summary.json``, the (σ, q, steps) history it was fed is composed again with
``dp_accounting.rdp.RdpAccountant`` (Poisson-sampled Gaussian events) and with Opacus' RDP analysis, both on
integer Rényi orders, and set beside the ε silofl printed (Opacus' accountant on its default orders,
fractional
ones included). On one grid the two libraries agree to rounding; the printed ε may only be lower than them
(more
orders, each a valid bound). ``python -m studies.epsilon_check --out DIR`` prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

# integer orders: both libraries compute them exactly (dp-accounting's series for fractional orders may not
# converge at small σ, and it then drops the order with a warning, so a fractional grid is not one grid)
ORDERS = list(range(2, 64)) + [128, 256, 512, 1024]


def dp_accounting_epsilon(history: list, delta: float) -> float:
    """ε at δ of composed Poisson-sampled Gaussian mechanisms [(σ, q, steps), …], by dp-accounting's RDP
    accountant."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    acc = RdpAccountant(ORDERS)
    for sigma, q, steps in history:
        acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), int(steps))
    return float(acc.get_epsilon(delta))


VARIANTS = {
    "dp-fedavg (adaptive v, adaptive clip, client rate 0.75)": (
        "dp-fedavg",
        {"intermediaries": "adaptive", "adaptive_clip": True, "client_rate": 0.75},
    ),
    "dp-fedavg (sub-client unit, adaptive v, adaptive clip)": (
        "dp-fedavg",
        {"intermediaries": "adaptive", "adaptive_clip": True, "privacy_unit": "subclient"},
    ),
}


def run_method(method: str, out: Path, extra: dict | None = None, name: str | None = None) -> dict:
    """One short run of ``method`` on digits with the default privacy settings and secret randomness."""
    from silofl.api import RunConfig, run

    cfg = RunConfig.from_dict(
        {
            "method": method,
            "dataset": "digits",
            "clients": 4,
            "rounds": 3,
            "partition": "iid",
            "samples_per_client": 160,
            "batch_size": 16,
            "delta": 1e-3,
            "proxy_model": "mlp256",
            "private_model": "mlp",
            "test_limit": 100,
            "out": str(out / (name or method)),
            **(extra or {}),
        },
        strict=False,
    )
    return run(cfg, quiet=True).summary


def opacus_epsilon(history: list, delta: float) -> float:
    """ε at δ by Opacus' RDP analysis on the same orders as :func:`dp_accounting_epsilon` (so the two
    libraries are compared on one grid; the printed ε uses Opacus' default orders, fractional ones from 1.1
    included)."""
    from opacus.accountants.analysis import rdp

    total = sum(
        rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=int(n), orders=ORDERS) for sigma, q, n in history
    )
    return float(rdp.get_privacy_spent(orders=ORDERS, rdp=total, delta=delta)[0])


def collapse(table: list[dict]) -> list[dict]:
    """Rows that differ only in which site they are merged into one (``who`` counts the sites)."""
    out: list[dict] = []
    seen: dict[tuple, dict] = {}
    for r in table:
        key = (r["method"], r["unit"], r["steps"], r["printed"], r["recomputed"])
        if key in seen:
            seen[key]["count"] += 1
        else:
            seen[key] = {**r, "count": 1}
            out.append(seen[key])
    for r in out:
        if r["count"] > 1:
            r["who"] = f"{r['count']} " + ("sites" if r["who"].startswith("site") else "hospitals (server)")
    return out


def rows(method: str, summary: dict) -> list[dict]:
    """(what, printed ε, recomputed ε) of every accountant the run reported."""
    out = []
    for i, acc in enumerate(summary.get("accounting") or []):
        if not acc or acc.get("epsilon") is None:
            continue
        unit = acc.get("unit", "example")
        who = f"site {i}" if unit == "example" else "server"
        out.append(
            {
                "method": method,
                "who": who,
                "unit": unit,
                "delta": acc["delta"],
                "steps": acc["steps"],
                "printed": acc["epsilon"],
                "recomputed": dp_accounting_epsilon(acc["history"], acc["delta"]),
                "opacus_same_grid": opacus_epsilon(acc["history"], acc["delta"]),
                "history": acc["history"],
            }
        )
        for other in ("hospital", "subclient"):
            if f"epsilon_{other}" in acc and other != unit:
                h = acc[f"history_{other}"]
                out.append(
                    {
                        "method": method,
                        "who": who,
                        "unit": other,
                        "delta": acc["delta"],
                        "steps": acc["steps"],
                        "printed": acc[f"epsilon_{other}"],
                        "recomputed": dp_accounting_epsilon(h, acc["delta"]),
                        "opacus_same_grid": opacus_epsilon(h, acc["delta"]),
                        "history": h,
                    }
                )
    return out


def main(argv: list[str] | None = None) -> None:
    """Run every method, print the table (and write it to OUT/epsilon_check.md with the raw rows as JSON)."""
    from silofl.fl.registry import methods

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--out", default=None, help="Folder for the runs and the table (default: a temporary folder)."
    )
    ap.add_argument(
        "--methods", default=None, help="Comma-separated methods (default: every registered one)."
    )
    args = ap.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="silofl-eps-"))
    out.mkdir(parents=True, exist_ok=True)
    table = []
    todo = [(m, m, None) for m in (args.methods.split(",") if args.methods else methods())]
    todo += [(name, m, extra) for name, (m, extra) in VARIANTS.items() if m in {t[1] for t in todo}]
    for label, m, extra in todo:
        s = run_method(
            m, out, extra, name=m if extra is None else f"{m}-variant{list(VARIANTS).index(label)}"
        )
        r = rows(label, s)
        if not r:
            table.append(
                {
                    "method": m,
                    "who": "—",
                    "unit": "—",
                    "delta": None,
                    "steps": None,
                    "printed": None,
                    "recomputed": None,
                    "randomness": s["randomness"]["source"] if "randomness" in s else "",
                }
            )
        table += r
    lines = [
        "| method | accountant | unit | δ | steps | printed ε (Opacus RDP, its orders) | Opacus, integer "
        "orders | "
        "dp-accounting RDP, integer orders | printed / dp-accounting |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in collapse(table):
        if r["printed"] is None:
            lines.append(f"| {r['method']} | — | — | — | — | no DP | — | — | — |")
            continue
        lines.append(
            f"| {r['method']} | {r['who']} | {r['unit']} | {r['delta']:g} | {r['steps']} | "
            f"{r['printed']:.4f} | "
            f"{r['opacus_same_grid']:.4f} | {r['recomputed']:.4f} | {r['printed'] / r['recomputed']:.4f} |"
        )
    lines += [
        "",
        "On one order grid (integer orders) the two libraries agree; the printed ε is lower than that "
        "recomputation because Opacus' default orders include fractional ones down to 1.1 (each order gives "
        "a "
        "valid bound; the accountant reports the smallest).",
    ]
    text = "\n".join(lines)
    print(text)
    (out / "epsilon_check.md").write_text(text + "\n")
    (out / "epsilon_check.json").write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
