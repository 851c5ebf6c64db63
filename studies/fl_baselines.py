"""DP federated baselines for the PubSub-ML experiments — FedAvg, FedProx and FedAdam with client-level DP,
vanilla ("V") and fine-tuned locally by the subscriber afterwards ("F") — run through silofl's registered
client-level methods.

Every site trains on the union of all feature spaces, scaled to [0, 1] by the public bounds; a feature a
site lacks is fed as 0, as the paper does. :func:`run_fl` trains the baseline with the registered method
(:mod:`silofl.fl.methods.client_dp`) on the sites' in-memory arrays through the simulator engine
(:func:`silofl.runner.arrays.train_on_arrays`) — no second federated loop:

* FedAvg: ``dp-fedavg``; FedProx: ``dp-fedavg`` with its proximal weight ``mu`` (the client-level methods'
  local SGD adds μ/2·‖w − w_global‖²; the registered ``fedprox`` is example-level DP-SGD, a different
  mechanism, so it is not used here); FedAdam: ``dp-fedadam``. Without DP the same methods with
  ``privacy: off``.
* The mechanism: each site is one privacy unit (``privacy_unit: hospital``, no intermediaries), every site
  takes part every round (``client_rate`` 1), its update is clipped to C and the server adds N(0, (z·C)²) to
  the sum; z is calibrated by the run's plan from the target (ε, δ) over the rounds (Opacus'
  ``get_noise_multiplier``), and the ε reported is the server's RDP accountant's for the mechanism that ran.
* The model: ``mlp64`` (D-64-C), as before; a regression target trains with mean squared error.

The paper gives FL the *minimum* of the publishers' budgets, since one global model must protect every site
at once (the caller passes that minimum as ``epsilon``). Fine-tuning uses only the subscriber's own data and
so costs no privacy.

What changed against the loop this module held before (the PubSub scenario figures may move slightly): the
mechanism and its accounting are the same (client-level Gaussian on the sum of clipped site updates, q = 1,
the same calibration of z), but local training is the registered sites' — plain SGD over full batches
(a site's last incomplete batch is dropped, the batch is at most the smallest site's size), without the
gradient-norm cap of 10 the old loop applied to each local step, on shuffles and noise drawn from the
registered sites' and server's own (secret, or from the research seed) randomness; the server divides the
noised sum by the number of sites and steps with its optimizer (FedAdam's defaults:
silofl.training.server_opt).

Measured side by side (``bench/identical.py --base main --head gap27``: the quick scenarios, one seed, tiny
test sets): every PubSub-ML, PubSub-ML* and Own figure is unchanged and only the FL rows move — iid FedAvg-V/F
0.100/0.633 → 0.083/0.733, FedAdam-V/F 0.150/0.917 → 0.167/0.933; non-iid FedAvg-V 0.000 → 0.750, FedAdam-V
0.000 → 0.350; distributed features (same population) FedAvg-V/F 0.652/0.870 → 0.348/0.739; regression MSE
FedAvg-V 51575 → 1203, FedAdam-V/F 0.198/0.032 → 0.227/0.030. At ε = 1 over the rounds the server's noise
(z ≈ 22 for 30 rounds) dominates FedAvg's and FedProx's models either way; these moves are of that noise's
draw and of the local-training details above, not of the privacy mechanism, which is the same.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from silofl.core.errors import ConfigError
from silofl.training import accuracy

METHODS = ("fedavg", "fedprox", "fedadam")
# each baseline's registered method (silofl.fl.registry) and its default server learning rate
REGISTERED = {"fedavg": ("dp-fedavg", 1.0), "fedprox": ("dp-fedavg", 1.0), "fedadam": ("dp-fedadam", 0.03)}
MODEL = "mlp64"


def _loss(task: str, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, y) if task == "classification" else F.mse_loss(out.squeeze(1), y)


def _targets(task: str, y: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(y, dtype=torch.long if task == "classification" else torch.float32)


def local_sgd(model, x, y, task, epochs, lr, batch, gen, adam: bool = False) -> None:
    """The subscriber's local training when it fine-tunes a baseline (SGD or Adam on its own rows)."""
    opt = torch.optim.Adam(model.parameters(), lr=lr) if adam else torch.optim.SGD(model.parameters(), lr=lr)
    n = len(x)
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen)
        for i in range(0, n, batch):
            idx = perm[i : i + batch]
            opt.zero_grad()
            loss = _loss(task, model(x[idx]), y[idx])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
            opt.step()


def fl_config(
    method: str,
    *,
    epsilon: float,
    delta: float,
    rounds: int,
    local_epochs: int,
    local_lr: float,
    batch: int,
    clip: float,
    mu: float,
    server_lr: float | None,
    seed: int | None,
    nonprivate: bool,
):
    """The RunConfig of a baseline: its registered client-level method with the baseline's settings."""
    from silofl.runner.config import RunConfig

    name, default_lr = REGISTERED[method]
    asked = {
        "method": name,
        "dataset": "table",  # the rows are the caller's arrays, held per site (silofl.runner.arrays)
        "data_at_sites": True,
        "rounds": rounds,
        "seed": seed,
        "clip": clip,
        "delta": delta,
        "batch_size": batch,
        "device": "cpu",
        "proxy_model": MODEL,
        "privacy_unit": "hospital",
        "intermediaries": "none",
        "client_rate": 1.0,
        "local_epochs": local_epochs,
        "local_lr": local_lr,
        "server_lr": server_lr or default_lr,
        "mu": mu if method == "fedprox" else 0.0,
    }
    if nonprivate:
        asked["privacy"] = "off"
    else:
        asked["target_epsilon"] = epsilon  # budget-first: the plan calibrates z over the rounds
    return RunConfig.from_dict(asked)


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
    seed: int | None = None,
    nonprivate: bool = False,
) -> tuple[torch.nn.Module, dict]:
    """Train one global model over ``sites`` (each (x in the union space, y)) with the baseline's registered
    method; (the server's released model, privacy info from its accountant)."""
    from silofl.runner.arrays import train_on_arrays

    if method not in METHODS:
        raise ConfigError(f"unknown FL baseline {method!r}; choose one of: {', '.join(METHODS)}")
    k = len(sites)
    if not nonprivate and not (epsilon > 0 and math.isfinite(epsilon) and 0 < delta <= 1 / k):
        raise ConfigError(
            f"client-level DP over {k} sites needs ε > 0 and 0 < δ ≤ 1/{k}, got ε={epsilon}, δ={delta}"
        )
    smallest = min(len(y) for _, y in sites)
    cfg = fl_config(
        method,
        epsilon=epsilon,
        delta=delta,
        rounds=rounds,
        local_epochs=local_epochs,
        local_lr=local_lr,
        batch=max(1, min(batch, smallest)),
        clip=clip,
        mu=mu,
        server_lr=server_lr,
        seed=seed,
        nonprivate=nonprivate,
    )
    ran = train_on_arrays(cfg, sites, task, n_out if task == "classification" else None)
    model = ran.global_model()
    info: dict = {
        "method": method,
        "registered_method": cfg.method,
        "engine": "simulator",
        "rounds": ran.rounds,
        "sites": k,
        "private": not nonprivate,
    }
    if not nonprivate:
        rep = ran.privacy()
        info.update(
            {
                "noise_multiplier": ran.plan.noise_multiplier,
                "clip": clip,
                "epsilon": rep["epsilon"],
                "delta": rep["delta"],
                "accountant": rep["accountant"],
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
