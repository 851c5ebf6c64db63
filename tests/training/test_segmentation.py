"""Segmentation metrics and loss (silofl.training.segmentation) against hand computations and scikit-learn."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import f1_score, jaccard_score

from silofl.training.evaluation import all_scores, scores
from silofl.training.segmentation import (
    dice_iou,
    segmentation_dml_loss,
    segmentation_loss,
    segmentation_metrics,
    soft_dice_loss,
)


def _logits_for(pred: torch.Tensor, classes: int = 2) -> torch.Tensor:
    """Logits whose arg-max is ``pred`` (n, H, W)."""
    return F.one_hot(pred.long(), classes).permute(0, 3, 1, 2).float() * 4.0


def test_dice_and_iou_by_hand():
    # 4×4 image: mask covers 4 pixels, prediction 6 pixels, 3 of them inside the mask
    mask = torch.zeros(1, 4, 4, dtype=torch.long)
    mask[0, 0, :4] = 1
    pred = torch.zeros(1, 4, 4, dtype=torch.long)
    pred[0, 0, 1:4] = 1
    pred[0, 1, 0:3] = 1
    m = segmentation_metrics(_logits_for(pred), mask)
    # |P∩G| = 3, |P| = 6, |G| = 4: Dice = 6/10, IoU = 3/7; pixels right: 16 − (1 missed + 3 extra) = 12
    assert m["dice"] == pytest.approx(0.6)
    assert m["iou"] == pytest.approx(3 / 7)
    assert m["acc"] == pytest.approx(12 / 16)
    assert dice_iou(pred[0], mask[0]) == pytest.approx((0.6, 3 / 7))


def test_empty_conventions():
    empty = torch.zeros(1, 3, 3, dtype=torch.long)
    full = torch.ones(1, 3, 3, dtype=torch.long)
    assert segmentation_metrics(_logits_for(empty), empty) == {"acc": 1.0, "dice": 1.0, "iou": 1.0}
    assert segmentation_metrics(_logits_for(full), empty)["dice"] == 0.0  # non-empty prediction, empty mask
    assert segmentation_metrics(_logits_for(empty), full)["iou"] == 0.0  # empty prediction, non-empty mask
    # per image, then averaged: a perfect empty image and a missed object average to 0.5
    two = segmentation_metrics(_logits_for(torch.cat([empty, empty])), torch.cat([empty, full]))
    assert two["dice"] == pytest.approx(0.5) and two["iou"] == pytest.approx(0.5)


def test_against_scikit_learn_per_image():
    rng = np.random.default_rng(0)
    y = torch.from_numpy(rng.random((12, 9, 7)) < 0.3).long()
    pred = torch.from_numpy(rng.random((12, 9, 7)) < 0.35).long()
    y[3] = 0  # an empty mask (the prediction is not empty)
    y[5] = 0
    pred[5] = 0  # both empty: 1 by convention (scikit-learn's zero_division=1.0)
    m = segmentation_metrics(_logits_for(pred), y)
    ref_dice = np.mean(
        [f1_score(t.ravel(), p.ravel(), zero_division=1.0) for t, p in zip(y, pred, strict=True)]
    )
    ref_iou = np.mean(
        [jaccard_score(t.ravel(), p.ravel(), zero_division=1.0) for t, p in zip(y, pred, strict=True)]
    )
    assert m["dice"] == pytest.approx(ref_dice, abs=1e-12)
    assert m["iou"] == pytest.approx(ref_iou, abs=1e-12)
    assert m["acc"] == pytest.approx(float((pred == y).float().mean()))


def test_multiclass_is_the_mean_over_foreground_classes():
    rng = np.random.default_rng(1)
    y = torch.from_numpy(rng.integers(0, 3, size=(5, 6, 6)))
    pred = torch.from_numpy(rng.integers(0, 3, size=(5, 6, 6)))
    m = segmentation_metrics(_logits_for(pred, 3), y)
    per_image = [
        np.mean([f1_score(t.ravel() == c, p.ravel() == c, zero_division=1.0) for c in (1, 2)])
        for t, p in zip(y.numpy(), pred.numpy(), strict=True)
    ]
    assert m["dice"] == pytest.approx(np.mean(per_image), abs=1e-12)


def test_multiclass_dice_and_iou_by_hand_skip_the_classes_absent_from_mask_and_prediction():
    y = torch.zeros(3, 3, 3, dtype=torch.long)
    pred = torch.zeros(3, 3, 3, dtype=torch.long)
    y[0, 0, 0] = y[0, 0, 1] = 1
    y[0, 1, 1] = 2
    pred[0, 0, 0] = 1
    pred[0, 1, 1] = pred[0, 1, 2] = 2
    pred[1, 2, 2] = 3  # a class the mask lacks: 0 for the image
    m = segmentation_metrics(_logits_for(pred, 4), y)
    # image 0: class 1 Dice 2·1/(1+2) = 2/3, IoU 1/2; class 2 the same; class 3 absent from both: left out
    # image 1: class 3 predicted, not in the mask: Dice 0, IoU 0; image 2: nothing anywhere: 1, 1
    assert m["dice"] == pytest.approx((2 / 3 + 0 + 1) / 3, abs=1e-12)
    assert m["iou"] == pytest.approx((1 / 2 + 0 + 1) / 3, abs=1e-12)
    assert m["acc"] == pytest.approx((7 + 8 + 9) / 27)


def test_loss_is_per_image_dice_plus_bce():
    torch.manual_seed(0)
    logits = torch.randn(3, 2, 5, 5)
    y = (torch.rand(3, 5, 5) > 0.5).long()
    loss = segmentation_loss(logits, y)
    assert loss.shape == (3,)
    # two-channel softmax cross-entropy = BCE of the foreground logit z1 − z0
    bce = F.binary_cross_entropy_with_logits(logits[:, 1] - logits[:, 0], y.float(), reduction="none")
    p = torch.sigmoid(logits[:, 1] - logits[:, 0])
    dice = (2 * (p * y).sum((1, 2)) + 1) / (p.sum((1, 2)) + y.sum((1, 2)) + 1)
    assert torch.allclose(loss, bce.mean((1, 2)) + 1 - dice, atol=1e-5)
    assert float(soft_dice_loss(_logits_for(y) * 10, y).max()) < 1e-6  # a confident exact prediction
    # mutual learning: w = 0 is the plain loss; KL against itself is 0
    logp = logits.log_softmax(1)
    assert torch.allclose(segmentation_dml_loss(logits, y, logp, 0.5), 0.5 * loss, atol=1e-6)


@pytest.mark.slow  # ~2 s (two UNets)
def test_scores_of_a_unet_equal_the_metrics_of_its_logits():
    from silofl.models import build_model

    torch.manual_seed(0)
    models = [build_model("unet", (1, 16, 16), 2) for _ in range(2)]
    x = torch.randn(10, 1, 16, 16)
    y = (torch.rand(10, 16, 16) > 0.6).long()
    with torch.no_grad():
        ref = [segmentation_metrics(m.eval()(x), y) for m in models]
    assert scores(models[0], x, y, batch_size=3) == pytest.approx(ref[0])
    stacked = all_scores(models, x, y)  # the engine's path for several models
    for s, r in zip(stacked, ref, strict=True):
        assert s == pytest.approx(r, abs=1e-6)
