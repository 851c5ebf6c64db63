import sqlite3

import pytest
import torch

from silofl.core.errors import ConfigError, ModelRejected
from silofl.pubsub import Broker, PublishedModel
from silofl.pubsub.model import checksum

FEATURES = {
    "age": ("continuous", 54.2),
    "bmi": ("continuous", 27.1),
    "smoker": ("categorical", "no"),
    "bp": ("continuous", 128.0),
}


def linear(publisher="A", features=("age", "bmi"), classes=(0, 1), outputs=None, **kw) -> PublishedModel:
    f = list(features)
    k = outputs if outputs is not None else (1 if classes and len(classes) == 2 else len(classes or [0]))
    g = torch.Generator().manual_seed(len(f) + k)
    return PublishedModel(
        publisher=publisher,
        kind="linear",
        features=f,
        task=kw.pop("task", "classification"),
        classes=list(classes) if classes is not None else None,
        tensors={"coef": torch.randn(k, len(f), generator=g), "intercept": torch.zeros(k)},
        epsilon=kw.pop("epsilon", 1.0),
        delta=kw.pop("delta", 1e-5),
        mechanism={"name": "objective perturbation"},
        **kw,
    )


@pytest.fixture
def broker(tmp_path):
    b = Broker(tmp_path / "broker")
    b.join("A", {k: FEATURES[k] for k in ("age", "bmi", "smoker")})
    b.join("B", {k: FEATURES[k] for k in ("age", "bp")})
    b.join("S", {"age": FEATURES["age"]})
    return b


def _state(b: Broker):
    with sqlite3.connect(b.db_path) as db:
        rows = {
            t: db.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall()
            for t in ("sites", "features", "channels", "models")
        }
    return rows, sorted(p.name for p in b.models_dir.iterdir())


def test_a_model_round_trips_through_the_safe_format_and_the_broker(broker):
    m = linear(chunk=3)
    data = m.to_bytes()
    assert b"pickle" not in data and data[:8]  # a safetensors blob
    back = PublishedModel.from_bytes(data)
    assert back.meta() == m.meta() and torch.equal(back.tensors["coef"], m.tensors["coef"])
    mid = broker.publish(data)
    got = broker.fetch(mid)
    assert got.features == ["age", "bmi"] and got.chunk == 3 and got.epsilon == 1.0
    row = broker.models()[0]
    assert row["id"] == mid and row["publisher"] == "A" and row["size"] == len(data)
    assert (broker.models_dir / f"{checksum(data)}.safetensors").read_bytes() == data


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda: _wrong_width(), "takes 3 inputs but declares 2"),
        (lambda: _nan(), "non-finite"),
        (lambda: linear(classes=(0, 1, 2), outputs=2), "2 outputs for 3 classes"),
        (lambda: linear(epsilon=0.0), "need ε > 0"),
        (lambda: linear(epsilon=float("inf")), "must be a non-negative finite number"),
        (lambda: linear(delta=1.5), "δ < 1"),
        (lambda: linear(features=("age", "age")), "distinct"),
        (lambda: linear(task="regression", classes=None, outputs=2), "1 output"),
        (lambda: linear(classes=(1,)), "two distinct class labels"),
    ],
)
def test_invalid_models_are_rejected_with_a_reason(make, reason):
    with pytest.raises(ModelRejected, match=reason):
        make().to_bytes()


def _wrong_width():
    m = linear()
    m.tensors["coef"] = torch.zeros(1, 3)
    return m


def _nan():
    m = linear()
    m.tensors["coef"][0, 0] = float("nan")
    return m


