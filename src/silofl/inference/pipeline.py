"""A site's model with its preprocessing, as one module: raw inputs → class probabilities."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from silofl.core.errors import ConfigError
from silofl.data.preprocessing import Preprocessing, preprocessing_from_dict
from silofl.models import ModelSpec, load_model

SHARED_ROLES = ("proxy", "global")  # the model that left the site, by method


class Pipeline(nn.Module):
    """``softmax(model(features(preprocess(x))))`` (``features``: the run's feature stage, identity without
    one); ``risk``: a survival model's risk score per row instead
    (:func:`silofl.training.survival.risk_score`, shape (batch,))."""

    def __init__(
        self, preprocess: nn.Module, model: nn.Module, features: nn.Module | None = None, risk: bool = False
    ):
        super().__init__()
        self.preprocess, self.model = preprocess, model
        self.features = features if features is not None else nn.Identity()
        self.risk = risk

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.model(self.features(self.preprocess(x)))
        if self.risk:
            return out[:, 0] + torch.logsumexp(out[:, 1:], dim=1)  # = silofl.training.survival.risk_score
        return torch.softmax(out, dim=1)


class Combined(nn.Module):
    """A site's combined model (:mod:`silofl.site.combine`): ``weight · concat(log_softmax(part(x))) +
    bias``."""

    def __init__(self, parts: list[nn.Module], roles: list[str], weight: torch.Tensor, bias: torch.Tensor):
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.roles = roles
        self.combiner = nn.Linear(weight.shape[1], weight.shape[0])
        with torch.no_grad():
            self.combiner.weight.copy_(weight)
            self.combiner.bias.copy_(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.combiner(torch.cat([torch.log_softmax(m(x), dim=1) for m in self.parts], 1))


def load_combined(d: Path, client: int) -> tuple[Combined, ModelSpec]:
    """Client ``client``'s combined model from ``d`` (the combiner's safetensors + JSON and its parts' files),
    and
    the spec of its first part (input shape and classes)."""
    from safetensors.torch import load_file

    from silofl.site.combine import COMBINER_FORMAT

    p = d / f"client{client}_combined"
    try:
        meta = json.loads(p.with_suffix(".json").read_text())
        tensors = load_file(str(p.with_suffix(".safetensors")))
    except (OSError, ValueError, RuntimeError) as e:
        raise ConfigError(f"cannot read the combiner {p}: {e}") from None
    roles = meta.get("parts") if isinstance(meta, dict) else None
    if (
        not isinstance(meta, dict)
        or meta.get("format") != COMBINER_FORMAT
        or not isinstance(roles, list)
        or not roles
        or not all(isinstance(r, str) and r.isidentifier() for r in roles)
    ):
        raise ConfigError(f"{p.with_suffix('.json')} is not a silofl combiner ({COMBINER_FORMAT})")
    loaded = [load_model(d / f"client{client}_{r}") for r in roles]
    specs = [s for _, s in loaded]
    c = specs[0].num_classes
    w, b = tensors.get("weight"), tensors.get("bias")
    if (
        any(tuple(s.input_shape) != tuple(specs[0].input_shape) or s.num_classes != c for s in specs)
        or w is None
        or b is None
        or tuple(w.shape) != (c, c * len(roles))
        or tuple(b.shape) != (c,)
        or not bool(torch.isfinite(w).all() and torch.isfinite(b).all())
    ):
        raise ConfigError(f"the combiner {p} does not fit its parts {roles}")
    return Combined([m for m, _ in loaded], roles, w.float(), b.float()), specs[0]


@dataclass
class LoadedModel:
    """What ``silofl predict`` / ``export`` need of one client's model."""

    pipeline: Pipeline
    spec: ModelSpec
    preprocessing: Preprocessing
    role: str  # the file's role: private | proxy | global
    client: int
    models_dir: Path
    run_dir: Path | None  # the run folder, when the models sit in one (config.yaml, summary.json)
    features: dict | None = None  # the feature stage's record (client<k>_features.json), when the run had one


