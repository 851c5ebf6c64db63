"""Membership-inference scores and metrics in numpy/scipy, no sklearn.

Vendored from the validated research module behind issue 17 (metrics equal to scikit-learn's
``roc_curve``/``roc_auc_score`` with ties; the RMIA fast path equal to the pairwise formula). The
attack libraries that exist (Privacy Meter, TensorFlow Privacy's MIA module) pull in TensorFlow or
their own training stacks; the attacks themselves are a few lines of numpy.

Convention throughout: a higher score means "more likely a member (IN)".

Metrics
  roc_curve(scores, labels)     -> fpr, tpr, thresholds; ties are handled the
                                   way sklearn handles them (one ROC point per
                                   distinct score)
  auc(scores, labels)           -> area under the ROC curve by the trapezoid
                                   rule; equals the Mann-Whitney U statistic
                                   with ties counted 1/2
  tpr_at_fpr(scores, labels, f) -> largest TPR among ROC points with FPR <= f
                                   (the "low-FPR" metric of Carlini et al. 2022)

Attacks (one target model, a few reference / shadow models)
  logit_confidence(logits, y)   -> phi = log p_y - log(1 - p_y), computed stably
                                   from logits (LiRA's "logit scaling")
  loss_score(logits, y)         -> -cross-entropy (the LOSS attack of Yeom et al.)
  lira_offline / lira_online    -> Carlini et al. 2022 (arXiv 2112.03570)
  rmia                          -> Zarifzadeh et al. 2024 (arXiv 2312.03262)
"""

from __future__ import annotations

import numpy as np
from scipy import special, stats

__all__ = [
    "roc_curve",
    "auc",
    "tpr_at_fpr",
    "attack_metrics",
    "log_softmax",
    "logit_confidence",
    "true_label_prob",
    "loss_score",
    "lira_offline",
    "lira_online",
    "rmia",
]


# ----------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------


def _prep(scores, labels):
    s = np.asarray(scores, dtype=float).ravel()
    y = np.asarray(labels).astype(bool).ravel()
    if s.shape != y.shape:
        raise ValueError("scores and labels must have the same length")
    if np.isnan(s).any():
        raise ValueError("NaN score")
    if y.all() or (~y).all():
        raise ValueError("need at least one member and one non-member")
    return s, y


def roc_curve(scores, labels):
    """ROC points for the rule "predict IN if score >= t", with t running over
    the distinct scores from high to low. Includes the point (0, 0)."""
    s, y = _prep(scores, labels)
    order = np.argsort(-s, kind="mergesort")
    s, y = s[order], y[order]
    # Positions where the score changes: the last index of each block of ties.
    distinct = np.flatnonzero(np.diff(s)) if s.size > 1 else np.array([], int)
    ends = np.r_[distinct, s.size - 1]
    tps = np.cumsum(y)[ends]
    fps = np.cumsum(~y)[ends]
    tpr = np.r_[0.0, tps / y.sum()]
    fpr = np.r_[0.0, fps / (~y).sum()]
    thr = np.r_[np.inf, s[ends]]
    return fpr, tpr, thr


def auc(scores, labels):
    """Area under the ROC curve. Equals P[s_member > s_nonmember] +
    0.5 P[tie], the Mann-Whitney statistic."""
    fpr, tpr, _ = roc_curve(scores, labels)
    return _auc(fpr, tpr)


def _auc(fpr, tpr):
    trapezoid = getattr(np, "trapezoid", None) or np.trapz  # type: ignore[attr-defined]  # numpy >= 2.0 / < 2.0
    return float(trapezoid(tpr, fpr))


def tpr_at_fpr(scores, labels, fpr_target):
    """Largest TPR over thresholds with FPR <= fpr_target (no interpolation).

    Resolution: with n non-members the achievable FPRs are multiples of
    1/n. To report TPR at 0.1% FPR you need n >= 1000, and preferably 10x
    that, or the number rests on 0 or 1 false positive. Report n next to it.
    """
    fpr, tpr, _ = roc_curve(scores, labels)
    out = _tpr_at(fpr, tpr, np.atleast_1d(np.asarray(fpr_target, dtype=float)))
    return out if np.ndim(fpr_target) else float(out[0])


