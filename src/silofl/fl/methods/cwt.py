"""CWT, cyclical weight transfer (Chang et al.): one DP model passed from site to site
(:mod:`silofl.fl.exchange.cycle`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from silofl.core.errors import ConfigError
from silofl.fl.coordinator import Method
from silofl.fl.exchange.cycle import CWT, CycleSite
from silofl.fl.methods.common import dpsgd_settings, spec
from silofl.fl.options import SharedModelOptions, option
from silofl.fl.registry import register


@dataclass
class CWTOptions(SharedModelOptions):
    """CWT: one DP model travelling a cycle."""

    cwt_visits: int | None = option(None, "CWT: sites that train per round (default all: one full cycle).")

    def validate(self, run: Any) -> None:
        super().validate(run)
        if self.cwt_visits is not None and self.cwt_visits < 1:
            raise ConfigError(f"cwt_visits must be at least 1, got {self.cwt_visits}")


@register(
    "cwt",
    options=CWTOptions,
    headline="global_acc",
    exchange="cycle",
    metrics=("global_acc",),
    description="one DP model passed from client to client in a cycle",
)
class CyclicalWeightTransfer(Method):
    opts: CWTOptions

    def make_site(self, k, x, y, data):
        return CycleSite(
            k, x, y, spec(self.opts.proxy_model, data), dpsgd_settings(self.plan, k), shared_field="global"
        )

    def make_coordinator(self, n_sites, data, device):
        return CWT(self.plan, n_sites, visits=self.opts.cwt_visits)
