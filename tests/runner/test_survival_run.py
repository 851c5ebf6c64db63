"""A survival target in `silofl run` (silofl.training.survival, silofl.training.tasks): generated multi-site
tables with a schema `target: {type: survival, time, event, bins}`; the piecewise-exponential model trained
with DP-SGD by two methods, the C-index as the headline everywhere (metrics.jsonl, summary.json, --vs-alone,
compare, predict, the model card), checked against lifelines; bad input refused with one line, exit 2,
nothing written."""

import csv
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from silofl.cli.main import app
from silofl.training.metrics import c_index
from tests.helpers import write_survival_sites

runner = CliRunner()


def _args(schema, sites, out, *extra):
    return [
        "run",
        "--dataset",
        "table",
        "--schema",
        schema,
        "--site-data",
        ",".join(sites),
        "--proxy-model",
        "logreg",
        "--lr",
        "0.05",
        "--batch-size",
        "40",
        "--rounds",
        "6",
        "--seed",
        "1",
        "--out",
        str(out),
        *extra,
    ]


@pytest.mark.slow  # three DP runs, going alone, predict, export, evaluate, compare on 3 × 200 rows: ~5 s
def test_fedavg_cwt_and_proxyfl_train_a_survival_target_with_dp_and_report_the_c_index(tmp_path):
    from lifelines.utils import concordance_index

    schema, sites, _ = write_survival_sites(tmp_path / "data", sites=3, rows=200)
    for method in ("fedavg", "cwt", "proxyfl"):
        out = tmp_path / method
        extra = {"fedavg": ("--vs-alone",), "proxyfl": ("--private-model", "logreg")}.get(method, ())
        r = runner.invoke(app, _args(schema, sites, out, "--method", method, *extra))
        assert r.exit_code == 0, r.output
        head = "private_c_index" if method == "proxyfl" else "global_c_index"
        assert f"judged by {head.replace('_', ' ')} (--metric c_index)" in r.output
        s = json.loads((out / "summary.json").read_text())
        assert s["metric"] == "c_index" and s["headline"] == head
        assert s["metrics"]["computed"] == ["c_index"] and s["privacy"]["mode"] == "strict"
        assert all(v["mean"] is None for k, v in s["final"].items() if k.endswith("_acc"))  # not defined
        assert s["final"][head]["mean"] > 0.65, s["final"][head]
        assert all(a["epsilon"] > 0 for a in s["accounting"])
        recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert recs and all(rec[head] is not None for rec in recs)
    vs = json.loads((tmp_path / "fedavg" / "summary.json").read_text())["vs_alone"]
    assert vs["metric"] == "c_index" and vs["alone_private_c_index"] > 0.65
    # predict: a risk score per row, its C-index the one lifelines computes from the same rows
    pred = tmp_path / "pred.csv"
    r = runner.invoke(
        app,
        [
            "predict",
            str(tmp_path / "fedavg"),
            "--client",
            "1",
            "--model",
            "shared",
            "--data",
            sites[1],
            "--out",
            str(pred),
        ],
    )
    assert r.exit_code == 0 and "C-index" in r.output, r.output
    rows = list(csv.DictReader(pred.open()))
    assert len(rows) == 200 and list(rows[0]) == ["id", "risk", "time", "event"]
    risk = np.array([float(x["risk"]) for x in rows])
    t, e = np.array([float(x["time"]) for x in rows]), np.array([int(x["event"]) for x in rows])
    ours = c_index(risk, np.c_[t, e])  # the C-index predict printed (and evaluation computes)
    assert f"C-index {ours:.4f}" in " ".join(r.output.split())
    assert ours == pytest.approx(concordance_index(t, -risk, e), abs=1e-6)  # lifelines: higher = longer
    # the model card carries the C-index of the run's final evaluation
    r = runner.invoke(
        app,
        [
            "export",
            str(tmp_path / "cwt"),
            "--client",
            "0",
            "--model",
            "shared",
            "--out",
            str(tmp_path / "exp"),
        ],
    )
    assert r.exit_code == 0, r.output
    card = json.loads((tmp_path / "exp" / "model_card.json").read_text())
    assert card["evaluation"]["headline_metric"] == "c_index"
    assert card["evaluation"]["metrics_external"]["c_index"] > 0.65
    assert "C-index" in (tmp_path / "exp" / "model_card.md").read_text()
    # silofl evaluate reloads the saved models and finds the C-index the run recorded
    r = runner.invoke(app, ["evaluate", str(tmp_path / "fedavg")])
    assert r.exit_code == 0 and "test C-index" in r.output, r.output
    for row in json.loads((tmp_path / "fedavg" / "evaluation.json").read_text()):
        assert row["metrics"]["c_index"] == pytest.approx(row["recorded"], abs=1e-9)
    # silofl compare judges the runs by the C-index (the survival target's default headline)
    cmp = tmp_path / "cmp"
    args = _args(schema, sites, cmp, "--methods", "cwt", "--seeds", "0")[1:]
    args = [a for a in args if a not in ("--seed", "1")] + ["--quiet"]
    r = runner.invoke(app, ["compare", *args])
    assert r.exit_code == 0, r.output
    row = json.loads((cmp / "results.json").read_text())["rows"][0]
    assert row["headline"] == "global_c_index" and "global C-index" in (cmp / "report.md").read_text()


