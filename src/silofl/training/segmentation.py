"""Segmentation: the loss a site trains on and the metrics it is scored by, as pure functions.

A segmentation model maps images (n, C_in, H, W) to per-pixel class logits (n, K, H, W); its targets are masks
(n, H, W) of class indices, 0 the background (K = 2 for a binary mask: the foreground is class 1). A run is a
segmentation run when its targets are masks: :func:`is_segmentation` reads that from the shapes, so every
place that trains or scores a model (DP-SGD's per-example losses, local SGD of client-level methods, the
evaluation) takes the segmentation branch without a flag.

Loss (per image, so DP-SGD clips one image's gradient): the mean per-pixel cross-entropy plus the soft Dice
loss ``1 − mean_c (2 Σ p_c g_c + 1) / (Σ p_c + Σ g_c + 1)`` over the foreground classes c ≥ 1 (p_c the softmax
probability, g_c the one-hot mask, smoothing 1). With K = 2 the two-channel softmax cross-entropy is exactly
the binary cross-entropy of the foreground logit z_1 − z_0, so this is the usual Dice + BCE loss. Mutual
learning (ProxyFL, FML) adds the per-pixel KL divergence between the two models' class distributions, averaged
over the pixels of the image.

Metrics (``silofl.training.metrics``' ``dice`` and ``iou``), per image and then averaged over the images:

- ``dice`` = 2|P ∩ G| / (|P| + |G|) and ``iou`` = |P ∩ G| / |P ∪ G| of the predicted foreground P (arg-max
  class) and the mask G; with several foreground classes (label masks 0 … K−1) the macro mean over the
  foreground classes 1 … K−1 **present in the image's mask or prediction** (a class absent from both says
  nothing about the image and is left out, as scikit-learn's macro F1 leaves out absent labels).
- Empty prediction **and** empty mask (no foreground class in either): 1 — the model is exactly right about
  an image without foreground (the convention of e.g. scikit-learn's ``f1_score(zero_division=1)``). An
  empty mask with a non-empty prediction, or the reverse, scores 0. With K = 2 both rules give the binary
  Dice of the foreground.
- ``acc``: the pixel accuracy (correct pixels / all pixels), kept under the name every model's figures are
  keyed by (``<role>_acc``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

SEGMENTATION_METRICS = ("acc", "dice", "iou")


def is_segmentation(out: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether (model output, target) are (n, K, H, W) logits and (n, H, W) masks."""
    return out.dim() == 4 and y.dim() == 3


def _per_image_mean(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0], -1).mean(1)


def soft_dice_loss(logits: torch.Tensor, y: torch.Tensor, smooth: float = 1.0) -> torch.Tensor:
    """Per-image soft Dice loss over the foreground classes 1 … K−1: shape (n,)."""
    k = logits.shape[1]
    p = logits.softmax(1)[:, 1:]  # (n, K-1, H, W)
    fg = torch.arange(1, k, device=y.device).view(1, k - 1, 1, 1)
    g = (y.long().unsqueeze(1) == fg).to(p.dtype)  # one-hot of the foreground classes (vmap-safe)
    inter = (p * g).flatten(2).sum(-1)
    denom = p.flatten(2).sum(-1) + g.flatten(2).sum(-1)
    dice = (2.0 * inter + smooth) / (denom + smooth)  # (n, K-1)
    return 1.0 - dice.mean(1)


def segmentation_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-image Dice + cross-entropy (BCE for a binary mask): shape (n,)."""
    ce = _per_image_mean(F.cross_entropy(logits, y.long(), reduction="none"))
    return ce + soft_dice_loss(logits, y)


def segmentation_dml_loss(
    logits: torch.Tensor, y: torch.Tensor, other_logp: torch.Tensor | None, weight: float
) -> torch.Tensor:
    """Per-image ``(1-w)·(Dice + CE) + w·KL(other ‖ model)``, the KL per pixel (over the classes)
    averaged over the image's pixels; ``other_logp`` the other model's detached (n, K, H, W)
    log-probabilities."""
    base = segmentation_loss(logits, y)
    if weight == 0.0 or other_logp is None or other_logp.dim() != 4:
        return base
    kl = F.kl_div(F.log_softmax(logits, dim=1), other_logp, reduction="none", log_target=True).sum(1)
    return (1.0 - weight) * base + weight * _per_image_mean(kl)


# ------------------------------------------------------------------------------------------------- metrics
def segmentation_counts(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per image and foreground class (|P ∩ G|, |P|, |G|) of the arg-max prediction, and the image's correct
    pixels: a float64 tensor (n, K−1, 3) and (n,) stacked as (n, 3·(K−1) + 1) — what the metrics need, so
    scoring can reduce each chunk of images at once and never keep their logits."""
    k = logits.shape[1]
    pred = logits.argmax(1)
    yl = y.long()
    correct = (pred == yl).flatten(1).sum(1).to(torch.float64)
    cols = []
    for c in range(1, k):
        p, g = pred == c, yl == c
        cols += [(p & g).flatten(1).sum(1), p.flatten(1).sum(1), g.flatten(1).sum(1)]
    stats = torch.stack(cols, 1).to(torch.float64) if cols else torch.zeros(len(y), 0, dtype=torch.float64)
    return torch.cat([stats, correct.unsqueeze(1)], 1)


def metrics_from_counts(counts: torch.Tensor, pixels_per_image: int) -> dict[str, float]:
    """``{acc, dice, iou}`` from :func:`segmentation_counts` of every image (see the module doc)."""
    n = counts.shape[0]
    if n == 0:
        return {"acc": math.nan, "dice": math.nan, "iou": math.nan}
    stats = counts[:, :-1].reshape(n, -1, 3)
    inter, p, g = stats[..., 0], stats[..., 1], stats[..., 2]
    union = p + g - inter
    empty = (p + g) == 0  # empty prediction and empty mask: 1 by convention
    dice = 2.0 * inter / (p + g).clamp(min=1.0)
    iou = inter / union.clamp(min=1.0)
    present = (~empty).to(dice.dtype)  # per image, the foreground classes in its mask or its prediction
    k = present.sum(1)
    one = torch.ones_like(k)
    dice_img = torch.where(k > 0, (dice * present).sum(1) / k.clamp(min=1.0), one)  # no class at all: 1
    iou_img = torch.where(k > 0, (iou * present).sum(1) / k.clamp(min=1.0), one)
    acc = float(counts[:, -1].sum()) / (n * pixels_per_image)
    return {"acc": acc, "dice": float(dice_img.mean()), "iou": float(iou_img.mean())}


def segmentation_metrics(logits: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """``{acc, dice, iou}`` of (n, K, H, W) logits on (n, H, W) masks (see the module doc)."""
    pixels = int(y.shape[1] * y.shape[2]) if y.dim() == 3 else 1
    return metrics_from_counts(segmentation_counts(logits, y), pixels)


def dice_iou(pred, mask) -> tuple[float, float]:
    """Dice and IoU of one binary prediction against one binary mask (any shape; both empty: 1, 1)."""
    p, g = torch.as_tensor(pred).bool(), torch.as_tensor(mask).bool()
    inter, sp, sg = int((p & g).sum()), int(p.sum()), int(g.sum())
    if sp + sg == 0:
        return 1.0, 1.0
    return 2.0 * inter / (sp + sg), inter / (sp + sg - inter)