def models_dir(path: str | Path, client: int) -> Path:
    """The folder holding client ``client``'s model files: ``PATH/models`` (a run folder) or ``PATH``
    itself."""
    p = Path(path)
    if not p.is_dir():
        raise ConfigError(f"{p} is not a folder (give a run folder or a site folder with models)")
    for d in (p / "models", p):
        if any(d.glob(f"client{client}_*.safetensors")):
            return d
    found = sorted(
        {
            f.name.split("_")[0]
            for f in [*p.glob("client*_*.safetensors"), *(p / "models").glob("client*_*.safetensors")]
        }
    )
    hint = f" (models found for {', '.join(found)})" if found else " (no client*_*.safetensors models there)"
    raise ConfigError(f"{p} has no model of client {client}{hint}")


def pick_role(d: Path, client: int, model: str) -> str:
    """The file role for ``--model private|shared`` (shared: the proxy or the global model, whichever the
    method had)."""
    roles = sorted(f.stem.split("_", 1)[1] for f in d.glob(f"client{client}_*.safetensors"))
    if model == "private":
        if "private" not in roles:
            raise ConfigError(
                f"client {client} has no private model here (models: {', '.join(roles)}); use --model shared"
            )
        return "private"
    if model == "shared":
        shared = [r for r in SHARED_ROLES if r in roles]
        if not shared:
            raise ConfigError(
                f"client {client} has no shared (proxy or global) model here (models: {', '.join(roles)}); "
                "use --model private"
            )
        return shared[0]
    if model == "combined":
        if "combined" not in roles:
            raise ConfigError(
                f"client {client} has no combined model here (models: {', '.join(roles)}); run with "
                "--combine weights|stack"
            )
        return "combined"
    raise ConfigError(f"--model takes private, shared or combined, got {model!r}")


def load_pipeline(path: str | Path, client: int, model: str = "private") -> LoadedModel:
    """Client ``client``'s model (``private`` or ``shared``) and its site's preprocessing from a run or
    site folder."""
    d = models_dir(path, client)
    role = pick_role(d, client, model)
    prep_file = d / f"client{client}_preprocessing.json"
    if not prep_file.is_file():
        raise ConfigError(
            f"{prep_file} not found: this run's data set has no recorded preprocessing (predict and export "
            "work for runs on tables, --dataset table, and on image folders, --dataset folder)"
        )
    try:
        prep = preprocessing_from_dict(json.loads(prep_file.read_text()))
    except ValueError as e:
        raise ConfigError(f"{prep_file} is not valid JSON: {e}") from None
    net, spec = load_combined(d, client) if role == "combined" else load_model(d / f"client{client}_{role}")
    rec, feats, shape = _features(d, client, tuple(prep.input_shape))
    if tuple(spec.input_shape) != shape:
        raise ConfigError(
            f"client{client}_{role} expects inputs {tuple(spec.input_shape)} but its preprocessing"
            f"{' and features' if rec else ''} give {shape}"
        )
    survival = getattr(getattr(prep, "schema", None), "task", "") == "survival"
    pipe = Pipeline(prep.module(), net, feats, risk=survival).eval()
    run_dir = d.parent if d.name == "models" and (d.parent / "config.yaml").is_file() else None
    return LoadedModel(pipe, spec, prep, role, client, d, run_dir, rec)


def _features(
    d: Path, client: int, input_shape: tuple[int, ...]
) -> tuple[dict | None, nn.Module | None, tuple[int, ...]]:
    """(the feature record, the stage as a module, the shape the model reads) from
    ``client<k>_features.json``."""
    f = d / f"client{client}_features.json"
    if not f.is_file():
        return None, None, input_shape
    from silofl.features import stage_from_record

    try:
        rec = json.loads(f.read_text())
    except (ValueError, OSError) as e:
        raise ConfigError(f"{f} is not valid JSON: {e}") from None
    stage = stage_from_record(rec)
    return rec, stage.module(input_shape), tuple(stage.output_shape(input_shape))
