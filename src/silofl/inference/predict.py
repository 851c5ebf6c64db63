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
    when the data carry the target or class folders); returns a summary (rows, accuracy when labelled, model
    used)."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise ConfigError(f"{out} exists; choose another --out or pass --overwrite")
    loaded = load_pipeline(path, client, model)
    if _segments(loaded):
        return predict_masks(loaded, data, out, overwrite)
    prep = loaded.preprocessing
    if getattr(getattr(prep, "schema", None), "task", "") == "survival":
        return predict_risk(loaded, data, out)
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


def predict_risk(loaded, data: str | Path, out: Path) -> dict:
    """A survival model on new rows: one ``risk`` per row (:func:`silofl.training.survival.risk_score`, log
    of the summed bin hazards — higher, the event sooner), with ``time`` and ``event`` when the file has them,
    and then the C-index of the risks."""
    from silofl.training.survival import c_index

    x, y, ids = loaded.preprocessing.read(data)
    with torch.no_grad():  # the pipeline returns risk_score of the model's outputs for a survival model
        risk = torch.cat([loaded.pipeline(x[i : i + 4096]) for i in range(0, len(x), 4096)]).numpy()
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "risk", *(["time", "event"] if y is not None else [])])
        for i in range(len(risk)):
            w.writerow([ids[i], f"{risk[i]:.6g}", *([f"{y[i, 0]:g}", int(y[i, 1])] if y is not None else [])])
    ci = c_index(risk, y[:, 0], y[:, 1]) if y is not None else None
    return {
        "rows": int(len(risk)),
        "accuracy": None,
        "c_index": ci if ci is None or np.isfinite(ci) else None,
        "model": f"client{loaded.client}_{loaded.role}",
        "architecture": loaded.spec.name,
        "out": str(out),
        "nan_rows": int(np.isnan(risk).sum()),
    }


def _segments(loaded) -> bool:
    """Whether the model returns per-pixel class scores (a segmentation model)."""
    from silofl.inference.export import example_input

    with torch.no_grad():
        return loaded.pipeline(example_input(loaded, 1)).dim() == 4


def predict_masks(loaded, data: str | Path, out: str | Path, overwrite: bool = False) -> dict:
    """A segmentation model on new images: ``data`` is a site folder (``images/``, and ``masks/`` to score
    against), a folder of images or an npz with ``x`` (and ``y``); ``out`` a folder receiving one PNG mask per
    input (``<name>.png``: 0 background, 255 foreground — class index for more classes), each at its input's
    size (the model's masks resized back, nearest). Written to a scratch folder first: nothing is left half
    written."""
    import shutil
    import tempfile

    import torch.nn.functional as F
    from PIL import Image

    from silofl.data.segmentation import read_inputs
    from silofl.training.segmentation import segmentation_metrics

    out = Path(out)
    if out.exists() and not overwrite:
        raise ConfigError(f"{out} exists; choose another --out or pass --overwrite")
    prep = loaded.preprocessing
    images, masks, names = read_inputs(data)
    channels = loaded.spec.input_shape[0]
    size = int(prep.image_size)
    preds, scored = [], []
    with torch.no_grad():
        for i, img in enumerate(images):
            if img.shape[-1] != channels:
                raise ConfigError(f"{names[i]}: {img.shape[-1]} channel(s); the model reads {channels}")
            x = torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1)))[None]
            x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
            probs = loaded.pipeline(x)
            logits = F.interpolate(probs, size=img.shape[:2], mode="nearest")
            preds.append(logits.argmax(1)[0].numpy())
            if masks is not None:
                scored.append(segmentation_metrics(logits, torch.from_numpy(masks[i])[None]))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        scale = 255 if len(prep.classes) == 2 else 1
        for name, m in zip(names, preds, strict=True):
            Image.fromarray((m * scale).astype(np.uint8)).save(tmp / f"{name}.png")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    def mean(key: str) -> float | None:
        return float(np.mean([s[key] for s in scored])) if scored else None

    return {
        "rows": len(preds),
        "accuracy": mean("acc"),  # pixel accuracy, image by image
        "dice": mean("dice"),
        "iou": mean("iou"),
        "model": f"client{loaded.client}_{loaded.role}",
        "architecture": loaded.spec.name,
        "out": str(out),
        "nan_rows": 0,
        "masks": True,
    }
