"""The classification metrics against scikit-learn (the independent reference) and a hand-computed ECE."""

import math
import warnings

import numpy as np
import pytest
import torch
from sklearn.metrics import balanced_accuracy_score, f1_score, roc_auc_score

from silofl.training.metrics import (
    acc_field_of,
    auroc,
    balanced_accuracy,
    classification_metrics,
    ece,
    f1_macro,
    metric_field,
)


def _probs(rng, n, c, decimals=None):
    p = rng.dirichlet(np.ones(c), size=n)
    if decimals is not None:  # coarse probabilities: many ties within a class's column
        p = np.round(p, decimals)
    return p


@pytest.mark.parametrize("seed", range(4))
def test_multiclass_auroc_equals_sklearn_ovr_macro(seed):
    rng = np.random.default_rng(seed)
    p = _probs(rng, 300, 5)
    y = rng.integers(0, 5, 300)
    p[np.arange(300), y] += rng.random(300) * (seed / 2)  # from chance (seed 0) to well separated
    p /= p.sum(1, keepdims=True)
    assert auroc(p, y) == pytest.approx(roc_auc_score(y, p, multi_class="ovr", average="macro"), abs=1e-12)


def test_auroc_with_ties_equals_sklearn():
    rng = np.random.default_rng(7)
    p = _probs(rng, 400, 4, decimals=1)  # values in {0, .1, …, 1}: heavy ties
    y = rng.integers(0, 4, 400)
    ref = np.mean([roc_auc_score(y == c, p[:, c]) for c in range(4)])  # ovr macro on the unnormalised columns
    assert auroc(p, y) == pytest.approx(ref, abs=1e-12)
    pb = np.round(rng.random((200, 2)), 1)  # binary, ties
    yb = rng.integers(0, 2, 200)
    assert auroc(pb, yb) == pytest.approx(roc_auc_score(yb, pb[:, 1]), abs=1e-12)
    assert auroc(np.full((10, 3), 1 / 3), np.arange(10) % 3) == 0.5  # all tied: chance


def test_binary_auroc_equals_sklearn_and_perfect_and_reversed():
    rng = np.random.default_rng(3)
    s = rng.random(250)
    y = (rng.random(250) < s).astype(int)
    p = np.stack([1 - s, s], 1)
    assert auroc(p, y) == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    assert auroc(np.stack([1 - y, y], 1).astype(float), y) == 1.0
    assert auroc(np.stack([y, 1 - y], 1).astype(float), y) == 0.0


def test_absent_class_auroc_is_macro_over_present_classes():
    rng = np.random.default_rng(11)
    p = _probs(rng, 200, 4)
    y = rng.choice([0, 1, 3], 200)  # class 2 never occurs
    # scikit-learn: the macro average of the present classes' one-vs-rest indicator columns
    onehot = np.eye(4)[y]
    present = [0, 1, 3]
    ref = roc_auc_score(onehot[:, present], p[:, present], average="macro")
    assert auroc(p, y) == pytest.approx(ref, abs=1e-12)
    # with the absent class among its labels scikit-learn has no value (NaN); over present classes there is
    # one
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert math.isnan(roc_auc_score(y, p, multi_class="ovr", average="macro", labels=[0, 1, 2, 3]))
    # one class present: undefined, NaN (binary and multi-class)
    assert math.isnan(auroc(p, np.zeros(200, int)))
    assert math.isnan(auroc(p[:, :2] / p[:, :2].sum(1, keepdims=True), np.ones(200, int)))


@pytest.mark.parametrize("seed", range(3))
def test_balanced_accuracy_and_f1_equal_sklearn(seed):
    rng = np.random.default_rng(seed)
    y = rng.choice(6, 500, p=[0.5, 0.2, 0.1, 0.1, 0.1, 0.0])  # imbalanced, class 5 absent from the labels
    pred = np.where(rng.random(500) < 0.6, y, rng.integers(0, 6, 500))  # …but predicted now and then
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sklearn warns about the predicted-but-absent class
        ref_bacc = balanced_accuracy_score(y, pred)
    assert balanced_accuracy(y, pred, 6) == pytest.approx(ref_bacc, abs=1e-12)
    assert f1_macro(y, pred, 6) == pytest.approx(f1_score(y, pred, average="macro"), abs=1e-12)
    # a class absent from both labels and predictions is not in the macro mean (sklearn's default labels)
    y2, p2 = np.array([0, 0, 1, 1, 3]), np.array([0, 1, 1, 1, 0])
    assert f1_macro(y2, p2, 4) == pytest.approx(f1_score(y2, p2, average="macro"), abs=1e-12)
    assert balanced_accuracy(y2, p2, 4) == pytest.approx(balanced_accuracy_score(y2, p2), abs=1e-12)


def test_ece_hand_computed():
    # 15 bins of width 1/15 ≈ 0.0667. Confidences 0.95, 0.95 (bin 14), 0.6, 0.62 (bin 9: (0.6, 0.667]; 0.6 =
    # 9/15 is the upper edge of bin 8), 0.4 (bin 5)
    p = np.array([[0.95, 0.05, 0.0], [0.05, 0.95, 0.0], [0.6, 0.4, 0.0], [0.38, 0.62, 0.0], [0.4, 0.3, 0.3]])
    y = np.array([0, 0, 0, 0, 2])
    # bin 14: correct {1, 0}, conf {0.95, 0.95}: |0.5 − 0.95| · 2/5 = 0.18
    # bin 8 (0.6): correct 1, |1 − 0.6| · 1/5 = 0.08; bin 9 (0.62): correct 0, |0 − 0.62| · 1/5 = 0.124
    # bin 5 (0.4): correct 0 (predicts class 0, label 2), |0 − 0.4| · 1/5 = 0.08
    assert ece(p, y) == pytest.approx(0.18 + 0.08 + 0.124 + 0.08, abs=1e-12)
    perfect = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert ece(perfect, np.array([0, 1])) == 0.0
    assert ece(perfect, np.array([1, 0])) == 1.0


def test_classification_metrics_from_logits():
    torch.manual_seed(0)
    logits = torch.randn(300, 3) * 3
    y = torch.randint(0, 3, (300,))
    m = classification_metrics(logits, y)
    p = logits.double().softmax(1).numpy()
    yn, pred = y.numpy(), p.argmax(1)
    assert m["acc"] == float((pred == yn).mean())
    assert m["auroc"] == pytest.approx(roc_auc_score(yn, p, multi_class="ovr", average="macro"), abs=1e-9)
    assert m["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(yn, pred), abs=1e-12)
    assert m["f1"] == pytest.approx(f1_score(yn, pred, average="macro"), abs=1e-12)
    assert m["ece"] == pytest.approx(ece(p, yn), abs=1e-12)
    empty = classification_metrics(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long))
    assert empty["acc"] == 0.0 and all(
        math.isnan(empty[k]) for k in ("auroc", "balanced_accuracy", "f1", "ece")
    )


def test_metric_field_names():
    assert metric_field("private_acc", "auroc") == "private_auroc"
    assert metric_field("global_acc", "accuracy") == "global_acc"
    assert metric_field("proxy_acc", "balanced_accuracy") == "proxy_balanced_accuracy"
    assert acc_field_of("combined_ece") == "combined_acc"
    assert acc_field_of("proxy_balanced_accuracy") == "proxy_acc"
    assert acc_field_of("private_acc") is None and acc_field_of("mean_grad_norm") is None
    with pytest.raises(ValueError):
        metric_field("private_acc", "logloss")
