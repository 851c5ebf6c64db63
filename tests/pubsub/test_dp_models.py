"""DP model types: each meets its (ε, δ) through a named mechanism, our inference on the published
tensors equals the library's own predictions, and bad input is a clear error."""

import json
import warnings

import numpy as np
import pytest
import torch
from opacus.accountants import RDPAccountant
from safetensors.torch import save
from sklearn.datasets import load_breast_cancer

from silofl.core.errors import ConfigError, ModelRejected
from silofl.pubsub.dp_models import Bounds, _forest_tensors, _full_nb, train
from silofl.pubsub.model import PublishedModel, outputs


@pytest.fixture(scope="module")
def cancer():
    d = load_breast_cancer()
    x, y = d.data[:300], d.target[:300]
    return x, y, [f"f{i}" for i in range(x.shape[1])], Bounds(d.data.min(0), d.data.max(0))


@pytest.mark.parametrize("kind", ["dp-logreg", "dp-nb", "dp-forest", "dp-nn"])
def test_every_classifier_round_trips_and_meets_its_budget(kind, cancer):
    x, y, feats, b = cancer
    m = train(
        kind,
        x,
        y,
        publisher="a",
        features=feats,
        task="classification",
        bounds=b,
        epsilon=2.0,
        delta=1e-5,
        classes=["m", "b"],
        epochs=3,
        seed=0,
    )  # a research seed: the accuracy check below is not left to chance
    back = PublishedModel.from_bytes(m.to_bytes())
    p = outputs(back, x)
    assert p.shape == (len(x), 2) and torch.allclose(p.sum(1), torch.ones(len(x), dtype=p.dtype))
    assert 0 < back.epsilon <= 2.0 and back.delta == 1e-5 and back.mechanism["name"]
    assert float((p.argmax(1).numpy() == y).mean()) > 0.5


def test_dp_sgd_noise_comes_from_the_target_and_opacus_agrees_on_the_spend(cancer):
    x, y, feats, b = cancer
    m = train(
        "dp-nn",
        x,
        y,
        publisher="a",
        features=feats,
        task="classification",
        bounds=b,
        epsilon=1.0,
        delta=1e-5,
        classes=[0, 1],
        epochs=4,
    )
    mech = m.mechanism
    ref = RDPAccountant()
    ref.history = [(mech["noise_multiplier"], mech["sample_rate"], mech["steps"])]
    assert ref.get_epsilon(1e-5) == pytest.approx(m.epsilon, rel=1e-9)
    assert 0.9 < m.epsilon <= 1.0  # calibrated to the target, not far below it


def test_our_inference_equals_diffprivlib_predictions(cancer):
    from diffprivlib.models import GaussianNB, LogisticRegression, RandomForestClassifier

    x, y, feats, b = cancer
    xs, unit = b.scale(x), (np.zeros(30), np.ones(30))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rf = RandomForestClassifier(
            n_estimators=4, epsilon=1, bounds=unit, classes=np.arange(2), random_state=0
        ).fit(xs, y)
        nb = GaussianNB(epsilon=1, bounds=unit, random_state=0).fit(xs, y)
        lr = LogisticRegression(epsilon=1, data_norm=np.sqrt(30), random_state=0).fit(xs, y)
    cases = [
        ("forest", _forest_tensors(rf, 2), rf),
        ("gnb", _full_nb(nb, 2), nb),
        ("linear", {"coef": torch.tensor(lr.coef_), "intercept": torch.tensor(lr.intercept_)}, lr),
    ]
    for kind, tensors, ref in cases:
        pm = PublishedModel("a", kind, feats, "classification", tensors, 1.0, 0.0, {"name": "test"}, [0, 1])
        np.testing.assert_allclose(
            outputs(PublishedModel.from_bytes(pm.to_bytes()), xs).numpy(), ref.predict_proba(xs), atol=1e-9
        )


@pytest.mark.slow
def test_regression_models(cancer):
    x, _, feats, b = cancer
    y = x[:, 0] * 2.0
    for kind in ("dp-linreg", "dp-nn"):
        m = train(
            kind,
            x,
            y,
            publisher="a",
            features=feats,
            task="regression",
            bounds=b,
            epsilon=5.0,
            delta=1e-5,
            y_bounds=(0.0, 60.0),
            epochs=3,
        )
        assert outputs(m, x).shape == (len(x), 1) and m.classes is None


def test_bad_input_is_a_clear_error(cancer):
    x, y, feats, b = cancer
    kw = {
        "publisher": "a",
        "task": "classification",
        "bounds": b,
        "epsilon": 1.0,
        "delta": 1e-5,
        "classes": [0, 1],
    }
    with pytest.raises(ConfigError, match="unknown model type"):
        train("dp-boost", x, y, features=feats, **kw)
    with pytest.raises(ConfigError, match="30 features are declared|features are declared"):
        train("dp-logreg", x[:, :5], y, features=feats, **kw)
    with pytest.raises(ConfigError, match="0 < ε < ∞"):
        train("dp-logreg", x, y, features=feats, **{**kw, "epsilon": 0.0})
    with pytest.raises(ConfigError, match="cannot be met"):
        train("dp-nn", x, y, features=feats, **{**kw, "epsilon": 1e-6})
    with pytest.raises(ConfigError, match="is a classifier"):
        train("dp-nb", x, y.astype(float), features=feats, **{**kw, "task": "regression", "classes": None})
    m = train("dp-forest", x, y, features=feats, **kw)
    m.tensors["tree0.left"][0] = 10**6  # a child pointing outside the tree
    with pytest.raises(ModelRejected, match="child indices"):
        PublishedModel.from_bytes(_raw(m))


def _raw(m):
    """Bytes of a model as a careless or hostile publisher would write them (no validation)."""
    return save(
        {k: v.contiguous() for k, v in m.tensors.items()}, metadata={"silofl.pubsub": json.dumps(m.meta())}
    )
