"""Non-federated references: Regular (each site alone) and Joint (all data pooled).

* **Regular**: each site trains its *private* architecture on its own data only, with DP-SGD when
  privacy is on (the papers' figure) and without it under ``privacy: off``; nothing is sent.
* **Joint**: one model of the private architecture trained on the union of the clients' data (the
  non-federated upper bound; one site); one epoch of Poisson batches over the pooled data per round,
  with DP-SGD when privacy is on (ε is then per example of the pooled data set).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from silofl.fl.coordinator import Method
from silofl.fl.exchange.local import Local, LocalSite
from silofl.fl.methods.common import dpsgd_settings, spec
from silofl.fl.options import DPSGDOptions, PrivateModelOptions, check_model, option
from silofl.fl.registry import register


@dataclass
class RegularOptions(PrivateModelOptions, DPSGDOptions):
    """Regular: each site trains its private architecture alone."""


@register(
    "regular",
    options=RegularOptions,
    headline="private_acc",
    exchange="none",
    metrics=("private_acc",),
    description="each client trains its private architecture alone",
)
class Regular(Method):
    opts: RegularOptions

    def make_site(self, k, x, y, data):
        return LocalSite(
            k,
            x,
            y,
            spec(self.opts.private_model_of(k), data),
            dpsgd_settings(self.plan, k),
            shared_field="private",
        )

    def make_coordinator(self, n_sites, data, device):
        return Local(self.plan, n_sites)


@dataclass
class JointOptions(DPSGDOptions):
    """Joint: one model of the private architecture on the pooled data."""

    private_model: str = option("lenet5", "The private model's architecture (never leaves the site).")

    def validate(self, run: Any) -> None:
        super().validate(run)
        check_model(self.private_model)


@register(
    "joint",
    options=JointOptions,
    headline="global_acc",
    exchange="none",
    pooled=True,
    metrics=("global_acc",),
    description="one model on the pooled data (non-federated upper bound)",
)
class Joint(Method):
    opts: JointOptions

    def site_data(self, parts):
        return [(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))]

    def make_site(self, k, x, y, data):
        return LocalSite(
            k, x, y, spec(self.opts.private_model, data), dpsgd_settings(self.plan, k), shared_field="global"
        )

    def make_coordinator(self, n_sites, data, device):
        return Local(self.plan, n_sites)