@pytest.mark.slow  # CLI start-ups; every refusal comes before anything is written
def test_bad_survival_input_is_refused_with_one_line_and_nothing_written(tmp_path):
    schema, sites, _ = write_survival_sites(tmp_path / "data", sites=2, rows=60)
    neg = tmp_path / "neg.csv"
    neg.write_text(open(sites[1]).read().replace("\n0.", "\n-0.", 1).replace(",0.", ",-0.", 3))
    text = open(sites[1]).read().splitlines()
    events = tmp_path / "events.csv"
    events.write_text("\n".join([text[0], *(line[:-1] + "2" for line in text[1:])]) + "\n")
    cases = [
        (
            (sites, "--metric", "auroc", "--method", "fedavg"),
            "--metric auroc is not computed for the survival",
        ),
        ((sites, "--method", "ditto"), "ditto does not train a survival target"),
        (([sites[0], str(neg)], "--method", "fedavg"), "outside its declared bounds [0, inf]"),
        (([sites[0], str(events)], "--method", "fedavg"), "an event is 1 (it happened) or 0 (censored)"),
        ((sites, "--method", "fedavg", "--time-bins", "2,1"), "time bins must be positive, finite and"),
    ]
    for i, ((paths, *extra), message) in enumerate(cases):
        out = tmp_path / f"bad{i}"
        r = runner.invoke(app, _args(schema, paths, out, *extra))
        assert r.exit_code == 2 and message in " ".join(r.output.split()), r.output
        assert "Traceback" not in r.output and not out.exists()
    # --metric c_index on a classification table
    from tests.data.test_person_tables import person_frame
    from tests.data.test_tables import write_csv, write_schema

    cls = [str(write_csv(tmp_path, person_frame(20, s), f"c{s}.csv")) for s in (0, 1)]
    out = tmp_path / "cls"
    r = runner.invoke(
        app, _args(str(write_schema(tmp_path)), cls, out, "--method", "fedavg", "--metric", "c_index")
    )
    assert r.exit_code == 2 and "--metric c_index scores survival runs" in " ".join(r.output.split()), (
        r.output
    )
    assert not out.exists()


@pytest.mark.slow  # one DP run
def test_person_level_dp_on_a_survival_table(tmp_path):
    schema, sites, _ = write_survival_sites(tmp_path / "data", sites=2, rows=120, persons=True)
    out = tmp_path / "person"
    r = runner.invoke(app, _args(schema, sites, out, "--method", "fedavg", "--id-column", "pid"))
    assert r.exit_code == 0, r.output
    s = json.loads((out / "summary.json").read_text())
    assert "person (column pid)" in s["privacy"]["unit"] and s["metric"] == "c_index"
    assert all(a["persons"] == 48 for a in s["accounting"])  # 60 persons a site, 12 held out whole
    assert s["final"]["global_c_index"]["mean"] is not None


@pytest.mark.slow  # lifelines' import and fit
def test_a_fitted_piecewise_model_ranks_like_lifelines_coxphfitter():
    import pandas as pd
    import torch
    from lifelines import CoxPHFitter
    from torch import nn

    from silofl.training.survival import PiecewiseHazard, encode_target, encoded_loss, risk_score

    rng = np.random.default_rng(0)
    n = 1500
    x = rng.normal(size=(n, 3))
    t_event = rng.exponential(1.0 / np.exp(x @ np.array([0.8, -0.5, 0.3])))
    t_cens = rng.uniform(0, 4, n)
    time, event = np.minimum(t_event, t_cens), (t_event <= t_cens).astype(int)
    edges = [0.1, 0.25, 0.5, 1.0, 2.0]
    y = torch.from_numpy(encode_target(np.c_[time, event], edges)).double()
    xt = torch.from_numpy(x)
    torch.manual_seed(0)
    model = PiecewiseHazard(nn.Linear(3, 1, bias=False), edges).double()
    opt = torch.optim.LBFGS(model.parameters(), max_iter=300, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = encoded_loss(model(xt), y).mean()
        loss.backward()
        return loss

    opt.step(closure)
    cox = CoxPHFitter().fit(pd.DataFrame(x, columns=["a", "b", "c"]).assign(T=time, E=event), "T", "E")
    ours = model.risk.weight.detach().numpy().reshape(-1)
    assert np.allclose(ours, cox.params_.to_numpy(), atol=0.05), (ours, cox.params_.to_numpy())
    r_ours = risk_score(model(xt)).detach().numpy()
    r_cox = np.log(cox.predict_partial_hazard(pd.DataFrame(x, columns=["a", "b", "c"])).to_numpy())
    rank = lambda v: np.argsort(np.argsort(v))  # noqa: E731
    assert np.corrcoef(rank(r_ours), rank(r_cox))[0, 1] > 0.999


def test_a_survival_schema_makes_the_c_index_the_headline_of_run_compare_and_tune(tmp_path):
    from silofl.experiments.tune import _run_metric
    from silofl.runner.config import RunConfig

    schema, sites, _ = write_survival_sites(tmp_path, sites=2, rows=20)
    cfg = RunConfig.from_dict(
        {
            "method": "fedavg",
            "dataset": "table",
            "schema": schema,
            "site_data": sites,
            "clients": 2,
            "partition": "site",
        }
    )
    assert cfg.data_task() == "survival" and _run_metric(cfg) == "c_index"  # tune selects on it
    assert cfg.resolve().metric == "c_index"  # accuracy, the default, stands for the C-index
