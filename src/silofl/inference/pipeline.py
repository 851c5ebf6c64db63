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
from silofl.site.combine import Combined, load_combined  # noqa: F401 - re-exported: a site's combined model

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
