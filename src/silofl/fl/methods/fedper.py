"""FedPer (Arivazhagan et al., "Federated Learning with Personalization Layers", 2019) with example-level DP:
a shared body averaged by the server, a head kept at every site.

Every site trains its whole model (``proxy_model``; the head is the last layer with parameters, the body
everything before it) with DP-SGD, as FedAvg does, then uploads **only the body**; the server averages the
bodies (:mod:`silofl.fl.exchange.centralized` with ``shared_keys``) and broadcasts the average, and each site
loads it under its own head. The head never leaves the site.

Why the head is trained with DP too: the body's per-example gradients flow through the head. A head trained
without
DP is a function of the whole local data set, so the body's DP-SGD step would then depend on other examples
than the
one it clips — the reason ProxyFL's ``paper`` mode is no formal guarantee. With the head inside the DP model,
each
step is DP-SGD on one model: the accountant counts exactly FedAvg's steps, the shared body is post-processing
of the
DP model, and the site's personalised model (body + head, ``private_acc``) is a DP model too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from silofl.comm.messages import Packet
from silofl.comm.wire import encode, read_model
from silofl.core.errors import ConfigError
from silofl.fl.coordinator import Method
from silofl.fl.exchange.centralized import Centralized, CentralSite
from silofl.fl.methods.common import dpsgd_settings, spec
from silofl.fl.options import AveragingOptions, SharedModelOptions
from silofl.fl.registry import register
from silofl.models import ModelSpec


def head_keys(model: torch.nn.Module) -> tuple[str, ...]:
    """The state-dict keys of a model's head: its last module (in registration order) with parameters of
    its own."""
    last = None
    for name, m in model.named_modules():
        if any(True for _ in m.parameters(recurse=False)):
            last = name
    if not last:
        return tuple(model.state_dict())
    return tuple(k for k in model.state_dict() if k.startswith(last + "."))


def body_keys(s: ModelSpec) -> tuple[str, ...]:
    """The state-dict keys of the body of architecture ``s`` (everything but the head); ConfigError if it
    has none."""
    with torch.random.fork_rng(
        devices=[]
    ):  # building a model to read its layout draws nothing from the run's streams
        model = s.build()
    head = set(head_keys(model))
    body = tuple(k for k in model.state_dict() if k not in head)
    if not body:
        raise ConfigError(
            f"FedPer shares a model's body and keeps its last layer; {s.name!r} has a single layer: "
            "choose a deeper proxy_model"
        )
    return body


@dataclass
class FedPerOptions(AveragingOptions, SharedModelOptions):
    """FedPer: one DP model per site; the body is averaged by a server, the head stays."""


class PersonalHeadSite(CentralSite):
    """A FedAvg site that sends and receives only its model's body (see the module doc)."""

    def __init__(self, *args: Any, shared_keys: tuple[str, ...] = (), **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.shared_keys = tuple(shared_keys)

    def payload(self, rnd: int, extra: dict[str, torch.Tensor] | None = None, **meta) -> bytes:
        state = self.shared.state_dict()
        body = {k: state[k] for k in self.shared_keys}
        body.update(extra or {})
        return encode(body, meta={"round": rnd, "src": self.cid, "model": self.shared_spec.name, **meta})

    def read(
        self, packet: Packet, extra_keys: tuple[str, ...] = (), rnd: int | None = None
    ) -> tuple[dict, dict[str, float], dict]:
        """A received body, validated against this site's body and probed under its own head: (the whole
        model's tensors, extras, meta). Raises PeerModelRejected."""
        expect = {"src": packet.src} if rnd is None else {"round": rnd, "src": packet.src}
        state = dict(self.shared.state_dict())
        tensors, extras, meta = read_model(
            packet.data, {k: state[k] for k in self.shared_keys}, extra_keys, expect=expect
        )
        merged = {**{k: v.detach().clone() for k, v in state.items()}, **tensors}
        self.probe(merged)
        return merged, extras, meta

    def replace_shared(self, state: dict[str, torch.Tensor], token: object = None) -> None:
        super().replace_shared(state, token=None)  # every site's head differs: never one evaluation for all


class SharedKeysMethod(Method):
    """A method whose clients keep part of one DP model and share the rest (FedPer, FedBN, FedRep): a
    :class:`PersonalHeadSite` (or :attr:`site_cls`) per client and a :class:`Centralized` server, both told
    the shared parameters by :meth:`shared_keys`."""

    opts: Any
    site_cls: type[PersonalHeadSite] = PersonalHeadSite

    def shared_keys(self, s: ModelSpec) -> tuple[str, ...]:
        """The parameters the server averages (the rest stays at each client)."""
        return body_keys(s)

    def site_options(self) -> dict[str, Any]:
        """Extra keyword arguments of :attr:`site_cls`."""
        return {}

    def make_site(self, k, x, y, data):
        s = spec(self.opts.proxy_model, data)
        return self.site_cls(
            k,
            x,
            y,
            s,
            dpsgd_settings(self.plan, k),
            shared_field="private",
            shared_keys=self.shared_keys(s),
            **self.site_options(),
        )

    def make_coordinator(self, n_sites, data, device):
        s = spec(self.opts.proxy_model, data)
        return Centralized(
            self.plan,
            n_sites,
            s,
            device,
            uniform=self.opts.aggregation == "uniform",
            shared_keys=self.shared_keys(s),
        )


@register(
    "fedper",
    options=FedPerOptions,
    headline="private_acc",
    exchange="server",
    metrics=("private_acc",),
    description="one DP model per client; the server averages the bodies, each client keeps its head",
)
class FedPer(SharedKeysMethod):
    opts: FedPerOptions
