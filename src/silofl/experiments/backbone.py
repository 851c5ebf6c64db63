"""``silofl backbone train``: a feature backbone trained on data the user declares public.

``--public validation`` trains on the validation rows of a run's split — the ``validation_size`` training
examples
that no client holds, which silofl already treats as public (:func:`silofl.runner.data.validation_split`) —
and
records the split's settings: a run that uses the backbone must use the same split (checked), so that none of
the
rows it was trained on belongs to a client. ``--public DATASET`` trains on every training example of another
data
set (e.g. MNIST for Fashion-MNIST), of the same input shape. Either way the declaration that the data is
public is
the user's; it is written into ``card.json`` and ``MODEL_CARD.md`` and repeated in every model card built on
the
backbone. Training is plain (no DP): the data is public.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from silofl.core.errors import ConfigError
from silofl.features.backbone import CARD_FORMAT, PenultimateModule

SPLIT_KEYS = (
    "dataset",
    "clients",
    "samples_per_client",
    "partition",
    "p_major",
    "dirichlet_alpha",
    "split_seed",
    "validation_size",
)


def public_rows(dataset: str, public: str, data_dir: str | None, split: dict[str, Any]):
    """(x, y, classes, a record of what the rows are) for ``--public validation|DATASET``."""
    from silofl.data import load_dataset

    if public == "validation":
        from silofl.runner.config import RunConfig
        from silofl.runner.data import prepare_data

        if split.get("split_seed") is None:
            raise ConfigError(
                "--public validation needs --split-seed S: the runs that use this backbone must use the "
                "same split (so that no client holds a row it was trained on)"
            )
        cfg = RunConfig.from_dict(
            {
                "method": "regular",
                "privacy": "off",
                "dataset": dataset,
                "data_dir": data_dir,
                "eval_split": "validation",
                "out": "unused",
                **{k: v for k, v in split.items() if v is not None and k != "dataset"},
            }
        ).resolve()
        cfg, sp = prepare_data(cfg, torch.device("cpu"), features=False)
        x, y = sp.test
        rec = {
            "kind": "validation",
            "dataset": dataset,
            "rows": len(y),
            "split": {k: getattr(cfg, k) for k in SPLIT_KEYS},
            "description": f"{len(y)} {dataset} training examples that no client of the recorded split holds "
            f"(the "
            "validation split, declared public)",
        }
        return x, y, sp.num_classes, rec
    from silofl.runner.config import DATASETS

    if public not in DATASETS or public in ("table", "bags"):
        raise ConfigError(
            f"--public takes 'validation' or an image data set "
            f"({', '.join(d for d in DATASETS if d not in ('table', 'bags'))}), got {public!r}"
        )
    ds = load_dataset(public, data_dir if public == dataset else None)
    target = load_dataset(dataset, data_dir)
    if ds.input_shape != target.input_shape:
        raise ConfigError(
            f"public data set {public} has inputs {ds.input_shape}, {dataset} has {target.input_shape}: a "
            "backbone must take the data set's inputs"
        )
    rec = {
        "kind": "dataset",
        "dataset": public,
        "for_dataset": dataset,
        "rows": len(ds.y_train),
        "source": ds.source,
        "description": f"all {len(ds.y_train)} training examples of {public} ({ds.source}), declared public",
    }
    return ds.x_train, ds.y_train, ds.num_classes, rec


def train_backbone(
    dataset: str,
    public: str,
    out: str | Path,
    model: str = "cnn1",
    epochs: int = 5,
    lr: float = 1e-3,
    batch_size: int = 128,
    data_dir: str | None = None,
    seed: int = 0,
    split: dict[str, Any] | None = None,
    threads: int | None = None,
) -> dict:
    """Train ``model`` on the declared-public rows and write ``out/`` (backbone.safetensors/.json, card.json,
    MODEL_CARD.md); returns the card. Nothing is written when the input is bad."""
    from silofl.models import ModelSpec, build_model, save_model

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out} exists and is not empty; choose another --out")
    if epochs < 1 or batch_size < 1 or not (math.isfinite(lr) and lr > 0):
        raise ConfigError("--epochs and --batch-size must be at least 1 and --lr positive")
    if threads:
        torch.set_num_threads(threads)
    x, y, num_classes, rec = public_rows(dataset, public, data_dir, {"dataset": dataset, **(split or {})})
    if len(y) < 10:
        raise ConfigError(f"only {len(y)} public rows: too few to train a backbone")
    shape = tuple(x.shape[1:])
    net = build_model(model, shape, num_classes)
    PenultimateModule(
        build_model(model, shape, num_classes)
    )  # checks it has an output layer to take features before
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    perm = torch.randperm(len(y), generator=g)
    n_hold = max(1, len(y) // 10)
    hold, train = perm[:n_hold], perm[n_hold:]
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    t0 = time.perf_counter()
    for _ in range(epochs):
        net.train()
        order = train[torch.randperm(len(train), generator=g)]
        for i in range(0, len(order), batch_size):
            b = order[i : i + batch_size]
            opt.zero_grad()
            F.cross_entropy(net(x[b]), y[b]).backward()
            opt.step()
    net.eval()
    with torch.no_grad():
        acc = float((net(x[hold]).argmax(1) == y[hold]).float().mean())
        feat_shape = list(PenultimateModule(net)(x[:1]).shape[1:])
    spec = ModelSpec(model, shape, num_classes)
    card = {
        "format": CARD_FORMAT,
        "architecture": model,
        "input_shape": list(shape),
        "num_classes": num_classes,
        "feature_shape": feat_shape,
        "features": "the input of the last Linear layer (penultimate layer)",
        "public_data": {
            "declared_public": True,
            **rec,
            "declaration": "the user of `silofl backbone train` declared these rows public; the "
            "backbone costs the sites no budget only if that is true",
        },
        "training": {
            "epochs": epochs,
            "lr": lr,
            "batch_size": batch_size,
            "optimizer": "Adam",
            "dp": False,
            "seed": seed,
            "seconds": round(time.perf_counter() - t0, 2),
            "held_out_public_accuracy": round(acc, 4),
            "held_out_rows": int(n_hold),
        },
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_model(net, spec, tmp / "backbone")
    (tmp / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    (tmp / "MODEL_CARD.md").write_text(
        f"# Feature backbone: {model}\n\n- input {list(shape)} → features {feat_shape} (penultimate layer)\n"
        f"- trained on: {rec['description']}\n- **declared public** by its owner: "
        f"{card['public_data']['declaration']}\n"
        f"- training: {epochs} epochs, Adam lr {lr:g}, no DP; held-out public accuracy {acc:.4f}\n"
    )
    if out.exists():
        out.rmdir()
    tmp.rename(out)
    return card
