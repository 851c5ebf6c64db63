"""Re-evaluate a finished run from its files alone (config.yaml + models/)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from silofl.core.errors import ConfigError
from silofl.models import load_model
from silofl.runner.data import prepare_data
from silofl.runner.folder import read_run_config
from silofl.training.evaluation import scores


def evaluate_run(
    run_dir: str | Path, data_dir: str | None = None, eval_split: str | None = None
) -> list[dict]:
    """Each saved model's accuracy on the run's own test set, next to the figure summary.json recorded, and
    its other metrics (``metrics``: AUROC, balanced accuracy, F1, ECE of the same pass). ``eval_split``: score
    on this split instead of the one the run evaluated on (e.g. ``test`` for a tuning trial that was scored on
    the validation split)."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"{run_dir} is not a run folder (no config.yaml)")
    cfg = read_run_config(run_dir)  # config.yaml with plan.json's split seed and sizes: the run's own split
    if data_dir:
        cfg = cfg.replace(data_dir=data_dir)
    if eval_split:
        cfg = cfg.replace(eval_split=eval_split)
    _, split = prepare_data(
        cfg.resolve(), torch.device("cpu")
    )  # the run's own test set (e.g. external sites)
    x, y = split.test
    recorded = {}
    rows: dict[str, dict] = {}  # model stem → its site's final row of summary.json, for every metric recorded
    if (run_dir / "summary.json").is_file():
        for r in json.loads((run_dir / "summary.json").read_text())["final"]["per_client"]:
            for role in ("private", "proxy", "global", "combined"):
                rows[f"client{r['client']}_{role}"] = {"role": role, "row": r}
                recorded[f"client{r['client']}_{role}"] = r.get(f"{role}_acc")
                if r.get(f"{role}_c_index") is not None:  # a survival run: its C-index (no accuracy)
                    recorded[f"client{r['client']}_{role}"] = r[f"{role}_c_index"]
    specs = sorted((run_dir / "models").glob("*.json"))
    if not specs:
        raise ConfigError(f"no models found under {run_dir / 'models'}")
    results = []
    for spec_file in specs:
        if not spec_file.stem.startswith("client") or spec_file.stem.endswith(
            ("_preprocessing", "_features")
        ):
            continue
        k = int(spec_file.stem.split("_")[0].removeprefix("client") or 0)
        if spec_file.stem.endswith(
            "_combined"
        ):  # the site's combination (silofl.site.combine) over its model files
            from silofl.inference.pipeline import load_combined

            model, spec = load_combined(spec_file.parent, k)
        else:
            model, spec = load_model(spec_file.with_suffix(""))
        if tuple(spec.input_shape) != split.input_shape:  # after the run's feature stage, the features' shape
            raise ConfigError(
                f"{spec_file.name} expects inputs {spec.input_shape}, the data has {split.input_shape}"
            )
        xk, yk = (
            split.external[k] if split.external and k < len(split.external) else (x, y)
        )  # the site's own view
        figures = scores(
            model, xk, yk
        )  # accuracy and the other metrics of one pass (silofl.training.metrics)
        own = rows.get(spec_file.stem)
        results.append(
            {
                "model": spec_file.stem,
                "architecture": spec.name,
                "accuracy": figures["acc"],
                "recorded": recorded.get(spec_file.stem),
                "metrics": figures,
                # summary.json's figure of the same model for each metric (None where it recorded none)
                "recorded_metrics": {
                    m: own["row"].get(f"{own['role']}_{'acc' if m == 'acc' else m}") if own else None
                    for m in figures
                },
            }
        )
    return results
