"""Survival targets: Harrell's C-index against lifelines on data with tied times, tied scores and censoring;
the Breslow Cox loss against a hand computation and the fitted Cox model against lifelines' CoxPHFitter; the
schema's survival target."""

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from silofl.core.errors import DataError
from silofl.data.schema import Schema
from silofl.training.metrics import c_index as metrics_c_index
from silofl.training.survival import c_index, cox_loss, fit_cox


@pytest.mark.slow  # lifelines' import takes seconds
def test_c_index_equals_lifelines_with_ties_and_censoring():
    from lifelines.utils import concordance_index

    rng = np.random.default_rng(0)
    n = 300
    time = rng.integers(1, 30, n).astype(float)  # many tied times
    event = rng.random(n) < 0.6  # 40% censored
    risk = np.round(-time / 10 + rng.normal(0, 1, n), 1)  # tied scores too
    want = concordance_index(time, -risk, event)  # lifelines scores survival: higher = longer
    assert c_index(risk, time, event) == pytest.approx(want, abs=1e-12)
    assert metrics_c_index(torch.tensor(risk), torch.tensor(np.stack([time, event], 1))) == pytest.approx(
        want
    )
    assert c_index(-time, time, np.ones(n)) == pytest.approx(concordance_index(time, time, np.ones(n)))
    assert math.isnan(c_index(risk, time, np.zeros(n)))  # no events: no comparable pair


def test_breslow_cox_loss_by_hand_with_tied_times():
    risk = torch.tensor([0.5, -1.0, 2.0, 0.3, 0.0])
    time = torch.tensor([2.0, 2.0, 1.0, 3.0, 2.0])
    event = torch.tensor([1, 1, 0, 1, 0])
    e = risk.exp()
    at2 = e[[0, 1, 3, 4]].sum()  # both events at t = 2 share the risk set {t ≥ 2} (Breslow)
    at3 = e[3]
    want = -((risk[0] - at2.log()) + (risk[1] - at2.log()) + (risk[3] - at3.log())) / 3
    assert float(cox_loss(risk, time, event)) == pytest.approx(float(want), rel=1e-6)
    assert float(cox_loss(risk, time, torch.zeros(5))) == 0.0


@pytest.mark.slow  # lifelines' import takes seconds
def test_the_fitted_cox_model_equals_lifelines_coxphfitter_without_tied_times():
    from lifelines import CoxPHFitter

    rng = np.random.default_rng(1)
    n = 200
    x = rng.normal(0, 1, (n, 3))
    beta = np.array([0.8, -0.5, 0.0])
    time = rng.exponential(1.0 / np.exp(x @ beta))  # continuous: no ties, so Efron = Breslow
    event = rng.random(n) < 0.7
    model = fit_cox(torch.tensor(x), torch.tensor(time), torch.tensor(event))
    ours = model.weight.detach().numpy().reshape(-1)
    df = pd.DataFrame(x, columns=["a", "b", "c"]).assign(T=time, E=event.astype(int))
    theirs = CoxPHFitter().fit(df, "T", "E").params_.to_numpy()
    assert np.allclose(ours, theirs, atol=1e-4), (ours, theirs)


def test_a_survival_target_in_the_schema(tmp_path):
    s = Schema.from_dict(
        {"target": {"type": "survival", "time": "days", "event": "died"}, "features": {"age": "numeric"}}
    )
    assert (
        s.task == "survival"
        and s.survival == ("days", "died")
        and s.to_dict()["target"]["type"] == "survival"
    )
    df = pd.DataFrame({"age": ["50", "61"], "days": ["10", "3.5"], "died": ["1", "0"]})
    raw, y, _ = s.check(df, "f.csv")
    assert y.tolist() == [[10.0, 1.0], [3.5, 0.0]]
    with pytest.raises(DataError, match="the event column 'died' holds 'yes' in row 2"):
        s.check(df.assign(died=["1", "yes"]), "f.csv")
    with pytest.raises(DataError, match="column 'days' has -1 in row 1"):
        s.check(df.assign(days=["-1", "2"]), "f.csv")
    with pytest.raises(DataError, match="column 'died' of the schema is missing"):
        s.check(df.drop(columns="died"), "f.csv")
    with pytest.raises(DataError, match="a survival target is"):
        Schema.from_dict({"target": {"type": "survival", "time": "t"}, "features": {"age": "numeric"}})
    # a run needs public time bins for the piecewise-exponential model: never quantiles of a site's times
    from silofl.data.sites import load_site_tables

    (tmp_path / "s.json").write_text(json.dumps(s.to_dict()))
    df.to_csv(tmp_path / "a.csv", index=False)
    with pytest.raises(DataError, match="declare them in the target .bins"):
        load_site_tables(str(tmp_path / "s.json"), [str(tmp_path / "a.csv")])
    with pytest.raises(DataError, match="must be positive, finite and increasing"):
        Schema.from_dict(
            {
                "target": {"type": "survival", "time": "t", "event": "e", "bins": [2, 1]},
                "features": {"age": "numeric"},
            }
        )
    with pytest.raises(DataError, match="--time-bins: time bins must be"):
        load_site_tables(str(tmp_path / "s.json"), [str(tmp_path / "a.csv")], time_bins=[0.0, 1.0])
    binned = Schema.from_dict({**s.to_dict(), "target": {**s.to_dict()["target"], "bins": [5, 10]}})
    assert binned.survival_bins == (5.0, 10.0) and binned.to_dict()["target"]["bins"] == [5.0, 10.0]


