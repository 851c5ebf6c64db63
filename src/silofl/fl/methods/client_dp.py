"""Client-level DP federated learning with adaptive intermediaries (Jiang et al., MICCAI 2023): the
four server optimizers with DP, and their non-private upper bounds. The round is in
:mod:`silofl.fl.exchange.client_level`, the site in :mod:`silofl.site.subclients`.

The non-private DP-FedAvg is ``dp-fedavg --privacy off``: ``fedavg`` names the ProxyFL papers'
example-level baseline.
"""

from __future__ import annotations

from silofl.fl.coordinator import Method
from silofl.fl.exchange.client_level import (
    ClientLevelDP,
    ClientLevelOptions,
    ClientLevelSite,
    DP2Options,
    FedAdamOptions,
)
from silofl.fl.methods.common import spec
from silofl.fl.registry import register
from silofl.site.subclients import SubclientSettings


class ClientLevelMethod(Method):
    """A client-level DP method: hospitals with sub-clients, a DP server with ``optimizer``."""

    opts: ClientLevelOptions
    optimizer = "fedavg"
    normalise = False  # DP-FedNova: updates scaled by τ̄/τ_j

    def make_site(self, k, x, y, data):
        o = self.opts
        settings = SubclientSettings(
            seed=self.plan.config.seed,
            batch_size=self.plan.batch_size,
            local_epochs=o.local_epochs,
            local_lr=o.local_lr,
            private=self.plan.config.is_private,
            privacy_unit=o.privacy_unit,
            normalise=self.normalise,
            clip=self.plan.config.clip,
            secure=o.secure_settings(self.plan),
            prox_mu=o.mu,
        )
        return ClientLevelSite(k, x, y, spec(o.proxy_model, data), settings)

    def make_coordinator(self, n_sites, data, device):
        return ClientLevelDP(self.plan, n_sites, spec(self.opts.proxy_model, data), device, self.optimizer)


def _register(
    name: str,
    options: type,
    optimizer: str,
    description: str,
    nonprivate: bool = False,
    normalise: bool = False,
) -> None:
    cls = type(
        name.replace("-", "_").title().replace("_", ""),
        (ClientLevelMethod,),
        {"optimizer": optimizer, "normalise": normalise, "__module__": __name__, "__doc__": description},
    )
    register(
        name,
        options=options,
        headline="global_acc",
        exchange="server",
        level="client",
        nonprivate=nonprivate,
        metrics=("global_acc",),
        description=description,
    )(cls)


_register(
    "dp-fedavg",
    ClientLevelOptions,
    "fedavg",
    "client-level DP: clipped client updates, server noise, FedAvg step",
)
_register(
    "dp-fedadam", FedAdamOptions, "fedadam", "client-level DP with the adaptive server optimizer FedAdam"
)
_register(
    "dp-fednova",
    ClientLevelOptions,
    "fednova",
    "client-level DP with updates normalised by local step counts (FedNova)",
    normalise=True,
)
_register(
    "dp2-rmsprop",
    DP2Options,
    "dp2-rmsprop",
    "client-level DP with DP²-RMSProp (delayed preconditioner, SGD/adaptive phases)",
)
_register("fedadam", FedAdamOptions, "fedadam", "FedAdam without DP (upper bound)", nonprivate=True)
_register(
    "fednova",
    ClientLevelOptions,
    "fednova",
    "FedNova without DP (upper bound)",
    nonprivate=True,
    normalise=True,
)
_register(
    "rmsprop",
    DP2Options,
    "dp2-rmsprop",
    "DP²-RMSProp's server optimizer without DP (upper bound)",
    nonprivate=True,
)
