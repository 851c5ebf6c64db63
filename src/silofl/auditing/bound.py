"""From canary scores to the one-run lower bound on ε (:mod:`silofl.auditing.one_run`).

Each canary has one score per *score type* (e.g. the final model's confidence, or the sum over rounds
of what each round's local training did to it); higher means "more likely included". The auditor
guesses IN for the k highest and OUT for the k lowest and abstains on the rest. Which score type and
which k are chosen after seeing the guesses' results, so every (score type, k) pair is one hypothesis
of a Bonferroni correction: each is tested at β / H and the best bound still holds with confidence
1 − β. ``max_auditable_epsilon`` is the most this audit could have shown: the bound if every guess at the
largest k had been right. The list of k is fixed in advance as fractions of the number of canaries m
(:data:`K_FRACTIONS`), the score types by the kind of audit.
"""

from __future__ import annotations

import numpy as np

from silofl.auditing import mia, one_run

K_FRACTIONS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5)


def k_grid(m: int) -> list[int]:
    """The guesses on each side (k IN, k OUT) tried for ``m`` canaries."""
    return sorted({max(1, int(round(f * m))) for f in K_FRACTIONS if max(1, int(round(f * m))) * 2 <= m})


def _rank(row: dict) -> tuple[float, float, int]:
    """Best bound first; among equal bounds (all 0), the most accurate guesses, then the most of them."""
    return row["epsilon_lower_bound"], row["correct"] / max(1, row["guesses"]), row["guesses"]


def one_run_bound(
    scores: dict[str, np.ndarray], included: np.ndarray, delta: float, confidence: float = 0.95, seed: int = 0
) -> dict:
    """The best ε lower bound over score types × k (Bonferroni), with every hypothesis' counts."""
    included = np.asarray(included, bool)
    m = len(included)
    ks = k_grid(m)
    hypotheses = len(scores) * len(ks)
    beta = 1.0 - confidence
    beta_h = beta / hypotheses
    tiebreak = int(np.random.default_rng(seed).integers(2**62))
    rows, best = [], None
    for name, s in scores.items():
        s = np.asarray(s, float)
        for k in ks:
            t = one_run.make_guesses(s, k, k, np.random.default_rng(tiebreak))
            r, v = one_run.count_guesses(t, included)
            eps = one_run.eps_lower_bound(m, r, v, delta, beta_h)
            row = {
                "score": name,
                "k_pos": k,
                "k_neg": k,
                "guesses": r,
                "correct": v,
                "epsilon_lower_bound": eps,
            }
            rows.append(row)
            if best is None or _rank(row) > _rank(best):
                best = row
    assert best is not None
    ceiling = max(one_run.max_auditable_eps(m, 2 * k, delta, beta_h) for k in ks)
    aucs = {
        name: mia.auc(np.asarray(s, float), included) if 0 < included.sum() < m else None
        for name, s in scores.items()
    }
    return {
        "epsilon_lower_bound": best["epsilon_lower_bound"],
        "confidence": confidence,
        "delta": delta,
        "score": best["score"],
        "k_pos": best["k_pos"],
        "k_neg": best["k_neg"],
        "guesses": best["guesses"],
        "correct": best["correct"],
        "hypotheses": hypotheses,
        "beta_per_hypothesis": beta_h,
        "max_auditable_epsilon": ceiling,
        # the most m canaries can certify at all: every one of them guessed, every guess right (no correction)
        "certifiable_epsilon_max": one_run.max_auditable_eps(m, m, delta, beta),
        "canary_auc": aucs,
        "candidates": rows,
    }
