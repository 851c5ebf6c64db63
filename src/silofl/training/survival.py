"""Survival targets: a Cox proportional-hazards head and Harrell's C-index — without DP.

A table's schema may name a survival target, ``target: {type: survival, time: COL, event: COL}``
(:mod:`silofl.data.schema`): per row a time and whether the event happened then (1) or the row was censored
then (0). A model with one output gives each row a *risk score* r = f(x) (a linear f is the Cox model).

* :func:`cox_loss`: the negative Cox partial log-likelihood with Breslow's handling of tied times,
  −(1/d) Σ_{i: event} [r_i − log Σ_{j: t_j ≥ t_i} exp(r_j)], d the number of events;
* :func:`fit_cox`: a site's own model fitted on its own rows by full-batch L-BFGS on that loss;
* :func:`c_index`: Harrell's concordance index of risk scores (1 = perfect ranking, 0.5 = random).

**Why there is no DP-SGD here.** DP-SGD's guarantee rests on per-example clipping: each example's loss
depends on that example only, so removing it changes the clipped gradient sum by at most C. The Cox loss
is not separable: row j sits in the risk set (the denominator) of every i with t_i ≤ t_j, so removing j
changes the gradient of *every* such ℓ_i, and the sum of clipped per-row gradients can move by far more
than C — per-row clipping of the batch's Cox loss bounds nothing. A sound DP variant needs a bounded
per-example surrogate (e.g. a Poisson/discrete-time likelihood on fixed public time bins) or a sensitivity
analysis of the coupled loss. So the Cox head here is the **non-private**, going-alone path: what
:func:`fit_cox` returns is a model trained without DP, and the federated DP methods refuse a survival schema
with a one-line error.

The per-example surrogate is here as a building block: :class:`PiecewiseHazard` with
:func:`piecewise_loss`, the piecewise-exponential proportional-hazards likelihood on public time bins, whose
per-row loss depends on that row alone, so :class:`~silofl.privacy.DPGradient` trains it with the usual
guarantee (tested: a DP-SGD fit ranks held-out rows). ``silofl run`` trains it on a survival schema with
public time bins (:func:`encode_target` and below).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

PAIR_BLOCK = 2048  # rows per block of the C-index's pair comparison (memory: block × n booleans)


def cox_loss(risk: torch.Tensor, time: torch.Tensor, event: torch.Tensor) -> torch.Tensor:
    """The negative Cox partial log-likelihood (Breslow ties), averaged over the events (0 without events):
    each event's risk set is every row whose time is at least its own, tied rows included."""
    risk, time, event = risk.reshape(-1), time.reshape(-1).to(risk.dtype), event.reshape(-1).to(torch.bool)
    n = len(risk)
    if n == 0 or not bool(event.any()):
        return risk.sum() * 0.0
    order = torch.argsort(time, descending=True, stable=True)
    lse = torch.logcumsumexp(risk[order], 0)  # log Σ exp(r) over the rows with the largest times first
    ascending = torch.sort(time).values
    at_least = n - torch.searchsorted(ascending, time, right=False)  # rows with t_j ≥ t_i, per row i
    denominator = lse[at_least - 1]
    return -(risk - denominator)[event].sum() / event.sum()


def c_index(risk, time, event) -> float:
    """Harrell's C: over the comparable pairs — i had the event and j outlived it (t_j > t_i, or t_j = t_i
    with j censored) — the share where i's risk is higher, a tie in risk counting ½. NaN without comparable
    pairs."""
    r = np.asarray(risk, dtype=np.float64).reshape(-1)
    t = np.asarray(time, dtype=np.float64).reshape(-1)
    e = np.asarray(event).reshape(-1).astype(bool)
    good = ties = pairs = 0.0
    events = np.flatnonzero(e)
    for k in range(0, len(events), PAIR_BLOCK):
        rows = events[k : k + PAIR_BLOCK]
        ti, ri = t[rows, None], r[rows, None]
        comparable = (t[None, :] > ti) | ((t[None, :] == ti) & ~e[None, :])
        pairs += comparable.sum()
        good += (comparable & (ri > r[None, :])).sum()
        ties += (comparable & (ri == r[None, :])).sum()
    return float((good + 0.5 * ties) / pairs) if pairs else float("nan")


