"""Customization (Algorithm 2): missing features come from public defaults, top-m keeps the best
models on the customize part, pure-noise publishers are not selected, class labels must match."""

import numpy as np
import pytest
import torch
from sklearn.datasets import load_breast_cancer

from silofl.core.errors import ConfigError
from silofl.pubsub.customize import LocalData, align, customize, model_outputs, split
from silofl.pubsub.dp_models import Bounds, train
from silofl.pubsub.model import PublishedModel

CLASSES = ["malignant", "benign"]


@pytest.fixture(scope="module")
def world():
    d = load_breast_cancer()
    x, y = d.data, d.target
    feats = [f"f{i}" for i in range(30)]
    b = Bounds(x.min(0), x.max(0))
    parts = np.array_split(np.random.default_rng(0).permutation(len(x)), 4)
    models = []
    for k, cols in enumerate([range(0, 12), range(10, 22), range(18, 30)]):
        cols = list(cols)
        i = parts[k]
        models.append(
            train(
                "dp-logreg",
                x[i][:, cols],
                y[i],
                publisher=f"site{k}",
                features=[feats[c] for c in cols],
                task="classification",
                bounds=Bounds(b.lo[cols], b.hi[cols]),
                epsilon=3.0,
                delta=1e-5,
                classes=CLASSES,
                seed=k,
            )
        )
    noise = train(
        "dp-logreg",
        x[parts[0]][:, :12],
        np.random.default_rng(1).integers(0, 2, len(parts[0])),
        publisher="noisy",
        features=feats[:12],
        task="classification",
        bounds=Bounds(b.lo[:12], b.hi[:12]),
        epsilon=3.0,
        delta=1e-5,
        classes=CLASSES,
        nonprivate=True,
    )
    with torch.no_grad():
        noise.tensors["coef"].normal_(0, 50)  # a publisher of pure noise
    defaults = {f: float(x[:, i].mean()) for i, f in enumerate(feats)}
    sub = list(range(0, 6)) + list(range(20, 26))
    local = LocalData(x[parts[3]][:, sub], y[parts[3]], [feats[c] for c in sub], "classification", CLASSES)
    return models, noise, defaults, local


def test_missing_features_are_filled_with_public_defaults(world):
    models, _, defaults, local = world
    m = models[1]  # features f10…f21; the subscriber has f0…f5 and f20…f25
    cols, fill = align(m, local.features, defaults)
    assert [c is not None for c in cols] == [f in local.features for f in m.features]
    assert fill[0] == defaults["f10"]
    out = model_outputs(m, local.x[:3], cols, fill)
    xm = np.repeat(fill[None], 3, 0)
    xm[:, 10], xm[:, 11] = local.x[:3, 6], local.x[:3, 7]  # f20, f21
    torch.testing.assert_close(out, model_outputs(m, xm, list(range(12)), np.zeros(12)))
    with pytest.raises(ConfigError, match="no public default"):
        align(m, local.features, {})


def test_top_m_keeps_the_best_and_skips_the_noise(world):
    models, noise, defaults, local = world
    res = customize([*models, noise], local, defaults, top_m=2, seed=0, epochs=50)
    r = res.report
    assert len(r["selected"]) == 2 and "noisy" not in r["selected"]
    best = sorted(r["scores"], key=lambda k: -r["scores"][k])[:2]
    assert sorted(r["selected"]) == sorted(best)
    assert r["candidates"] == 5 and set(r["seconds"]) == {"own", "select", "fuse"}
    assert 0.8 <= r["test"] <= 1.0 and "spends no privacy budget" in r["privacy"]
    assert res.predict(local.x[:5]).shape == (5,)
    all_ = customize([*models, noise], local, defaults, top_m=None, seed=0, epochs=50)
    assert len(all_.report["selected"]) == 5


def test_split_and_class_label_checks(world):
    models, _, defaults, local = world
    a, b, c = split(100)
    assert (len(a), len(b), len(c)) == (60, 20, 20) and len(set(a) | set(b) | set(c)) == 100
    wrong = PublishedModel.from_bytes(models[0].to_bytes())
    wrong.classes = ["no", "yes"]
    with pytest.raises(ConfigError, match="mismatched class labels"):
        customize([wrong], local, defaults)
    with pytest.raises(ConfigError, match="top_m"):
        customize(models, local, defaults, top_m=0)
