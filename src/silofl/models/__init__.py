"""Model architectures of the ProxyFL papers (appendix), built for any 1- or 3-channel input size.

``build_model(name, input_shape, num_classes)`` builds one; :class:`ModelSpec` is the small JSON
that is saved next to each ``.safetensors`` file and rebuilds the same architecture.
Every layer with parameters is ``Linear``, ``Conv2d`` or ``GroupNorm`` (no BatchNorm), so DP-SGD's
fast per-example norms apply to all of them. VGG, ResNet-18 (GroupNorm) and DeepSet are in
:mod:`silofl.models.large`.

Every architecture is an entry of :data:`MODELS` (group ``silofl.models``); another package adds one with
:func:`register_model` in a module it names in that entry-point group.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from silofl.core.errors import ConfigError
from silofl.core.registry import Registry


class MLP(nn.Module):
    """784-200-200-10 for 28×28 inputs (input width follows the data)."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, hidden: tuple[int, ...] = (200, 200)):
        super().__init__()
        dims = [math.prod(input_shape), *hidden]
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.out = nn.Linear(dims[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        for layer in self.hidden:
            x = F.relu(layer(x))
        return self.out(x)


class MLP256(MLP):
    """784-256-10: one hidden layer (the client-level DP experiments' model)."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int):
        super().__init__(input_shape, num_classes, hidden=(256,))


class MLP64(MLP):
    """D-64-C: one hidden layer of 64 (PubSub-ML's federated baselines on the union feature space)."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int):
        super().__init__(input_shape, num_classes, hidden=(64,))


class TabularMLP(MLP):
    """D-64-64-C for table rows (D = the one-hot encoded width): every layer Linear, so DP-SGD takes the fast
    per-example norm path."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int):
        super().__init__(input_shape, num_classes, hidden=(64, 64))


class LogisticRegression(nn.Module):
    """One Linear layer (multinomial logistic regression on the flattened input): the DP-SGD-friendly
    baseline."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int):
        super().__init__()
        self.out = nn.Linear(math.prod(input_shape), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(x.flatten(1))


class _ConvNet(nn.Module):
    """conv → relu → maxpool(2) blocks, then fully connected layers; fc input size from a dry run."""

    def __init__(self, input_shape, num_classes, channels, kernel, fc):
        super().__init__()
        if len(input_shape) != 3:
            raise ConfigError(
                f"{type(self).__name__} is a convolutional model for images (C×H×W); for inputs of shape "
                f"{tuple(input_shape)} (table rows) use tabmlp, logreg, mlp or mlp256"
            )
        c_in = input_shape[0]
        self.convs = nn.ModuleList()
        for c_out in channels:
            self.convs.append(nn.Conv2d(c_in, c_out, kernel))
            c_in = c_out
        with torch.no_grad():
            try:
                n_flat = self._features(torch.zeros(1, *input_shape)).shape[1]
            except RuntimeError:
                n_flat = 0
        if n_flat == 0:
            raise ConfigError(
                f"{type(self).__name__} needs larger inputs than {tuple(input_shape)} "
                f"({len(channels)} conv{kernel}×{kernel} + pool blocks)"
            )
        dims = [n_flat, *fc]
        self.fcs = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.out = nn.Linear(dims[-1], num_classes)

    def _features(self, x):
        for conv in self.convs:
            x = F.max_pool2d(F.relu(conv(x)), 2)
        return x.flatten(1)

    def forward(self, x):
        x = self._features(x)
        for fc in self.fcs:
            x = F.relu(fc(x))
        return self.out(x)


class LeNet5(_ConvNet):
    def __init__(self, input_shape, num_classes):
        super().__init__(input_shape, num_classes, channels=(6, 16), kernel=5, fc=(120, 84))


class CNN1(_ConvNet):
    def __init__(self, input_shape, num_classes):
        super().__init__(input_shape, num_classes, channels=(6, 16), kernel=3, fc=(64,))


class CNN2(_ConvNet):
    def __init__(self, input_shape, num_classes):
        super().__init__(input_shape, num_classes, channels=(128, 128), kernel=3, fc=())


class ScatterCNN(nn.Module):
    """Tramèr & Boneh's (ICLR 2021) ScatterNet+CNN head for MNIST-like data: over C×H×W feature maps (81×7×7
    scattering channels, already GroupNorm-ed by the feature stage), conv3×3/2 → 16, tanh, conv3×3 → 32, tanh,
    then Linear → 32, tanh, Linear → classes. Conv2d and Linear only: DP-SGD's fast per-example norms
    apply."""

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        channels: tuple[int, int] = (16, 32),
        hidden: int = 32,
        groups: int = 0,
    ):
        super().__init__()
        if len(input_shape) != 3:
            raise ConfigError(
                f"scattercnn is a convolutional head over feature maps (C×H×W); for inputs of shape "
                f"{tuple(input_shape)} use linear, logreg or mlp"
            )
        # groups > 0: GroupNorm(groups) after each convolution, before its tanh (scattercnn-gn); 0: none
        self.conv1 = nn.Conv2d(input_shape[0], channels[0], 3, stride=2, padding=1)
        self.norm1 = nn.GroupNorm(groups, channels[0]) if groups else None
        self.conv2 = nn.Conv2d(channels[0], channels[1], 3, stride=1, padding=1)
        self.norm2 = nn.GroupNorm(groups, channels[1]) if groups else None
        with torch.no_grad():
            n_flat = self._features(torch.zeros(1, *input_shape)).shape[1]
        self.fc = nn.Linear(n_flat, hidden)
        self.out = nn.Linear(hidden, num_classes)

    def _features(self, x: torch.Tensor) -> torch.Tensor:
        for conv, norm in ((self.conv1, self.norm1), (self.conv2, self.norm2)):
            x = conv(x)
            x = torch.tanh(norm(x) if norm is not None else x)
        return x.flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.fc(self._features(x))))


class ScatterCNNGN(ScatterCNN):
    """scattercnn with GroupNorm (4 groups) after each convolution, before its tanh: the normalisation layers
    FedBN keeps at each site under DP (their affine parameters; :mod:`silofl.fl.methods.fedbn`). GroupNorm
    normalises each example over its own channels, so per-example clipping stays defined and its parameters
    take DP-SGD's fast per-example norm path with the Conv2d and Linear layers."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int):
        super().__init__(input_shape, num_classes, groups=4)


from silofl.models.gn import CNNGN  # noqa: E402
from silofl.models.large import VGG, DeepSet, ResNet18  # noqa: E402
from silofl.models.unet import UNet  # noqa: E402

MODELS: Registry[Callable[..., nn.Module]] = Registry("model", "silofl.models")
"""Every architecture by name. An entry's object builds it, ``build(input_shape, num_classes) -> nn.Module``
(a class or a function); its metadata (:data:`MODEL_META`) says what inputs it takes. A saved model's
:class:`ModelSpec` names its registered architecture, so a plug-in's model loads back while its package is
installed."""

MODEL_META = {
    "inputs": "'images' (C×H×W), 'rows' (a flat vector: table rows, features), 'bags' (B×M×(d+1)) or 'any'",
    "head": "a head for a feature stage's output (silofl.features)",
    "description": "one line for help texts and docs",
}


def register_model(
    name: str,
    build: Callable[..., nn.Module] | None = None,
    *,
    inputs: str = "any",
    head: bool = False,
    description: str = "",
) -> Any:
    """Register an architecture under ``name`` (decorator or direct); ``build(input_shape, num_classes)`` must
    return a fresh module (every layer with parameters Linear, Conv2d or GroupNorm keeps DP-SGD's fast
    per-example norms)."""
    if inputs not in ("images", "rows", "bags", "any"):
        raise ValueError(f"inputs must be images, rows, bags or any, got {inputs!r}")
    if not description and build is not None:
        description = (build.__doc__ or "").strip().split("\n")[0]
    meta = {"inputs": inputs, "head": head, "description": description}
    return MODELS.register(name, build, **meta) if build is not None else MODELS.register(name, **meta)


for _name, _cls, _inputs in (
    ("mlp", MLP, "any"),
    ("mlp256", MLP256, "any"),
    ("tabmlp", TabularMLP, "any"),
    ("logreg", LogisticRegression, "any"),
    ("lenet5", LeNet5, "images"),
    ("cnn1", CNN1, "images"),
    ("cnn2", CNN2, "images"),
    ("vgg", VGG, "images"),
    ("resnet18", ResNet18, "images"),
    ("deepset", DeepSet, "bags"),
    ("mlp64", MLP64, "any"),
):
    register_model(_name, _cls, inputs=_inputs)
# heads for feature stages (silofl.features): a linear model over the flattened features (= logreg), and
# Tramèr & Boneh's small CNN over scattering channels
register_model("linear", LogisticRegression, head=True, description="a linear head over flattened features")
register_model("scattercnn", ScatterCNN, inputs="images", head=True)
# segmentation (per-pixel logits for mask targets; silofl.models.unet)
register_model(
    "unet",
    UNet,
    inputs="images",
    description="a small GroupNorm UNet for 2-D segmentation (masks as targets)",
)
# a small CNN with GroupNorm (FedBN keeps its normalisation layers at each site: silofl.fl.methods.fedbn)
register_model("cnn-gn", CNNGN, inputs="images")
# scattercnn with GroupNorm after each convolution: FedBN's head on features (its norms stay at each site)
register_model("scattercnn-gn", ScatterCNNGN, inputs="images", head=True)


def model_names() -> tuple[str, ...]:
    """Every registered architecture, built-ins first (the CLI's choices)."""
    return MODELS.names()


def __getattr__(name: str) -> Any:
    # MODEL_NAMES and REGISTRY, as they were before the registry, but reading it now (plug-ins included)
    if name == "MODEL_NAMES":
        return MODELS.names()
    if name == "REGISTRY":
        return {n: e.obj for n, e in MODELS.entries().items()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    input_shape: tuple[int, ...]
    num_classes: int

    def build(self) -> nn.Module:
        """A fresh model of this architecture."""
        return build_model(self.name, self.input_shape, self.num_classes)

    def to_json(self) -> str:
        """The spec as JSON (saved next to each model's weights)."""
        return json.dumps({**asdict(self), "input_shape": list(self.input_shape), "format": "silofl.model/1"})

    @classmethod
    def from_json(cls, text: str) -> ModelSpec:
        try:
            d = json.loads(text)
            return cls(d["name"], tuple(int(s) for s in d["input_shape"]), int(d["num_classes"]))
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"invalid model spec: {e}") from None


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """A fresh model by name for the input shape and number of classes."""
    key = name.lower() if isinstance(name, str) and name.lower() in MODELS else name
    return MODELS.get(key)(tuple(input_shape), num_classes)


def save_model(model: nn.Module, spec: ModelSpec, path: str | Path) -> None:
    """Write ``path.safetensors`` and ``path.json`` (the spec that rebuilds it)."""
    from safetensors.torch import save_file

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(p.with_suffix(".safetensors")), metadata={"spec": spec.to_json()})
    p.with_suffix(".json").write_text(spec.to_json() + "\n")


def load_model(path: str | Path) -> tuple[nn.Module, ModelSpec]:
    """(model, spec) from ``path.safetensors`` and ``path.json``."""
    from safetensors.torch import load_file

    p = Path(path)
    spec_file = p.with_suffix(".json")
    if not spec_file.is_file():
        raise ConfigError(f"model spec {spec_file} not found")
    spec = ModelSpec.from_json(spec_file.read_text())
    model = spec.build()
    try:
        model.load_state_dict(load_file(str(p.with_suffix(".safetensors"))))
    except (RuntimeError, OSError) as e:
        raise ConfigError(f"cannot load {p.with_suffix('.safetensors')} into {spec.name}: {e}") from None
    return model, spec
