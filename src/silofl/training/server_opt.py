"""Server optimizers applied to the (noisy) mean client update Δ̄, a flat parameter vector.

Every optimizer returns the step to add to the global weights. They see only the released
aggregate, so whatever they do is post-processing of the DP mechanism.

* ``fedavg``: w ← w + η·Δ̄ (McMahan et al.).
* ``fedadam``: Adam on the pseudo-gradient −Δ̄ (Reddi et al., "Adaptive Federated Optimization"): m ← β₁m +
  (1−β₁)Δ̄, u ← β₂u + (1−β₂)Δ̄², w ← w + η·m̂/(√û + τ); bias correction optional (Reddi et al. run without
  it), τ the adaptivity.
* ``fedavgm``: server momentum (Hsu et al., 2019): m ← μ·m + Δ̄, w ← w + η·m; example-level FedAvg/FML use it
  on the average of the sites' DP models (``server_lr``, ``server_momentum``).
* ``fednova``: the clients normalise (see :mod:`silofl.site.subclients`), the server then steps like FedAvg.
* ``dp2-rmsprop``: DP² (Li et al., "Differentially Private Adaptive Optimization with Delayed
  Preconditioners", 2023) on the server: phases of ``delay`` rounds alternate, starting with SGD. In SGD
  phases w ← w + η_sgd·Δ̄ and the updates are averaged into an accumulator; at the start of each adaptive
  phase the preconditioner becomes u ← β·u + (1−β)·(accumulated mean)² — the mean of several noisy updates, so
  less noise enters it — and the accumulator restarts. In adaptive phases w ← w + η·Δ̄/(√û + τ) with that
  delayed, fixed u, bias-corrected û = u/(1−β^k) after k refreshes (50 rounds give only a handful of
  refreshes: without the correction u stays ~(1−β) too small).
"""

from __future__ import annotations

import torch

from silofl.core.errors import ConfigError

OPTIMIZERS = ("fedavg", "fedadam", "fednova", "dp2-rmsprop", "fedavgm", "fedyogi")


class ServerOptimizer:
    """FedAvg's server step w ← w + η·Δ̄; the base of the server optimizers."""

    def __init__(self, lr: float):
        if lr <= 0:
            raise ConfigError(f"server learning rate must be positive, got {lr}")
        self.lr = lr
        self.rounds = 0

    def step(self, mean_update: torch.Tensor) -> torch.Tensor:
        """The step to add to the global weights for this round's mean update."""
        self.rounds += 1
        return self.lr * mean_update

    def describe(self) -> dict:
        """The optimizer's settings, for summary.json."""
        return {"lr": self.lr}

    def state_dict(self) -> dict:
        """Counters and moment tensors (attributes that are tensors or ints), for checkpoints."""
        return {k: v for k, v in vars(self).items() if k in self.STATE}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        for k in self.STATE:
            v = state.get(k)
            setattr(self, k, v.clone() if isinstance(v, torch.Tensor) else v)

    STATE: tuple[str, ...] = ("rounds",)


class FedAdam(ServerOptimizer):
    """Adam on the pseudo-gradient −Δ̄ (Reddi et al.)."""

    STATE = ("rounds", "m", "u")

    def __init__(
        self,
        lr: float,
        beta1: float = 0.9,
        beta2: float = 0.99,
        tau: float = 1e-3,
        bias_correction: bool = False,
    ):
        super().__init__(lr)
        if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):
            raise ConfigError(f"Adam betas must lie in [0, 1), got {beta1}, {beta2}")
        if tau <= 0:
            raise ConfigError(f"τ (adaptivity) must be positive, got {tau}")
        self.beta1, self.beta2, self.tau, self.bias_correction = beta1, beta2, tau, bias_correction
        self.m: torch.Tensor | None = None
        self.u: torch.Tensor | None = None

    def step(self, mean_update: torch.Tensor) -> torch.Tensor:
        """The step to add to the global weights for this round's mean update."""
        self.rounds += 1
        if self.m is None:
            self.m = torch.zeros_like(mean_update)
            self.u = torch.zeros_like(mean_update)
        self.m.mul_(self.beta1).add_(mean_update, alpha=1 - self.beta1)
        self.u.mul_(self.beta2).addcmul_(mean_update, mean_update, value=1 - self.beta2)
        m, u = self.m, self.u
        if self.bias_correction:
            m = m / (1 - self.beta1**self.rounds)
            u = u / (1 - self.beta2**self.rounds)
        return self.lr * m / (u.sqrt() + self.tau)

    def describe(self) -> dict:
        """The optimizer's settings, for summary.json."""
        return {
            "lr": self.lr,
            "beta1": self.beta1,
            "beta2": self.beta2,
            "tau": self.tau,
            "bias_correction": self.bias_correction,
        }


