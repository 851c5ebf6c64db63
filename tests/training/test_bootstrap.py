"""The percentile bootstrap interval (silofl.training.bootstrap) against scipy.stats.bootstrap."""

import numpy as np
import pytest
import torch
from scipy import stats

from silofl.training.bootstrap import interval, metric_statistic, paired_difference
from silofl.training.metrics import auroc


def test_mean_interval_matches_scipy_percentile_bootstrap():
    x = np.random.default_rng(3).normal(1.0, 2.0, size=150)
    mine = interval(lambda idx: float(x[idx].mean()), len(x), resamples=4000, seed=1)
    ref = stats.bootstrap(
        (x,), np.mean, n_resamples=4000, method="percentile", confidence_level=0.95, random_state=2
    ).confidence_interval
    # two independent Monte Carlo runs of the same interval: their ends agree to Monte Carlo error
    assert mine["low"] == pytest.approx(ref.low, abs=0.06)
    assert mine["high"] == pytest.approx(ref.high, abs=0.06)
    assert mine["estimate"] == pytest.approx(x.mean())
    assert (mine["units"], mine["unit"], mine["level"]) == (150, "rows", 0.95)


def test_paired_auroc_gain_matches_scipy_paired_bootstrap():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, size=200)
    a = y + rng.normal(0, 0.8, size=200)  # the better model
    b = y + rng.normal(0, 1.6, size=200)

    def auc(s, lab):
        return auroc(torch.as_tensor(np.stack([-s, s], 1)), torch.as_tensor(lab))

    mine = paired_difference(
        lambda i: auc(a[i], y[i]), lambda i: auc(b[i], y[i]), len(y), resamples=3000, seed=5
    )
    ref = stats.bootstrap(
        (a, b, y),
        lambda a_, b_, y_: auc(a_, y_) - auc(b_, y_),
        paired=True,
        vectorized=False,
        n_resamples=3000,
        method="percentile",
        random_state=6,
    ).confidence_interval
    assert mine["low"] == pytest.approx(ref.low, abs=0.015)
    assert mine["high"] == pytest.approx(ref.high, abs=0.015)
    assert mine["low"] > 0  # a clearly better model: the whole interval is a gain


def test_persons_resampled_whole_equal_rows_when_each_person_has_one_row():
    x = np.random.default_rng(1).random(60)
    stat = lambda idx: float(x[idx].mean())  # noqa: E731
    by_row = interval(stat, 60, seed=9, resamples=300)
    by_person = interval(stat, 60, clusters=np.arange(60), seed=9, resamples=300)
    assert (by_row["low"], by_row["high"]) == (by_person["low"], by_person["high"])
    assert by_person["unit"] == "persons"


def test_persons_with_many_rows_widen_the_interval():
    """Rows of one person move together: resampling persons gives a wider interval than treating the rows as
    independent."""
    rng = np.random.default_rng(4)
    person = np.repeat(np.arange(40), 10)
    x = rng.normal(size=40)[person] + 0.1 * rng.normal(size=400)
    stat = lambda idx: float(x[idx].mean())  # noqa: E731
    rows = interval(stat, 400, seed=0, resamples=1000)
    persons = interval(stat, 400, clusters=person, seed=0, resamples=1000)
    assert persons["units"] == 40
    assert persons["high"] - persons["low"] > 2 * (rows["high"] - rows["low"])


def test_too_few_rows_give_a_labelled_figure_without_interval():
    out = interval(lambda idx: 1.0, 7)
    assert out["estimate"] == 1.0 and out["low"] is None and out["high"] is None
    assert "7 held-out rows, fewer than 20" in out["note"]


def test_an_undefined_figure_on_many_resamples_gives_no_interval():
    y = torch.tensor([1] + [0] * 39)  # one positive: most resamples have one class, AUROC undefined
    logits = torch.randn(40, 2)
    out = interval(metric_statistic("auroc", logits, y), 40, seed=0, resamples=200)
    assert out["low"] is None and "undefined" in out["note"]


def test_metric_statistic_is_the_runs_figure():
    from silofl.training.evaluation import metrics_of

    logits, y = torch.randn(50, 3), torch.randint(0, 3, (50,))
    run = metrics_of(logits, y)
    for metric, key in [("accuracy", "acc"), ("auroc", "auroc"), ("balanced_accuracy", "balanced_accuracy")]:
        assert metric_statistic(metric, logits, y)(np.arange(50)) == pytest.approx(run[key])
    for metric in ("f1", "ece"):
        assert metric_statistic(metric, logits, y)(np.arange(50)) == pytest.approx(run[metric])
