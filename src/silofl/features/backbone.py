"""``backbone:DIR``: a frozen network's penultimate-layer output, loaded from a local folder (never
downloaded).

DIR holds ``backbone.safetensors`` and ``backbone.json`` (silofl's model spec, see :mod:`silofl.models`) and
``card.json``, which records the data the network was trained on and that its owner declared that data public
(``silofl backbone train``). The features are the input of the network's last Linear layer. The network is
fixed while a run trains: a function of each example alone. It costs the sites' budgets nothing *because* it
was trained on data declared public — the declaration is the user's, recorded in the card and in every model
card built on it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from silofl.core.errors import ConfigError
from silofl.features.base import FeatureStage
from silofl.features.registry import register

CARD_FORMAT = "silofl.backbone/1"
MAX_CARD_BYTES = 1 << 20


def last_linear(model: nn.Module) -> nn.Linear:
    """The model's output layer: its last registered Linear module."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ConfigError(f"{type(model).__name__} has no Linear output layer to take features before")
    return linears[-1]


class PenultimateModule(nn.Module):
    """A frozen model returning the input of its output layer."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self._out = last_linear(self.model)
        self._captured: torch.Tensor | None = None
        self._out.register_forward_hook(self._hook)

    def _hook(self, mod, inp, out):
        self._captured = inp[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.model(x)
        assert self._captured is not None
        feats, self._captured = self._captured, None
        return feats.flatten(1)


def read_card(folder: Path) -> dict[str, Any]:
    """The backbone folder's card (``card.json``), checked."""
    if not folder.is_dir():
        raise ConfigError(f"backbone folder {folder} not found (train one with `silofl backbone train`)")
    for name in ("backbone.safetensors", "backbone.json", "card.json"):
        if not (folder / name).is_file():
            raise ConfigError(
                f"backbone folder {folder} has no {name} (train one with `silofl backbone train`)"
            )
    p = folder / "card.json"
    if p.stat().st_size > MAX_CARD_BYTES:
        raise ConfigError(f"backbone card {p} is larger than {MAX_CARD_BYTES} bytes")
    try:
        card = json.loads(p.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"backbone card {p} is not valid JSON: {e}") from None
    if not isinstance(card, dict) or card.get("format") != CARD_FORMAT:
        raise ConfigError(f"backbone card {p} is not a silofl backbone card (format {CARD_FORMAT})")
    public = card.get("public_data")
    if not isinstance(public, dict) or not public.get("declared_public"):
        raise ConfigError(f"backbone card {p} does not record that its training data was declared public")
    return card


@register("backbone")
class BackboneFeatures(FeatureStage):
    takes_argument = True
    budget_note = (
        "a frozen network trained only on data its owner declared public (recorded in the backbone's card); "
        "it is applied to each example alone and never trained on a site's rows, so it costs no budget"
    )

    def __init__(self, folder: str | Path):
        from silofl.models import load_model

        self.folder = Path(folder).expanduser().resolve()
        self.card = read_card(self.folder)
        try:
            model, spec = load_model(self.folder / "backbone")
        except ConfigError as e:
            raise ConfigError(f"backbone folder {self.folder}: {e}") from None
        except Exception as e:  # noqa: BLE001 - a corrupt safetensors file is a bad folder, whatever the parser says
            raise ConfigError(
                f"backbone folder {self.folder}: cannot load backbone.safetensors ({e})"
            ) from None
        self.spec_ = spec
        self.net = PenultimateModule(model)
        self.digest = hashlib.sha256((self.folder / "backbone.safetensors").read_bytes()).hexdigest()

    @classmethod
    def from_config(cls, arg: str | None, cfg: Any) -> BackboneFeatures:
        assert arg is not None
        return cls(arg)

    def spec(self) -> dict[str, Any]:
        return {
            "name": "backbone",
            "architecture": self.spec_.name,
            "input_shape": list(self.spec_.input_shape),
            "sha256": self.digest,
            "public_data": self.card.get("public_data"),
        }

    def check_run(self, cfg: Any) -> None:
        """A backbone trained on a split's validation rows fits only runs on that split: other splits may hand
        those rows to a client."""
        pub = self.card.get("public_data") or {}
        if pub.get("kind") == "validation":
            rec = pub.get("split") or {}
            differ = [k for k, v in rec.items() if getattr(cfg, k, None) != v]
            if differ or getattr(cfg, "partition", None) == "site":
                raise ConfigError(
                    f"backbone {self.folder} was trained on the validation rows of another split ("
                    f"{', '.join(f'{k} {rec.get(k)!r}' for k in differ) or 'partition site'}): those rows "
                    "may belong to this run's clients; run on the recorded split or train a backbone on it"
                )
        elif pub.get("kind") == "dataset" and pub.get("dataset") == getattr(cfg, "dataset", None):
            raise ConfigError(
                f"backbone {self.folder} was trained on {pub.get('dataset')}'s training rows, which this "
                "run's clients hold: use another public data set"
            )

    def output_shape(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        if tuple(input_shape) != tuple(self.spec_.input_shape):
            raise ConfigError(
                f"backbone {self.folder} takes inputs of shape {tuple(self.spec_.input_shape)}, the data "
                f"has {tuple(input_shape)}"
            )
        with torch.no_grad():
            return tuple(self.net(torch.zeros(1, *input_shape)).shape[1:])

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        self.output_shape(tuple(x.shape[1:]))
        with torch.no_grad():
            return self.net(x.float().cpu())

    def describe(self) -> str:
        pub = self.card.get("public_data", {})
        return (
            f"the penultimate layer of a frozen {self.spec_.name} backbone ({self.folder.name}, sha256 "
            f"{self.digest[:12]}…) trained on {pub.get('description', 'data declared public')}"
        )

    def module(self, input_shape: tuple[int, ...]) -> nn.Module:
        self.output_shape(tuple(input_shape))
        return self.net