def _tpr_at(fpr, tpr, targets):
    return np.array([tpr[fpr <= t + 1e-15].max() for t in targets])


def attack_metrics(scores, labels, fprs=(1e-3, 1e-2)):
    """AUC, TPR at each FPR in ``fprs`` and the member / non-member counts of ``scores`` (higher: member); the
    ROC curve is computed once."""
    s, y = _prep(scores, labels)
    fpr, tpr, _ = roc_curve(s, y)
    res = {"auc": _auc(fpr, tpr), "n_members": int(y.sum()), "n_nonmembers": int((~y).sum())}
    for f, t in zip(fprs, _tpr_at(fpr, tpr, fprs), strict=True):
        res[f"tpr@{f:g}fpr"] = float(t)
    # Balanced accuracy of the best single threshold (Carlini et al. report it too).
    res["balanced_acc"] = float(np.max(1 - (fpr + (1 - tpr)) / 2))
    return res


# ----------------------------------------------------------------------------
# Signals from a model's logits
# ----------------------------------------------------------------------------


def log_softmax(logits):
    """Numerically stable log-softmax over the last axis."""
    z = np.asarray(logits, dtype=np.float64)
    return z - special.logsumexp(z, axis=-1, keepdims=True)


def true_label_prob(logits, y):
    """Softmax probability of the true label, f_theta(x)_y."""
    lp = log_softmax(logits)
    return np.exp(np.take_along_axis(lp, np.asarray(y)[..., None], -1)[..., 0])


def logit_confidence(logits, y):
    """phi(f(x)_y) = log(p_y / (1 - p_y)), computed as
    z_y - logsumexp_{y' != y} z_{y'}, which is exact and stable even when
    p_y rounds to 1 in float. Logits shape (..., n, C), labels shape (n,)."""
    z = np.asarray(logits, dtype=np.float64)
    y = np.asarray(y)
    zy = np.take_along_axis(z, np.broadcast_to(y, z.shape[:-1])[..., None], -1)[..., 0]
    mask = np.zeros(z.shape, dtype=bool)
    np.put_along_axis(mask, np.broadcast_to(y, z.shape[:-1])[..., None], True, -1)
    others = special.logsumexp(np.where(mask, -np.inf, z), axis=-1)
    return zy - others


def loss_score(logits, y):
    """LOSS attack: score = -cross-entropy loss (higher = more likely member)."""
    lp = log_softmax(logits)
    return np.take_along_axis(lp, np.asarray(y)[..., None], -1)[..., 0]


# ----------------------------------------------------------------------------
# LiRA (Carlini, Chien, Nasr, Song, Terzis, Tramer; IEEE S&P 2022)
# ----------------------------------------------------------------------------


def _robust_stats(ref, axis, global_std):
    mu = np.median(ref, axis=axis)  # the reference code uses the median
    if global_std:
        sd = np.full_like(mu, np.std(ref))
    else:
        sd = np.std(ref, axis=axis)
    return mu, np.maximum(sd, 1e-12)


def lira_offline(phi_target, phi_ref_out, global_std=True, two_sided=False):
    """Offline LiRA: only reference models that did NOT train on x.

    phi_target:  (n,)    phi of the target model on each example
    phi_ref_out: (K, n)  phi of K reference models that did not train on x
    Score (one-sided, as in the paper):
        Lambda(x) = P[Z < phi_target],  Z ~ N(mu_out(x), sd_out(x)^2)
    We return the log of it, logcdf((phi - mu_out)/sd_out); the ranking is the
    same and there is no underflow at large phi.
    With few reference models (Carlini et al. suggest < 64) use one global
    sd estimated from all (model, example) pairs: global_std=True.
    two_sided=True gives the public reference code's variant:
    -log N(phi; mu_out, sd_out).
    """
    phi = np.asarray(phi_target, float)
    mu, sd = _robust_stats(np.asarray(phi_ref_out, float), 0, global_std)
    if two_sided:
        return -stats.norm.logpdf(phi, mu, sd)
    return stats.norm.logcdf((phi - mu) / sd)


