"""``silofl predict``: a site's model on new rows (CSV/Parquet, checked against the schema) or images."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import torch

from silofl.core.errors import ConfigError
from silofl.inference.pipeline import load_pipeline


def predict(
    path: str | Path,
    client: int,
    data: str | Path,
    out: str | Path,
    model: str = "private",
    overwrite: bool = False,
) -> dict:
    """Write one row per input to ``out`` (CSV: ``id``, ``prediction``, ``p_<class>`` per class, and ``label``
    when the
    data carry the target or class folders); returns a summary (rows, accuracy when labelled, model used)."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise ConfigError(f"{out} exists; choose another --out or pass --overwrite")
    loaded = load_pipeline(path, client, model)
    prep = loaded.preprocessing
    x, y, ids = prep.read(data)
    with torch.no_grad():
        probs = torch.cat([loaded.pipeline(x[i : i + 4096]) for i in range(0, len(x), 4096)]).numpy()
    classes = prep.classes
    pred = probs.argmax(1)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "prediction", *(f"p_{c}" for c in classes), *(["label"] if y is not None else [])])
        for i in range(len(pred)):
            row = [ids[i], classes[pred[i]], *(f"{p:.6g}" for p in probs[i])]
            w.writerow(row + ([classes[int(y[i])]] if y is not None else []))
    acc = float(np.mean(pred == y)) if y is not None else None
    return {
        "rows": int(len(pred)),
        "accuracy": acc,
        "model": f"client{client}_{loaded.role}",
        "architecture": loaded.spec.name,
        "out": str(out),
        "nan_rows": int(np.isnan(probs).any(1).sum()),
    }
