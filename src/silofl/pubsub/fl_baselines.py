"""DP federated baselines for the PubSub-ML experiments: FedAvg, FedProx and FedAdam with client-level
DP (clipped client updates, Gaussian noise added by the server), vanilla ("V") and fine-tuned
locally by the subscriber afterwards ("F").

Every site trains on the union of all feature spaces, scaled to [0, 1] by the public bounds; a
feature a site lacks is fed as 0, as the paper does. All sites take part every round (sampling rate
1); the noise multiplier z comes from Opacus' ``get_noise_multiplier`` for the target (ε, δ) over the
rounds, and the ε reported is the RDP accountant's for the mechanism that ran (z, q = 1, rounds).
The paper gives FL the *minimum* of the publishers' budgets, since one global model must protect
every site at once. Fine-tuning uses only the subscriber's own data and so costs no privacy.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from silofl.core.errors import ConfigError
from silofl.core.randomness import party_seeds
from silofl.models import MLP
from silofl.privacy import Accountant, NoiseSource, noise_multiplier_for
from silofl.privacy.client_level import clip_update
from silofl.training import accuracy
from silofl.training.server_opt import FedAdam, ServerOptimizer

METHODS = ("fedavg", "fedprox", "fedadam")


def _loss(task: str, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, y) if task == "classification" else F.mse_loss(out.squeeze(1), y)


def _targets(task: str, y: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(y, dtype=torch.long if task == "classification" else torch.float32)


def local_sgd(
    model, x, y, task, epochs, lr, batch, gen, prox_mu: float = 0.0, anchor=None, adam: bool = False
) -> None:
    """A site's local training of the FL baselines (SGD or Adam, optional FedProx term)."""
    opt = torch.optim.Adam(model.parameters(), lr=lr) if adam else torch.optim.SGD(model.parameters(), lr=lr)
    n = len(x)
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen)
        for i in range(0, n, batch):
            idx = perm[i : i + batch]
            opt.zero_grad()
            loss = _loss(task, model(x[idx]), y[idx])
            if prox_mu and anchor is not None:
                loss = loss + 0.5 * prox_mu * (parameters_to_vector(model.parameters()) - anchor).pow(2).sum()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(
                model.parameters(), 10.0
            )  # keeps SGD stable on noisy global weights
            opt.step()


def run_fl(
    method: str,
    sites: list[tuple[np.ndarray, np.ndarray]],
    task: str,
    n_out: int,
    *,
    epsilon: float,
    delta: float,
    rounds: int = 30,
    local_epochs: int = 1,
    local_lr: float = 0.1,
    batch: int = 32,
    clip: float = 1.0,
    mu: float = 0.1,
    server_lr: float | None = None,
    hidden: int = 64,
    seed: int | None = None,
    nonprivate: bool = False,
) -> tuple[torch.nn.Module, dict]:
    """Train one global model over ``sites`` (each (x in the union space, y)); (model, privacy info)."""
    if method not in METHODS:
        raise ConfigError(f"unknown FL baseline {method!r}; choose one of: {', '.join(METHODS)}")
    k = len(sites)
    if not nonprivate and not (epsilon > 0 and math.isfinite(epsilon) and 0 < delta <= 1 / k):
        raise ConfigError(
            f"client-level DP over {k} sites needs ε > 0 and 0 < δ ≤ 1/{k}, got ε={epsilon}, δ={delta}"
        )
    seeds = party_seeds(None, 0)  # used only without a seed (a seed makes a reproducible research run)
    torch.manual_seed(seed if seed is not None else seeds[0])
    d = sites[0][0].shape[1]
    model = MLP((d,), n_out, hidden=(hidden,))
    data = [(torch.as_tensor(x, dtype=torch.float32), _targets(task, y)) for x, y in sites]
    gen = torch.Generator().manual_seed(seed if seed is not None else seeds[1])
    noise = NoiseSource(seed + 7919 if seed is not None else None)
    opt: ServerOptimizer = (
        FedAdam(server_lr or 0.03) if method == "fedadam" else ServerOptimizer(server_lr or 1.0)
    )
    z = 0.0
    if not nonprivate:
        try:
            z = noise_multiplier_for(epsilon, delta, 1.0, rounds)
        except ValueError:
            raise ConfigError(
                f"the budget ε={epsilon:g}, δ={delta:g} cannot be met over {rounds} rounds"
            ) from None
    acc = Accountant("rdp")
    for _ in range(rounds):
        w = parameters_to_vector(model.parameters()).detach().clone()
        total = torch.zeros_like(w)
        for x, y in data:
            vector_to_parameters(w.clone(), model.parameters())
            local_sgd(
                model,
                x,
                y,
                task,
                local_epochs,
                local_lr,
                batch,
                gen,
                prox_mu=mu if method == "fedprox" else 0.0,
                anchor=w,
            )
            delta_k = parameters_to_vector(model.parameters()).detach() - w
            total += delta_k if nonprivate else clip_update(delta_k, clip)[0]
        if not nonprivate:
            total += noise.normal(tuple(total.shape), z * clip)
            acc.step(z, 1.0)
        vector_to_parameters(w + opt.step(total / k), model.parameters())
    info = {"method": method, "rounds": rounds, "sites": k, "private": not nonprivate}
    if not nonprivate:
        info.update(
            {
                "noise_multiplier": z,
                "clip": clip,
                "epsilon": acc.epsilon(delta),
                "delta": delta,
                "accountant": acc.name,
                "unit": "one site (client-level DP)",
            }
        )
    return model, info


def fine_tune(
    model: torch.nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    task: str,
    epochs: int = 20,
    lr: float = 0.005,
    batch: int = 32,
    seed: int = 0,
) -> torch.nn.Module:
    """The subscriber's local fine-tuning ("F"): Adam on its own data, after the federated training."""
    import copy

    tuned = copy.deepcopy(model)
    local_sgd(
        tuned,
        torch.as_tensor(x, dtype=torch.float32),
        _targets(task, y),
        task,
        epochs,
        lr,
        batch,
        torch.Generator().manual_seed(seed),
        adam=True,
    )
    return tuned


@torch.no_grad()
def evaluate(model: torch.nn.Module, x: np.ndarray, y: np.ndarray, task: str) -> float:
    """Accuracy (classification) or MSE (regression)."""
    xt = torch.as_tensor(x, dtype=torch.float32)
    if task == "classification":
        return accuracy(model, xt, torch.as_tensor(y))
    return float(((model(xt).squeeze(1).numpy() - y) ** 2).mean())
