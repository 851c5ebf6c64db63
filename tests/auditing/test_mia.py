"""Membership-inference metrics and attacks (silofl.auditing.mia) against scikit-learn and brute force."""

import numpy as np
import pytest
from scipy import special
from sklearn import metrics as skm

from silofl.auditing import mia


def test_metrics_equal_sklearn_with_ties():
    rng = np.random.default_rng(1)
    for _ in range(50):
        n = int(rng.integers(5, 800))
        y = rng.random(n) < rng.uniform(0.1, 0.9)
        if y.all() or (~y).all():
            continue
        s = np.round(rng.standard_normal(n) + 0.7 * y, int(rng.integers(0, 3)))
        assert mia.auc(s, y) == pytest.approx(skm.roc_auc_score(y, s), abs=1e-12)
        f1, t1, _ = mia.roc_curve(s, y)
        f2, t2, _ = skm.roc_curve(y, s, drop_intermediate=False)
        np.testing.assert_allclose(f1, f2)
        np.testing.assert_allclose(t1, t2)
        for f in (1e-3, 1e-2, 0.1):
            assert mia.tpr_at_fpr(s, y, f) == pytest.approx(t2[f2 <= f].max())


def test_logit_confidence_is_stable():
    rng = np.random.default_rng(2)
    z = rng.standard_normal((200, 10)) * 3
    y = rng.integers(0, 10, 200)
    np.testing.assert_allclose(
        mia.logit_confidence(z, y), special.logit(mia.true_label_prob(z, y)), atol=1e-9
    )
    big = np.zeros((1, 10))
    big[0, 3] = 60.0
    assert mia.logit_confidence(big, np.array([3]))[0] == pytest.approx(60 - np.log(9), rel=1e-9)


def test_rmia_fast_path_equals_pairwise_formula():
    rng = np.random.default_rng(3)
    px, pz = rng.random(50), rng.random(70)
    rx, rz = rng.random((4, 50)), rng.random((4, 70))
    a = 0.3
    prx = 0.5 * ((1 + a) * rx.mean(0) + (1 - a))
    prz = 0.5 * ((1 + a) * rz.mean(0) + (1 - a))
    brute = np.array([np.mean((px[i] / prx[i]) / (pz / prz) >= 1.0) for i in range(50)])
    np.testing.assert_allclose(mia.rmia(px, rx, pz, rz, offline_a=a), brute)


def test_calibrated_attacks_beat_loss_when_difficulty_varies():
    """Examples differ in how hard they are; membership adds a small gain: reference models remove the
    difficulty, so LiRA beats the plain loss (the reason to calibrate)."""
    rng = np.random.default_rng(4)
    n, k = 2000, 8
    base = rng.normal(0, 3, n)
    member = rng.random(n) < 0.5
    target = base + 1.0 * member + rng.normal(0, 0.3, n)
    refs = base + rng.normal(0, 0.3, (k, n))
    assert mia.auc(mia.lira_offline(target, refs), member) > mia.auc(target, member) + 0.2