def lira_online(phi_target, phi_ref, ref_in, global_std=True):
    """Online LiRA: reference models both with (IN) and without (OUT) x.

    phi_ref: (K, n) phi of K reference models on each example
    ref_in:  (K, n) bool, whether reference model k trained on example i
    Score: log N(phi; mu_in, sd_in^2) - log N(phi; mu_out, sd_out^2)
    Each example needs IN and OUT reference models. The usual design is
    that every reference model trains on a random half of the candidate
    pool, so each x is IN for about K/2 of them.
    """
    phi = np.asarray(phi_target, float)
    P = np.asarray(phi_ref, float)
    inside = np.asarray(ref_in, bool)
    if (inside.sum(0) == 0).any() or ((~inside).sum(0) == 0).any():
        raise ValueError("every example needs >= 1 IN and >= 1 OUT reference model")
    Pin = np.where(inside, P, np.nan)
    Pout = np.where(~inside, P, np.nan)
    mu_in, mu_out = np.nanmedian(Pin, 0), np.nanmedian(Pout, 0)
    if global_std:
        sd_in = np.full_like(mu_in, np.nanstd(Pin))
        sd_out = np.full_like(mu_out, np.nanstd(Pout))
    else:
        sd_in, sd_out = np.nanstd(Pin, 0), np.nanstd(Pout, 0)
    sd_in, sd_out = np.maximum(sd_in, 1e-12), np.maximum(sd_out, 1e-12)
    return stats.norm.logpdf(phi, mu_in, sd_in) - stats.norm.logpdf(phi, mu_out, sd_out)


# ----------------------------------------------------------------------------
# RMIA (Zarifzadeh, Liu, Mittal, Shokri; ICML 2024)
# ----------------------------------------------------------------------------


def rmia(p_target_x, p_ref_x, p_target_z, p_ref_z, ref_in_x=None, offline_a=0.3, gamma=1.0):
    """RMIA score: the fraction of population samples z that x "dominates".

      Pr(x|theta) = softmax probability of the true label under the target model
      Pr(x)       = average of Pr(x|theta') over the reference models theta'
      LR(x, z)    = [Pr(x|theta)/Pr(x)] / [Pr(z|theta)/Pr(z)]
      Score(x)    = (1/|Z|) sum_z 1[ LR(x, z) >= gamma ]

    Offline (every reference model is OUT for x, i.e. ref_in_x is None or all
    False): Pr(x) is approximated from the OUT average by
        Pr(x) = ((1 + a) * mean_OUT(x) + (1 - a)) / 2,
    which follows from assuming Pr_IN(x) ~= a * Pr_OUT(x) + (1 - a). The same
    correction is applied to Pr(z), since z is OUT for every reference model.
    The paper tunes a (about 0.2 to 1) by attacking one reference model with
    the others; ml_privacy_meter's default is 0.3 and its grid is 0.0, 0.1, ..., 1.0.
    Online: Pr(x) = plain mean over all reference models, IN and OUT.

    p_target_x: (n,)   p_ref_x: (K, n)   p_target_z: (nz,)   p_ref_z: (K, nz)
    """
    px = np.asarray(p_target_x, float)
    Rx = np.asarray(p_ref_x, float)
    pz = np.asarray(p_target_z, float)
    Rz = np.asarray(p_ref_z, float)
    offline = ref_in_x is None or not np.asarray(ref_in_x, bool).any()
    if offline:
        prx = 0.5 * ((1 + offline_a) * Rx.mean(0) + (1 - offline_a))
    else:
        prx = Rx.mean(0)
    prz = 0.5 * ((1 + offline_a) * Rz.mean(0) + (1 - offline_a)) if offline else Rz.mean(0)
    ratio_x = px / np.maximum(prx, 1e-300)
    ratio_z = pz / np.maximum(prz, 1e-300)
    # Score(x) = fraction of z with ratio_z <= ratio_x / gamma. Sorting makes
    # this O((n + nz) log nz) instead of n * nz.
    rz = np.sort(ratio_z)
    return np.searchsorted(rz, ratio_x / gamma, side="right") / rz.size