class FedYogi(FedAdam):
    """Yogi on the pseudo-gradient −Δ̄ (Reddi et al.; Zaheer et al. 2018): FedAdam's step with the second
    moment u ← u − (1−β₂)·Δ̄²·sign(u − Δ̄²), which grows or shrinks by at most (1−β₂)·Δ̄² a round instead of
    decaying geometrically. u starts at 0, as FedAdam's does (its first round equals FedAdam's)."""

    def step(self, mean_update: torch.Tensor) -> torch.Tensor:
        """The step to add to the global weights for this round's mean update."""
        self.rounds += 1
        if self.m is None:
            self.m = torch.zeros_like(mean_update)
            self.u = torch.zeros_like(mean_update)
        assert self.u is not None
        sq = mean_update * mean_update
        self.m.mul_(self.beta1).add_(mean_update, alpha=1 - self.beta1)
        self.u.sub_((1 - self.beta2) * sq * torch.sign(self.u - sq))
        m, u = self.m, self.u
        if self.bias_correction:
            m = m / (1 - self.beta1**self.rounds)
            u = u / (1 - self.beta2**self.rounds)
        return self.lr * m / (u.sqrt() + self.tau)


class DP2RMSProp(ServerOptimizer):
    """DP²-RMSProp: SGD and adaptive phases with a delayed preconditioner (see the module doc)."""

    STATE = ("rounds", "acc", "acc_n", "refreshes", "u")

    def __init__(self, lr: float, lr_sgd: float = 1.0, delay: int = 5, beta: float = 0.9, tau: float = 1e-3):
        super().__init__(lr)
        if lr_sgd <= 0:
            raise ConfigError(f"DP² SGD-phase learning rate must be positive, got {lr_sgd}")
        if delay < 1:
            raise ConfigError(f"DP² delay must be at least 1 round, got {delay}")
        if not 0.0 <= beta < 1.0:
            raise ConfigError(f"DP² β must lie in [0, 1), got {beta}")
        if tau <= 0:
            raise ConfigError(f"τ must be positive, got {tau}")
        self.lr_sgd, self.delay, self.beta, self.tau = lr_sgd, delay, beta, tau
        self.acc: torch.Tensor | None = None
        self.acc_n = 0
        self.refreshes = 0
        self.u: torch.Tensor | None = None

    def phase(self, rnd: int) -> str:
        """'sgd' or 'adaptive' for 1-based round ``rnd``."""
        return "sgd" if ((rnd - 1) // self.delay) % 2 == 0 else "adaptive"

    def step(self, mean_update: torch.Tensor) -> torch.Tensor:
        """The step to add to the global weights for this round's mean update."""
        self.rounds += 1
        if self.acc is None:
            self.acc = torch.zeros_like(mean_update)
            self.u = torch.zeros_like(mean_update)
        if self.phase(self.rounds) == "sgd":
            self.acc.add_(mean_update)
            self.acc_n += 1
            return self.lr_sgd * mean_update
        if (self.rounds - 1) % self.delay == 0:  # first round of an adaptive phase: refresh u
            mean = self.acc / max(1, self.acc_n)
            self.u.mul_(self.beta).addcmul_(mean, mean, value=1 - self.beta)
            self.refreshes += 1
            self.acc.zero_()
            self.acc_n = 0
        u = self.u / (1 - self.beta**self.refreshes)  # bias-corrected: u starts at 0 and refreshes are few
        return self.lr * mean_update / (u.sqrt() + self.tau)

    def describe(self) -> dict:
        """The optimizer's settings, for summary.json."""
        return {"lr": self.lr, "lr_sgd": self.lr_sgd, "delay": self.delay, "beta": self.beta, "tau": self.tau}


class ServerMomentum(ServerOptimizer):
    """FedAvgM: heavy-ball momentum on the mean update, m ← μ·m + Δ̄, step η·m."""

    STATE = ("rounds", "m")

    def __init__(self, lr: float, momentum: float = 0.9):
        super().__init__(lr)
        if not 0.0 <= momentum < 1.0:
            raise ConfigError(f"server momentum must lie in [0, 1), got {momentum}")
        self.momentum = momentum
        self.m: torch.Tensor | None = None

    def step(self, mean_update: torch.Tensor) -> torch.Tensor:
        """The step to add to the global weights for this round's mean update."""
        self.rounds += 1
        self.m = mean_update.clone() if self.m is None else self.m.mul_(self.momentum).add_(mean_update)
        return self.lr * self.m

    def describe(self) -> dict:
        """The optimizer's settings, for summary.json."""
        return {"lr": self.lr, "momentum": self.momentum}


def make_optimizer(name: str, cfg) -> ServerOptimizer:
    """The server optimizer ``name`` with its settings from ``cfg`` (an object with ``server_lr`` and, per
    optimizer, ``adam_beta1``, ``adam_beta2``, ``server_tau``, ``bias_correction``, ``dp2_delay``,
    ``dp2_lr_sgd``)."""
    lr = cfg.server_lr
    if name in ("fedavg", "fednova"):
        return ServerOptimizer(lr)
    if name == "fedadam":
        return FedAdam(lr, cfg.adam_beta1, cfg.adam_beta2, cfg.server_tau, cfg.bias_correction)
    if name == "fedyogi":
        return FedYogi(lr, cfg.adam_beta1, cfg.adam_beta2, cfg.server_tau, cfg.bias_correction)
    if name == "fedavgm":
        return ServerMomentum(lr, cfg.server_momentum)
    if name == "dp2-rmsprop":
        return DP2RMSProp(lr, cfg.dp2_lr_sgd, cfg.dp2_delay, cfg.adam_beta2, cfg.server_tau)
    raise ConfigError(f"unknown server optimizer {name!r}; choose one of: {', '.join(OPTIMIZERS)}")