def fit_cox(
    x: torch.Tensor,
    time: torch.Tensor,
    event: torch.Tensor,
    model: nn.Module | None = None,
    l2: float = 0.0,
    iterations: int = 200,
) -> nn.Module:
    """A risk model (default: linear, no bias — the Cox model) fitted WITHOUT DP to (x, time, event) by
    full-batch L-BFGS on :func:`cox_loss` + ``l2``·‖w‖²/2. Non-private: see the module doc."""
    if model is None:
        model = nn.Linear(x.shape[1], 1, bias=False)
        nn.init.zeros_(model.weight)
    x = x.to(torch.float64)
    model = model.to(torch.float64)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.LBFGS(params, max_iter=iterations, tolerance_grad=1e-10, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = cox_loss(model(x), time, event)
        if l2:
            loss = loss + 0.5 * l2 * sum(p.pow(2).sum() for p in params)
        loss.backward()
        return loss

    opt.step(closure)
    return model


# ------------------------------------------------------------------ a per-example surrogate DP-SGD can train
class PiecewiseHazard(nn.Module):
    """A proportional-hazards model DP-SGD can train: hazard h(t | x) = exp(b_k + f(x)) in public time bin k
    (the piecewise-exponential model; with fine bins it approaches Cox). Its output, per row, is the risk
    f(x) followed by the K log baseline hazards b (the same for every row), so a loss sees both:
    :func:`piecewise_loss`. ``edges``: the bins' inner boundaries, fixed in advance and public (never
    quantiles of a site's times)."""

    def __init__(self, risk: nn.Module, edges) -> None:
        super().__init__()
        e = [float(v) for v in edges]
        if any(b <= a for a, b in zip(e, e[1:], strict=False)) or (e and e[0] <= 0):
            raise ValueError("the bin edges must be positive and increasing")
        self.risk = risk
        self.register_buffer("edges", torch.tensor(e, dtype=torch.float32))
        self.log_base = nn.Parameter(torch.zeros(len(e) + 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = self.risk(x).reshape(x.shape[0], 1)
        return torch.cat([r, self.log_base.to(r.dtype).expand(x.shape[0], -1)], 1)


def piecewise_loss(out: torch.Tensor, time: torch.Tensor, event: torch.Tensor, edges: torch.Tensor):
    """Per-row negative log-likelihood of the piecewise-exponential model (``out`` from
    :class:`PiecewiseHazard`): ℓ_i = Σ_k exp(b_k + r_i)·exposure_ik − e_i·(b_{k(i)} + r_i), exposure_ik the
    time row i spent in bin k, k(i) the bin of its time. Row i's loss depends on row i alone (and the
    parameters), so DP-SGD's per-example clipping bounds what one row changes — unlike :func:`cox_loss`."""
    r, b = out[:, :1], out[:, 1:]
    t = time.reshape(-1, 1).to(out.dtype)
    lo = torch.cat([torch.zeros(1, dtype=out.dtype, device=out.device), edges.to(out.dtype)])
    hi = torch.cat([edges.to(out.dtype), torch.full((1,), float("inf"), dtype=out.dtype, device=out.device)])
    exposure = (torch.minimum(t, hi[None, :]) - lo[None, :]).clamp(min=0.0)
    k = torch.bucketize(t.reshape(-1), edges.to(out.dtype), right=True)
    at_event = (b.gather(1, k.reshape(-1, 1)) + r).reshape(-1)
    return (torch.exp(b + r) * exposure).sum(1) - event.reshape(-1).to(out.dtype) * at_event


# ------------------------------------------------------------------ the survival target in a run (silofl run)
# In a run a survival target travels as one float row per example, [time, event, k, exposure_0 … exposure_K]
# (K + 1 bins from K public inner edges): the bin k of its time and the time spent in each bin are computed
# once at load from the public edges, so the loss needs nothing but the row and the model's output. A model
# for it has 1 + (K + 1) outputs: a risk r and one log hazard per bin b_k (for a linear or MLP model b_k may
# depend on x too: a piecewise-exponential model with bin-specific effects; its proportional special case is
# :class:`PiecewiseHazard`). Row i's loss ℓ_i = Σ_k exp(b_k + r)·exposure_ik − e_i·(b_{k(i)} + r) depends on
# row i alone, so DP-SGD's per-example (or per-person) clipping bounds what one unit changes.
TARGET_HEAD = 3  # time, event, bin index; the per-bin exposures follow


def check_edges(edges) -> tuple[float, ...]:
    """The public inner bin edges as a tuple: positive, finite, strictly increasing, at least one; ValueError
    with a one-line reason else."""
    try:
        e = tuple(float(v) for v in edges)
    except (TypeError, ValueError):
        raise ValueError(f"time bins must be numbers, got {edges!r}") from None
    if not e:
        raise ValueError("time bins need at least one inner edge (two bins)")
    if any(not np.isfinite(v) or v <= 0 for v in e) or any(b <= a for a, b in zip(e, e[1:], strict=False)):
        raise ValueError(f"time bins must be positive, finite and increasing, got {list(e)}")
    return e


def encode_target(time_event: np.ndarray, edges) -> np.ndarray:
    """(n, 3 + K + 1) float32 rows [time, event, k, exposure per bin] of (n, 2) [time, event] rows for the
    public inner ``edges`` (K of them): what a run trains and scores on (see above)."""
    e = np.asarray(check_edges(edges), dtype=np.float64)
    te = np.asarray(time_event, dtype=np.float64).reshape(-1, 2)
    t = te[:, :1]
    lo = np.concatenate([[0.0], e])[None, :]
    hi = np.concatenate([e, [np.inf]])[None, :]
    exposure = np.clip(np.minimum(t, hi) - lo, 0.0, None)
    k = np.searchsorted(e, te[:, 0], side="right").astype(np.float64)  # = torch.bucketize(right=True)
    return np.concatenate([te, k[:, None], exposure], axis=1).astype(np.float32)


def is_survival_target(y: torch.Tensor) -> bool:
    """Whether ``y`` holds encoded survival rows (:func:`encode_target`): float, two-dimensional."""
    return y.is_floating_point() and y.dim() == 2 and y.shape[1] > TARGET_HEAD


def bins_of_target(y: torch.Tensor) -> int:
    """The number of time bins of encoded survival rows (the model has one output more)."""
    return int(y.shape[1]) - TARGET_HEAD


def encoded_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-row negative log-likelihood of the piecewise-exponential model on encoded rows
    (:func:`encode_target`): ``out`` (B, 1 + bins) = [r, b_0 … b_K]. Equals :func:`piecewise_loss` on the
    raw times (tested)."""
    bins = y.shape[1] - TARGET_HEAD
    if out.shape[1] != bins + 1:
        raise ValueError(
            f"a survival model for {bins} time bins has {bins + 1} outputs, this one {out.shape[1]}"
        )
    r, b = out[:, :1], out[:, 1:]
    y = y.to(out.dtype)
    event, k, exposure = y[:, 1], y[:, 2].long(), y[:, TARGET_HEAD:]
    at_event = (b.gather(1, k.reshape(-1, 1)) + r).reshape(-1)
    return (torch.exp((b + r).clamp(max=60.0)) * exposure).sum(1) - event * at_event


def risk_score(out: torch.Tensor) -> torch.Tensor:
    """Each row's risk from the model's output (B, 1 + bins): log Σ_k h_k(x) = r + logsumexp(b) — higher, the
    event sooner; for a proportional-hazards model (b the same for every row) it ranks rows as r does."""
    return out[:, 0] + torch.logsumexp(out[:, 1:], dim=1)


def survival_metrics(out: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """The figures of a survival model on encoded rows: ``c_index`` (Harrell's, of :func:`risk_score`) and
    ``acc`` NaN (accuracy is not defined for a survival target: reported as null)."""
    if len(y) == 0:
        return {"acc": float("nan"), "c_index": float("nan")}
    out = out.detach().to(torch.float64)
    y64 = y.detach().to(torch.float64)
    return {
        "acc": float("nan"),
        "c_index": c_index(risk_score(out).cpu().numpy(), y64[:, 0].cpu().numpy(), y64[:, 1].cpu().numpy()),
    }


def distill_loss(
    out: torch.Tensor, y: torch.Tensor, other: torch.Tensor | None, weight: float
) -> torch.Tensor:
    """Per-row deep-mutual-learning loss of a survival model (ProxyFL, FML): ``(1 − w)·ℓ_i + w·d_i`` with ℓ
    the piecewise-exponential loss (:func:`encoded_loss`) and d_i = ½·mean_k (h_ik − h'_ik)² the squared
    distance of the two models' log hazards h_k = r + b_k in every bin, ``other`` the partner's detached
    outputs (the survival counterpart of the classifier's KL: 0 exactly when the two hazard functions agree
    on the row). Row i's term depends on row i alone."""
    base = encoded_loss(out, y)
    if weight == 0.0 or other is None or other.shape != out.shape:
        return base
    h = out[:, :1] + out[:, 1:]
    h_other = (other[:, :1] + other[:, 1:]).to(out.dtype)
    return (1.0 - weight) * base + weight * 0.5 * (h - h_other).pow(2).mean(1)
