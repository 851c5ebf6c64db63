"""What the built-in example-level methods share: a DP-SGD site's settings from the run's plan; the sites and
server of a method whose shared model a server averages, per the placement of its noise."""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

from silofl.fl.coordinator import Method
from silofl.fl.exchange.centralized import Centralized, CentralSite
from silofl.fl.exchange.pooled import PooledCentralized, PooledSite, pooled_settings
from silofl.fl.exchange.secure_average import SecureCentralized, SecureCentralSite
from silofl.fl.options import DPSGDOptions, MutualLearningOptions, SharedModelOptions
from silofl.fl.plan import RunPlan, as_plan
from silofl.models import ModelSpec
from silofl.site.dpsgd import DPSGDSettings

# what a method reads of its run (the name of the protocol methods were typed against before plans)
PlannedRun = RunPlan


def dpsgd_settings(plan: RunPlan | Any, k: int) -> DPSGDSettings:
    """The settings of site ``k`` of an example-level method: the asked settings from ``plan.config``, the
    derived ones (batch size, σ) from the plan, its own budget ``plan.target_epsilon_of(k)``. ``plan``: the
    method's :class:`~silofl.fl.plan.RunPlan` (a config given in full is taken as its plan)."""
    p = as_plan(plan)
    cfg = p.config  # what the user asked
    o: DPSGDOptions = cfg.options  # an example-level method's options hold the DP-SGD recipe
    if p.batch_size is None:
        raise ValueError(
            "a DP-SGD site needs the planned batch size (silofl.runner.plan fills it from the data)"
        )
    return DPSGDSettings(
        seed=cfg.seed,
        batch_size=p.batch_size,
        lr=o.lr,
        weight_decay=o.weight_decay,
        private=cfg.is_private,
        noise_multiplier=p.noise_multiplier,
        clip=cfg.clip,
        delta=cfg.delta,
        accountant=cfg.accountant,
        target_epsilon=p.target_epsilon_of(k),
        dp_backend=o.dp_backend,
        optimizer_state=o.optimizer_state if isinstance(o, SharedModelOptions) else "reset",
        dml_alpha=o.dml_alpha if isinstance(o, MutualLearningOptions) else 0.5,
        dml_beta=float((o.dml_beta if isinstance(o, MutualLearningOptions) else 0.0) or 0.0),
        optimizer=o.optimizer,
        momentum=o.momentum,
        nesterov=o.nesterov,
        ema_decay=o.ema_decay,
        augmult=o.augmult,
        aug_pad=o.aug_pad,
        aug_flip=o.aug_flip,
        sample_rate=o.sample_rate,
        local_steps=o.local_steps,
        private_lr=o.private_lr,
    )


def spec(name: str, data: Any) -> ModelSpec:
    """A model spec of architecture ``name`` for the data's input shape and classes."""
    return ModelSpec(name, data.input_shape, data.num_classes)


class SiteClasses(NamedTuple):
    """A server-averaged method's site class per placement of its noise."""

    plain: type  # no secure aggregation: the shared model uploaded as is (silofl.fl.exchange.centralized)
    secure: type  # secure aggregation of DP models (silofl.fl.exchange.secure_average)
    pooled: type  # pooled noise: one DP-GD step's noise shared by the sites (silofl.fl.exchange.pooled)


class ServerAveraged(Method):
    """A method whose sites' shared model a server averages (FedAvg and its kin): its :attr:`sites` class and
    its server per the options' placement — plain, secure aggregation of DP models, or pooled noise
    (``noise_placement: pooled``) — with :attr:`server_optimizer` (None: FedAvg's step, or FedAvgM's with
    ``server_lr``/``server_momentum``) stepping on the average, or on the pooled step, alike."""

    opts: Any
    sites: ClassVar[SiteClasses] = SiteClasses(CentralSite, SecureCentralSite, PooledSite)
    server_optimizer: ClassVar[str | None] = None
    shared_field: ClassVar[str] = "global"

    def placement(self) -> tuple[str, Any]:
        """("pooled" | "secure" | "plain", the settings of its secure sums or None)."""
        o = self.opts
        if getattr(o, "noise_placement", "local") == "pooled":
            return "pooled", pooled_settings(o, self.plan)
        secure = o.secure_average(self.plan) if hasattr(o, "secure_average") else None
        return ("secure", secure) if secure is not None else ("plain", None)

    def averaging_site(self, k: int, x: Any, y: Any, data: Any, **kw: Any) -> Any:
        """Site ``k`` of the placement's class (``kw``: the class's own arguments, e.g. a private model)."""
        kind, settings = self.placement()
        site = getattr(self.sites, kind)(
            k,
            x,
            y,
            spec(self.opts.proxy_model, data),
            dpsgd_settings(self.plan, k),
            shared_field=self.shared_field,
            **kw,
        )
        if settings is not None:
            getattr(site, f"enable_{kind}")(settings, self.plan.seed)
        return site

    def make_site(self, k, x, y, data):
        return self.averaging_site(k, x, y, data)

    def make_coordinator(self, n_sites, data, device):
        kind, settings = self.placement()
        args = (self.plan, n_sites, spec(self.opts.proxy_model, data), device)
        kw = {"uniform": self.opts.aggregation == "uniform", "server_optimizer": self.server_optimizer}
        if settings is None:
            return Centralized(*args, **kw)
        return {"pooled": PooledCentralized, "secure": SecureCentralized}[kind](*args, settings, **kw)