def test_publish_rejects_bad_models_and_leaves_the_broker_unchanged(broker):
    first = linear().to_bytes()
    broker.publish(first)
    before = _state(broker)
    good = linear(features=("age", "bp"), publisher="B").to_bytes()
    cases = {
        "not a silofl published model": b"garbage" * 10,
        "exceeds the size limit": good + b"\0" * (broker.max_bytes + 1 - len(good)),
        "has not joined": linear(publisher="Z").to_bytes(),
        "not registered by 'A'": linear(features=("age", "bp")).to_bytes(),  # A has no bp
        "already published": first,
    }
    for reason, data in cases.items():
        with pytest.raises(ModelRejected, match=reason):
            broker.publish(data)
        assert _state(broker) == before, reason
    tampered = bytearray(good)
    tampered[-1] ^= 1  # a flipped bit inside the tensor data still parses; the checksum catches it on fetch
    mid = broker.publish(good)
    path = broker.models_dir / f"{checksum(good)}.safetensors"
    path.write_bytes(bytes(tampered))
    with pytest.raises(ModelRejected, match="checksum"):
        broker.fetch(mid)
    path.unlink()
    with pytest.raises(ModelRejected, match="missing"):
        broker.fetch(mid)
    with pytest.raises(ModelRejected, match="no published model"):
        broker.fetch(999)


def test_channels_stream_models_whose_features_cover_a_clause(broker):
    a1 = broker.publish(linear(features=("age", "bmi")).to_bytes())
    a2 = broker.publish(linear(features=("age", "bmi", "smoker"), classes=(0, 1, 2)).to_bytes())
    b1 = broker.publish(linear(publisher="B", features=("age", "bp")).to_bytes())
    ch = broker.subscribe("S", [["age", "bmi"], ["bp"]])  # (age ∧ bmi) ∨ bp
    assert broker.stream(ch.id) == [a1, a2, b1]
    only_smoker = broker.subscribe("S", [{"smoker", "age"}])
    assert broker.stream(only_smoker.id) == [a2]
    assert broker.stream(ch.id, since=a2) == [b1]  # what arrived since the last look
    own = broker.subscribe("A", [["age"]])
    assert broker.stream(own.id) == [b1]  # a site is not sent its own models
    with pytest.raises(ConfigError, match="unknown features"):
        broker.subscribe("S", [["age", "weight"]])
    with pytest.raises(ConfigError, match="non-empty"):
        broker.subscribe("S", [[]])
    with pytest.raises(ConfigError, match="has not joined"):
        broker.subscribe("Q", [["age"]])
    broker.unsubscribe(only_smoker.id)
    with pytest.raises(ConfigError, match="no channel"):
        broker.stream(only_smoker.id)


def test_sites_join_and_leave_at_any_time_with_their_models(broker):
    broker.publish(linear().to_bytes())
    b1 = broker.publish(linear(publisher="B", features=("age", "bp")).to_bytes())
    ch = broker.subscribe("S", [["age"]])
    assert broker.leave("A") == 1
    assert broker.stream(ch.id) == [b1] and "A" not in broker.sites()
    assert len(list(broker.models_dir.iterdir())) == 1
    assert broker.public_defaults() == {"age": 54.2, "bp": 128.0}
    broker.leave("S")
    with pytest.raises(ConfigError, match="no channel"):
        broker.channel(ch.id)
    with pytest.raises(ConfigError, match="unknown site"):
        broker.leave("A")
    with pytest.raises(ConfigError, match="public default is a number"):
        broker.join("C", {"x": ("continuous", "high")})
    reopened = Broker(broker.path)  # the state lives in the directory
    assert reopened.sites() == ["B"] and reopened.fetch(b1).publisher == "B"


def test_a_dp_sgd_network_is_published_as_its_state_dict(broker):
    from silofl.models import MLP

    net = MLP((3,), 3, hidden=(8,))
    m = PublishedModel(
        publisher="A",
        kind="mlp",
        features=["age", "bmi", "smoker"],
        task="classification",
        classes=["low", "mid", "high"],
        tensors=dict(net.state_dict()),
        epsilon=2.0,
        delta=1e-5,
        mechanism={"name": "dp-sgd", "noise_multiplier": 1.1, "sample_rate": 0.01, "steps": 300},
    )
    got = broker.fetch(broker.publish(m.to_bytes()))
    net2 = MLP((3,), 3, hidden=(8,))
    net2.load_state_dict(got.tensors)
    x = torch.randn(5, 3)
    assert torch.equal(net(x), net2(x))
    m.features = ["age", "bmi"]
    with pytest.raises(ModelRejected, match="takes 3 inputs but declares 2"):
        m.to_bytes()