def test_the_encoded_target_gives_the_piecewise_likelihood_of_the_raw_times():
    from silofl.training.survival import encode_target, encoded_loss, piecewise_loss, risk_score

    g = torch.Generator().manual_seed(3)
    edges = [0.5, 1.0, 2.0]
    time = torch.cat([torch.rand(40, generator=g) * 4, torch.tensor([0.5, 1.0, 2.0, 0.0])])  # edges hit too
    event = (torch.rand(44, generator=g) < 0.6).float()
    out = torch.randn(44, 1 + len(edges) + 1, generator=g, dtype=torch.float64)
    y = torch.from_numpy(encode_target(torch.stack([time, event], 1).numpy(), edges)).double()
    assert y.shape == (44, 3 + 4) and y[:, 0].allclose(time.double()) and y[:, 1].equal(event.double())
    want = piecewise_loss(out, time.double(), event, torch.tensor(edges))
    assert torch.allclose(encoded_loss(out, y), want, atol=1e-5)
    # a proportional-hazards output (the same b for every row) ranks rows by r alone
    ph = torch.cat([out[:, :1], out[:1, 1:].expand(44, -1)], 1)
    assert torch.equal(torch.argsort(risk_score(ph)), torch.argsort(out[:, 0]))


def test_the_task_registry_decides_a_survival_runs_metric():
    from silofl.core.errors import ConfigError
    from silofl.training.metrics import metric_task
    from silofl.training.tasks import check_metric, target_task

    assert metric_task("c_index") == "survival" and metric_task("accuracy") == "any"
    assert metric_task("dice") == "segmentation" and metric_task("auroc") == "classification"
    assert check_metric("survival", "accuracy", "x") == "c_index"  # the default stands for the C-index
    assert check_metric("survival", "c_index", "x") == "c_index"
    with pytest.raises(
        ConfigError, match="--metric auroc is not computed for x .a survival task.; choose c_index"
    ):
        check_metric("survival", "auroc", "x")
    with pytest.raises(ConfigError, match="--metric c_index is not computed"):
        check_metric("classification", "c_index", "x")
    assert target_task(torch.zeros(4, 6)).name == "survival"
    assert target_task(torch.zeros(4, dtype=torch.long)) is None and target_task(torch.zeros(4)) is None


@pytest.mark.slow  # 150 DP-SGD steps with per-example gradients
def test_the_piecewise_hazard_surrogate_is_per_row_and_dp_sgd_trains_it_to_rank_held_out_rows():
    from torch import nn

    from silofl.privacy import DPGradient, NoiseSource
    from silofl.privacy.sampling import poisson_batch
    from silofl.training.survival import PiecewiseHazard, piecewise_loss

    g = torch.Generator().manual_seed(0)
    n = 800
    x = torch.randn(n, 3, generator=g)
    beta = torch.tensor([1.0, -0.6, 0.0])
    t_event = torch.empty(n).exponential_(generator=g) / torch.exp(x @ beta)
    t_censor = torch.empty(n).exponential_(generator=g) * 2.0
    time, event = torch.minimum(t_event, t_censor), (t_event <= t_censor).float()
    torch.manual_seed(0)
    model = PiecewiseHazard(nn.Linear(3, 1, bias=False), [0.25, 0.5, 1.0, 2.0])

    def loss(out, t, e):
        return piecewise_loss(out, t, e, model.edges)

    # per row: a row's loss (and so its gradient) does not change when the other rows of its batch do
    a = loss(model(x[:5]), time[:5], event[:5])
    b = loss(
        model(torch.cat([x[:1], x[100:104]])),
        torch.cat([time[:1], time[100:104]]),
        event[[0, 100, 101, 102, 103]],
    )
    assert torch.allclose(a[0], b[0])
    train, test = slice(0, 600), slice(600, n)
    q, sigma = 0.1, 1.0
    dp = DPGradient(model, 1.0, sigma, q * 600, NoiseSource(1), sample_rate=q)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(150):
        idx = poisson_batch(600, q, torch.Generator().manual_seed(_))
        opt.zero_grad()
        dp.compute(x[train][idx], loss, time[train][idx], event[train][idx])
        opt.step()
    assert dp.backend_name == "vmap"  # the baseline hazards are no Linear layer: per-example gradients
    risk = model(x[test])[:, 0].detach()
    dp_c = c_index(risk, time[test], event[test])
    oracle = c_index(x[test] @ beta, time[test], event[test])
    assert dp_c > 0.6 and dp_c > oracle - 0.08, (dp_c, oracle)


def test_survival_mutual_learning_pulls_the_log_hazards_together_row_by_row():
    from silofl.training.poisson import dml_loss
    from silofl.training.survival import encode_target, encoded_loss

    g = torch.Generator().manual_seed(5)
    y = torch.from_numpy(encode_target(torch.rand(6, 2, generator=g).mul(3).round(decimals=2).numpy(), [1.0]))
    out = torch.randn(6, 3, generator=g, requires_grad=True)
    other = torch.randn(6, 3, generator=g)
    base = encoded_loss(out, y)
    assert torch.equal(dml_loss(out, y, other, 0.0), base)  # w = 0: the likelihood alone
    assert torch.allclose(dml_loss(out, y, out.detach(), 0.3), 0.7 * base)  # the same hazards: no pull
    h, h2 = out[:, :1] + out[:, 1:], other[:, :1] + other[:, 1:]
    want = 0.7 * base + 0.3 * 0.5 * (h - h2).pow(2).mean(1)
    got = dml_loss(out, y, other, 0.3)
    assert torch.allclose(got, want)
    got[2].backward()  # row 2's loss moves row 2's outputs only
    assert out.grad[[0, 1, 3, 4, 5]].abs().sum() == 0 and out.grad[2].abs().sum() > 0
