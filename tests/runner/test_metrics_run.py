"""Runs carry every classification metric (silofl.training.metrics): the README's `--metric auroc` command as
written, and a run whose sites keep non-private figures — a model's AUROC, F1 … stay with its accuracy."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from sklearn.metrics import balanced_accuracy_score, f1_score, roc_auc_score

from silofl.training.metrics import METRICS
from tests import readme
from tests.helpers import silofl_here

SECTION = readme.METRIC  # (file, title): docs/howto/run.md since issue 27
EXTRA = ("auroc", "balanced_accuracy", "f1", "ece")


def _records(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_readme_metric_command_as_written(tmp_path):
    """`--metric auroc` makes AUROC the headline of the summary and of --vs-alone; every metric is written."""
    (cmd,) = readme.commands(SECTION)
    args = readme.argv(cmd)
    env = {**os.environ, "SILOFL_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    r = silofl_here(args, tmp_path, env)  # as written, in this process (a process costs ~2 s of imports)
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / args[args.index("--out") + 1]
    s = json.loads((out / "summary.json").read_text())
    assert s["metric"] == "auroc" and s["headline"] == "private_auroc"
    assert set(s["metrics"]["computed"]) == set(METRICS) - {
        "dice",
        "iou",
        "c_index",
    }  # segmentation, survival
    for role in ("private", "proxy"):
        for m in ("acc", *EXTRA):
            v = s["final"][f"{role}_{m}"]["mean"]
            assert v is not None and 0.0 <= v <= 1.0, (role, m, v)
            assert all(c[f"{role}_{m}"] is not None for c in s["final"]["per_client"])
    recs = _records(out / "metrics.jsonl")
    assert recs and all(f"{role}_{m}" in rec for rec in recs for role in ("private", "proxy") for m in EXTRA)
    va = s["vs_alone"]
    assert (
        va["metric"] == "auroc"
        and "alone_private_auroc" in va
        and set(va["this_run"]) == {"private_auroc", "proxy_auroc"}
    )
    alone = json.loads((out / "alone" / "summary.json").read_text())
    assert va["alone_private_auroc"] == alone["final"]["private_auroc"]["mean"]
    assert va["difference"]["private_auroc"] == pytest.approx(
        s["final"]["private_auroc"]["mean"] - alone["final"]["private_auroc"]["mean"]
    )
    assert "judged by private auroc" in r.stdout


def _breast_cancer_sites(d) -> list:
    """scikit-learn's breast cancer rows split over three sites' CSVs, and the collaboration's schema
    (public bounds)."""
    import csv

    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    names = [n.replace(" ", "_") for n in data.feature_names]
    paths = []
    for k, rows in enumerate(np.array_split(np.random.default_rng(0).permutation(len(data.data)), 3)):
        paths.append(d / f"site{k}.csv")
        with open(paths[-1], "w", newline="") as f:
            w = csv.writer(f)
            w.writerow([*names, "diagnosis"])
            for r in rows:
                w.writerow([*data.data[r], ["malignant", "benign"][data.target[r]]])
    feats = {
        n: {"type": "numeric", "bounds": [0.0, float(np.ceil(data.data[:, i].max() * 1.5))]}
        for i, n in enumerate(names)
    }
    (d / "schema.yaml").write_text(
        json.dumps({"target": {"name": "diagnosis", "levels": ["benign", "malignant"]}, "features": feats})
    )
    return paths


@pytest.mark.slow
def test_metrics_are_kept_with_their_accuracy_and_equal_sklearn_on_the_saved_model(tmp_path):
    """Sites that keep non-private figures keep the private and combined models' metrics too (only the DP
    proxy's are reported); the reported proxy figures equal scikit-learn's on the saved proxy model and the
    test set."""
    from silofl.models import load_model
    from silofl.runner.config import RunConfig
    from silofl.runner.data import prepare_data
    from silofl.runner.loop import run

    sites = _breast_cancer_sites(tmp_path)  # a binary task: AUROC of class 1
    cfg = RunConfig.from_dict(
        dict(
            method="proxyfl",
            dataset="table",
            site_data=[str(p) for p in sites],
            schema=str(tmp_path / "schema.yaml"),
            partition="site",
            clients=3,
            rounds=4,
            delta=1e-3,
            private_model="tabmlp",
            proxy_model="logreg",
            seed=3,
            report_nonprivate=False,
            combine="weights",
            threads=1,
            out=str(tmp_path / "run"),
        )
    )
    s = run(cfg, progress=False)
    assert s["metric"] == "accuracy" and s["headline"] == "private_acc"
    recs = _records(tmp_path / "run" / "metrics.jsonl")
    for rec in recs:
        assert all(f"proxy_{m}" in rec for m in ("acc", *EXTRA))  # the DP proxy's: released
        assert not any(k.startswith(("private_", "combined_")) for k in rec), rec  # kept at the site
    kept = _records(tmp_path / "run" / "sites" / "client0" / "metrics.jsonl")
    assert kept and all(
        f"{role}_{m}" in kept[-1] for role in ("private", "combined") for m in ("acc", *EXTRA)
    )
    # the reported figures of client 0's proxy against scikit-learn on the saved model
    rcfg, split = prepare_data(cfg.resolve(), torch.device("cpu"))
    x, y = split.external[0] if split.external else split.test  # the shared test rows as client 0 sees them
    model, _ = load_model(tmp_path / "run" / "models" / "client0_proxy")
    with torch.no_grad():
        p = model.eval()(x).double().softmax(1).numpy()
    yn, pred = y.numpy(), p.argmax(1)
    last = [r for r in recs if r["client"] == 0][-1]
    assert last["proxy_acc"] == pytest.approx(float((pred == yn).mean()), abs=1e-12)
    assert last["proxy_auroc"] == pytest.approx(roc_auc_score(yn, p[:, 1]), abs=1e-6)
    assert 0.5 < last["proxy_auroc"] <= 1.0
    assert last["proxy_balanced_accuracy"] == pytest.approx(balanced_accuracy_score(yn, pred), abs=1e-12)
    assert last["proxy_f1"] == pytest.approx(f1_score(yn, pred, average="macro"), abs=1e-12)
    conf, correct = p.max(1), (pred == yn)
    b = np.clip(np.ceil(conf * 15).astype(int) - 1, 0, 14)  # (k/15, (k+1)/15]
    ece = sum(abs(correct[b == k].sum() - conf[b == k].sum()) for k in range(15)) / len(yn)
    assert last["proxy_ece"] == pytest.approx(ece, abs=1e-6)
    # `silofl evaluate` recomputes them from the saved models; the model card carries them
    from silofl.experiments.evaluate import evaluate_run
    from silofl.inference.export import export

    again = {r["model"]: r["metrics"] for r in evaluate_run(tmp_path / "run")}
    assert again["client0_proxy"]["auroc"] == pytest.approx(last["proxy_auroc"], abs=1e-12)
    card = export(tmp_path / "run", 0, tmp_path / "card", model="shared")
    assert card["evaluation"]["metrics_external"] == {
        "accuracy": last["proxy_acc"],
        **{m: last[f"proxy_{m}"] for m in EXTRA},
    }
    assert "AUROC" in (tmp_path / "card" / "model_card.md").read_text()
