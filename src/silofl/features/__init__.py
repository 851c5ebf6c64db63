"""Features: a site-side stage between a site's inputs and its models (``--features none | scatter |
backbone:DIR``).

A stage is a fixed function of each example (:mod:`silofl.features.base`); stages are plug-ins
(:mod:`silofl.features.registry`: one module + ``@register``, or the ``silofl.features`` entry-point group).
Features are computed once per site, batched, and cached on disk by content (:mod:`silofl.features.cache`).
:func:`stage_from_config` builds the stage a run asks for; :func:`apply` computes (or reads back) features.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from silofl.features.base import FeatureStage
from silofl.features.cache import FeatureCache, cache_root, features
from silofl.features.registry import parse, register, stages

__all__ = [
    "FeatureStage",
    "FeatureCache",
    "apply",
    "make_stage",
    "register",
    "stage_from_config",
    "stages",
    "feature_names",
]


def feature_names() -> list[str]:
    """The registered stages as they are written on the command line (``backbone:DIR``)."""
    return [f"{n}:DIR" if getattr(c, "takes_argument", False) else n for n, c in stages().items()]


def make_stage(value: str, cfg: Any = None) -> FeatureStage:
    """The stage ``value`` names (``none``, ``scatter``, ``backbone:DIR``), with its parameters from
    ``cfg``."""
    name, arg = parse(value)
    cls: type[FeatureStage] = stages()[name]
    return cls.from_config(arg, cfg)


def stage_from_config(cfg: Any) -> FeatureStage:
    """The stage a run config asks for (``cfg.features``, ``cfg.scatter_j``, ``cfg.scatter_l``)."""
    return make_stage(getattr(cfg, "features", "none") or "none", cfg)


def apply(stage: FeatureStage, x: torch.Tensor, root: Path | None, label: str = "features") -> torch.Tensor:
    """Features of ``x`` by ``stage``, cached under ``root`` (None: not kept on disk)."""
    if stage.identity:
        return x
    cache = FeatureCache(root, stage, tuple(x.shape[1:])) if root is not None else None
    return features(stage, x, cache, label)


SETTINGS = ("features", "scatter_j", "scatter_l")


def record(stage: FeatureStage, input_shape: tuple[int, ...], cfg: Any = None) -> dict[str, Any]:
    """What a run folder and a model card say about the stage (``settings``: the config values that rebuild
    it)."""
    settings = {k: getattr(cfg, k) for k in SETTINGS if hasattr(cfg, k)} if cfg is not None else {}
    return {
        "features": stage.spec(),
        "description": stage.describe(),
        "input_shape": list(input_shape),
        "feature_shape": list(stage.output_shape(tuple(input_shape))),
        "privacy": stage.budget_note,
        "settings": settings,
    }


def stage_from_record(rec: dict[str, Any]) -> FeatureStage:
    """The stage a record (``client<k>_features.json``) describes, rebuilt from its settings."""
    from types import SimpleNamespace

    from silofl.core.errors import ConfigError

    settings = rec.get("settings") if isinstance(rec, dict) else None
    if not isinstance(settings, dict) or not isinstance(settings.get("features"), str):
        raise ConfigError("a features record without its settings: cannot rebuild the feature stage")
    stage = make_stage(
        settings["features"], SimpleNamespace(**{k: settings[k] for k in SETTINGS if k in settings})
    )
    if stage.spec() != rec.get("features"):
        raise ConfigError(
            f"the feature stage {settings['features']!r} here differs from the one the models were "
            f"trained on ({rec.get('features')} vs {stage.spec()})"
        )
    return stage


def value_bounds(rec: dict[str, Any]) -> tuple[float, float] | None:
    """Public bounds of every feature value for a stage's record (the run's ``split.features``), whatever the
    data — what PubSub-ML's ``dp-nn`` declares as its inputs' bounds on features — or None when the stage has
    none."""
    stage = stage_from_record(rec)
    fn = getattr(stage, "value_bounds", None)
    return fn(tuple(rec["input_shape"])) if fn is not None else None


__all__ += ["cache_root", "record", "stage_from_record", "value_bounds"]
