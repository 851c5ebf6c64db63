"""The published-model format: safetensors (tensors) + JSON metadata, never pickle.

Every model type is a set of named tensors plus metadata: who published it, the feature names in
input order, the task (classification with its class labels, or regression), the (ε, δ) it was
trained under and the mechanism that achieved it, the stream chunk it was trained on, when it was
created. ``to_bytes`` / ``from_bytes`` convert to and from one safetensors blob whose header holds
the metadata; ``from_bytes`` validates everything (size, schema, finite values, and the tensor
shapes against the feature list and classes for the model kinds it knows, and finite outputs, bounded
for a regressor, on probe inputs inside the model's public bounds) and raises
:class:`~silofl.core.errors.ModelRejected` with a clear reason.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from silofl.core.errors import ModelRejected

FORMAT = "silofl.pubsub.model/1"
TASKS = ("classification", "regression")
MAX_BYTES = 64 * 1024 * 1024
MAX_ABS = 1e9  # the largest magnitude of a regression output on the probe inputs
# (weights themselves are not bounded: diffprivlib's objective perturbation leaves the intercept unregularised
# and a few percent of its legitimate DP fits end with |intercept| ≈ 1e17, a saturated but finite classifier)
PROBE_ROWS = (
    64  # random probe inputs inside the model's public bounds (besides the box's corners lo, hi and middle)
)


def checksum(data: bytes) -> str:
    """The SHA-256 hex digest of the bytes."""
    return hashlib.sha256(data).hexdigest()


@dataclass
class PublishedModel:
    publisher: str
    kind: str  # e.g. "linear" (DP logistic / linear regression), "mlp" (DP-SGD network)
    features: list[str]
    task: str
    tensors: dict[str, torch.Tensor]
    epsilon: float
    delta: float
    mechanism: dict = field(default_factory=dict)  # how (ε, δ) was met, e.g. {"name": "dp-sgd", "sigma": ...}
    classes: list | None = None
    chunk: int | None = None  # stream chunk index
    created_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    def meta(self) -> dict:
        """The metadata that travels with the tensors."""
        m = asdict(self)
        del m["tensors"]
        return {"format": FORMAT, **m}

    def to_bytes(self) -> bytes:
        """The validated model as one safetensors blob."""
        validate(self)
        tensors = {k: v.detach().cpu().contiguous() for k, v in self.tensors.items()}
        return st_save(tensors, metadata={"silofl.pubsub": json.dumps(self.meta())})

    @classmethod
    def from_bytes(cls, data: bytes, max_bytes: int = MAX_BYTES) -> PublishedModel:
        if len(data) > max_bytes:
            raise ModelRejected(f"model of {len(data)} bytes exceeds the size limit of {max_bytes}")
        try:
            tensors = st_load(data)
            n = int.from_bytes(data[:8], "little")
            meta = json.loads(json.loads(data[8 : 8 + n])["__metadata__"]["silofl.pubsub"])
        except Exception as e:  # noqa: BLE001 - any parse failure is a corrupt model
            raise ModelRejected(
                f"not a silofl published model (safetensors with pubsub metadata): {e}"
            ) from None
        if not isinstance(meta, dict) or meta.pop("format", None) != FORMAT:
            raise ModelRejected(f"model metadata is not in format {FORMAT}")
        known = {f for f in cls.__dataclass_fields__ if f != "tensors"}
        missing = sorted({"publisher", "kind", "features", "task", "epsilon", "delta"} - set(meta))
        if missing or set(meta) - known:
            raise ModelRejected(f"model metadata: missing {missing}, unexpected {sorted(set(meta) - known)}")
        model = cls(tensors=tensors, **meta)
        validate(model)
        return model


def _check_bounds(m: PublishedModel) -> None:
    """Optional public input bounds ``input_lo``/``input_hi`` [F] (inputs are clipped and scaled by them)."""
    lo, hi = m.tensors.get("input_lo"), m.tensors.get("input_hi")
    if (lo is None) != (hi is None):
        raise ModelRejected("input_lo and input_hi come together")
    if lo is not None:
        if lo.shape != (len(m.features),) or hi.shape != (len(m.features),):
            raise ModelRejected(
                f"input bounds have shapes {tuple(lo.shape)} / {tuple(hi.shape)} for "
                f"{len(m.features)} features"
            )
        if bool((hi < lo).any()):
            raise ModelRejected("input bounds have hi < lo")


def _core(m: PublishedModel) -> dict[str, torch.Tensor]:
    return {k: v for k, v in m.tensors.items() if k not in ("input_lo", "input_hi")}


def _check_linear(m: PublishedModel) -> None:
    """Linear / logistic model: ``coef`` [outputs, F], ``intercept`` [outputs]."""
    coef, icpt = m.tensors.get("coef"), m.tensors.get("intercept")
    if coef is None or icpt is None or coef.dim() != 2 or icpt.dim() != 1:
        raise ModelRejected("a linear model needs tensors coef [outputs, features] and intercept [outputs]")
    _check_io(m, coef.shape[1], coef.shape[0], binary_single_output=True)
    if icpt.shape[0] != coef.shape[0]:
        raise ModelRejected(f"intercept has {icpt.shape[0]} outputs, coef {coef.shape[0]}")


def _check_mlp(m: PublishedModel) -> None:
    """The state dict of :class:`silofl.models.MLP`: ``hidden.{i}.weight/bias`` for i = 0…H−1, then
    ``out.weight/bias``, each layer's input the previous layer's output (safetensors keeps no order,
    so the layer order comes from the names)."""
    core = _core(m)
    try:
        hidden = sorted({int(k.split(".")[1]) for k in core if k.startswith("hidden.")})
    except (IndexError, ValueError):
        raise ModelRejected(
            f"an mlp model holds hidden.<i>.weight/bias and out.weight/bias, got {sorted(core)}"
        ) from None
    names = [f"hidden.{i}" for i in range(len(hidden))] + ["out"]
    expected = {f"{n}.{p}" for n in names for p in ("weight", "bias")}
    if hidden != list(range(len(hidden))) or set(core) != expected:
        raise ModelRejected(f"an mlp model holds {sorted(expected)}, got {sorted(core)}")
    width = None
    for n in names:
        w, b = m.tensors[f"{n}.weight"], m.tensors[f"{n}.bias"]
        if w.dim() != 2 or b.shape != (w.shape[0],) or (width is not None and w.shape[1] != width):
            raise ModelRejected(f"{n}: weight {tuple(w.shape)} and bias {tuple(b.shape)} do not chain")
        width = w.shape[0]
    _check_io(m, m.tensors[f"{names[0]}.weight"].shape[1], m.tensors["out.weight"].shape[0])


def _check_io(m: PublishedModel, n_in: int, n_out: int, binary_single_output: bool = False) -> None:
    if n_in != len(m.features):
        raise ModelRejected(f"the model takes {n_in} inputs but declares {len(m.features)} features")
    if m.task == "regression":
        if n_out != 1:
            raise ModelRejected(f"a regression model must have 1 output, has {n_out}")
    elif not (n_out == len(m.classes) or (binary_single_output and len(m.classes) == 2 and n_out == 1)):
        raise ModelRejected(f"the model has {n_out} outputs for {len(m.classes)} classes")


def _check_gnb(m: PublishedModel) -> None:
    """Gaussian naive Bayes: ``theta`` and ``var`` [classes, F], ``class_prior`` [classes]."""
    if m.task != "classification":
        raise ModelRejected("a naive Bayes model is a classifier")
    t, v, p = (m.tensors.get(k) for k in ("theta", "var", "class_prior"))
    if t is None or v is None or p is None or t.dim() != 2 or v.shape != t.shape or p.shape != (t.shape[0],):
        raise ModelRejected("a gnb model needs theta and var [classes, features] and class_prior [classes]")
    if bool((v <= 0).any()) or bool((p < 0).any()):
        raise ModelRejected("gnb variances must be positive and priors non-negative")
    _check_io(m, t.shape[1], t.shape[0])


def _check_forest(m: PublishedModel) -> None:
    """Decision trees ``tree{t}.left/right/feature/threshold`` [nodes] and ``tree{t}.value`` [nodes, classes]
    (class probabilities at each node); children −1 at leaves, every child index inside the tree."""
    if m.task != "classification":
        raise ModelRejected("a forest model is a classifier")
    core = _core(m)
    trees = sorted({k.split(".")[0] for k in core})
    if not trees or any(not t.startswith("tree") or not t[4:].isdigit() for t in trees):
        raise ModelRejected(f"a forest model holds tree<t>.<part> tensors, got {sorted(core)[:6]}")
    for t in trees:
        parts = {p: core.get(f"{t}.{p}") for p in ("left", "right", "feature", "threshold", "value")}
        if any(v is None for v in parts.values()) or len(core) != 5 * len(trees):
            raise ModelRejected(f"{t} needs left, right, feature, threshold and value")
        n = parts["left"].shape[0]
        if (
            any(parts[p].shape != (n,) for p in ("left", "right", "feature", "threshold"))
            or parts["value"].dim() != 2
            or parts["value"].shape[0] != n
        ):
            raise ModelRejected(f"{t}: node arrays disagree in length")
        for p in ("left", "right"):
            c = parts[p]
            if bool(((c != -1) & ((c <= torch.arange(n)) | (c >= n))).any()):
                raise ModelRejected(f"{t}: child indices must point forward inside the tree")
        internal = parts["left"] != -1
        if bool(((parts["feature"][internal] < 0) | (parts["feature"][internal] >= len(m.features))).any()):
            raise ModelRejected(f"{t}: a split uses a feature outside the declared {len(m.features)}")
        _check_io(m, len(m.features), parts["value"].shape[1])


KIND_CHECKS: dict[str, Callable[[PublishedModel], None]] = {
    "linear": _check_linear,
    "mlp": _check_mlp,
    "gnb": _check_gnb,
    "forest": _check_forest,
}


def validate(m: PublishedModel) -> None:
    """Raise ModelRejected unless the model's metadata and tensors are consistent and finite."""
    if not isinstance(m.publisher, str) or not m.publisher.strip():
        raise ModelRejected("publisher must be a non-empty name")
    if m.kind not in KIND_CHECKS:
        raise ModelRejected(f"unknown model kind {m.kind!r}; known kinds: {', '.join(KIND_CHECKS)}")
    if (
        not isinstance(m.features, list)
        or not m.features
        or not all(isinstance(f, str) and f for f in m.features)
        or len(set(m.features)) != len(m.features)
    ):
        raise ModelRejected("features must be a non-empty list of distinct names")
    if m.task not in TASKS:
        raise ModelRejected(f"unknown task {m.task!r}; choose one of: {', '.join(TASKS)}")
    if m.task == "classification":
        if (
            not isinstance(m.classes, list)
            or len(m.classes) < 2
            or len(set(map(str, m.classes))) != len(m.classes)
        ):
            raise ModelRejected("a classification model needs at least two distinct class labels")
    elif m.classes is not None:
        raise ModelRejected("a regression model has no class labels")
    if not isinstance(m.mechanism, dict):
        raise ModelRejected("mechanism must be a mapping")
    if is_nonprivate(m):  # a baseline (PubSub-ML*): says so, and claims no ε
        if m.epsilon != math.inf or m.delta != 0:
            raise ModelRejected("a non-private model has epsilon = inf and delta = 0")
    else:
        for name in ("epsilon", "delta"):
            v = getattr(m, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ModelRejected(f"{name} must be a non-negative finite number, got {v!r}")
        if m.epsilon <= 0 or m.delta >= 1:
            raise ModelRejected(f"need ε > 0 and δ < 1, got ε={m.epsilon}, δ={m.delta}")
    if m.chunk is not None and (isinstance(m.chunk, bool) or not isinstance(m.chunk, int) or m.chunk < 0):
        raise ModelRejected(f"chunk must be a non-negative integer, got {m.chunk!r}")
    if not m.tensors:
        raise ModelRejected("the model holds no tensors")
    for k, t in m.tensors.items():
        if not isinstance(t, torch.Tensor):
            raise ModelRejected(f"{k} is not a tensor")
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ModelRejected(f"{k} contains non-finite values")
    _check_bounds(m)
    KIND_CHECKS[m.kind](m)
    _check_probe(m)


def probe_inputs(m: PublishedModel) -> torch.Tensor:
    """Raw inputs a model is checked on: the corners lo and hi of its public input box, its middle and
    :data:`PROBE_ROWS` fixed pseudo-random points inside it (the unit box for a model without bounds)."""
    n = len(m.features)
    lo = m.tensors["input_lo"].double() if "input_lo" in m.tensors else torch.zeros(n, dtype=torch.float64)
    hi = m.tensors["input_hi"].double() if "input_hi" in m.tensors else torch.ones(n, dtype=torch.float64)
    u = torch.rand(PROBE_ROWS, n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    return torch.cat([lo[None], hi[None], ((lo + hi) / 2)[None], lo + u * (hi - lo)])


def _check_probe(m: PublishedModel) -> None:
    """The model's outputs on :func:`probe_inputs` must be finite and at most :data:`MAX_ABS` in magnitude."""
    with torch.no_grad():
        out = outputs(m, probe_inputs(m))
    if not bool(torch.isfinite(out).all()):
        raise ModelRejected("the model's outputs are not finite on probe inputs inside its public bounds")
    if float(out.abs().max()) > MAX_ABS:
        raise ModelRejected(
            f"the model's outputs reach {float(out.abs().max()):.3g} on probe inputs inside its public "
            f"bounds, above the bound {MAX_ABS:g}"
        )


def is_nonprivate(m: PublishedModel) -> bool:
    """Whether the model is a non-private baseline (it claims no ε)."""
    return str(m.mechanism.get("name", "")).startswith("none")


# ---------------------------------------------------------------------------------------------- inference
def scale_inputs(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Raw inputs clipped to public bounds and scaled to [0, 1] (a feature with lo = hi maps to 0): what DP
    models are trained on and what their inference applies."""
    return ((x - lo) / torch.where(hi > lo, hi - lo, torch.ones_like(hi))).clamp(0, 1)


def outputs(m: PublishedModel, x) -> torch.Tensor:
    """The model's outputs on raw inputs ``x`` [n, F] (in ``m.features`` order): class probabilities
    [n, classes] for a classifier, predictions [n, 1] for a regressor. Inputs are clipped and scaled
    by the model's public bounds when it has them."""
    x = torch.as_tensor(x, dtype=torch.float64)
    if x.dim() != 2 or x.shape[1] != len(m.features):
        raise ModelRejected(
            f"{m.publisher}'s model takes {len(m.features)} features, got input of shape {tuple(x.shape)}"
        )
    if "input_lo" in m.tensors:
        x = scale_inputs(x, m.tensors["input_lo"].double(), m.tensors["input_hi"].double())
    t = {k: v.double() if v.is_floating_point() else v for k, v in m.tensors.items()}
    if m.kind == "linear":
        z = x @ t["coef"].T + t["intercept"]
        if m.task == "regression":
            return z
        if z.shape[1] == 1:
            p = torch.sigmoid(z)
            return torch.cat([1 - p, p], 1)
        p = torch.sigmoid(z)  # one-vs-rest scores, normalised as scikit-learn does
        return p / p.sum(1, keepdim=True).clamp_min(1e-12)
    if m.kind == "mlp":
        h = x
        i = 0
        while f"hidden.{i}.weight" in t:
            h = torch.relu(h @ t[f"hidden.{i}.weight"].T + t[f"hidden.{i}.bias"])
            i += 1
        z = h @ t["out.weight"].T + t["out.bias"]
        return z if m.task == "regression" else torch.softmax(z, 1)
    if m.kind == "gnb":
        var = t["var"]
        ll = -0.5 * (torch.log(2 * math.pi * var).sum(1) + ((x[:, None, :] - t["theta"]) ** 2 / var).sum(2))
        return torch.softmax(ll + torch.log(t["class_prior"].clamp_min(1e-300)), 1)
    if m.kind == "forest":
        trees = sorted({k.split(".")[0] for k in _core(m)})
        total = 0
        for tr in trees:
            left, right, feat, thr = (t[f"{tr}.{p}"] for p in ("left", "right", "feature", "threshold"))
            node = torch.zeros(x.shape[0], dtype=torch.int64)
            for _ in range(left.shape[0]):
                leaf = left[node] == -1
                if bool(leaf.all()):
                    break
                go_left = x[torch.arange(x.shape[0]), feat[node].clamp_min(0)] <= thr[node]
                node = torch.where(leaf, node, torch.where(go_left, left[node], right[node]))
            total = total + t[f"{tr}.value"][node]
        return total / len(trees)
    raise ModelRejected(f"unknown model kind {m.kind!r}")
