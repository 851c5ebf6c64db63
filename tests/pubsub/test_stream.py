"""Streams (Algorithm 4): k live models on disjoint chunks; a chunk repeating a record is refused."""

import numpy as np
import pytest

from silofl.core.errors import ConfigError
from silofl.pubsub.broker import Broker
from silofl.pubsub.dp_models import Bounds
from silofl.pubsub.stream import StreamPublisher

FEATS = ["a", "b", "c"]


def _publisher(tmp_path, k=2):
    broker = Broker(tmp_path / "broker")
    broker.join("p", {f: ("continuous", 0.5, 0.0, 1.0) for f in FEATS})
    return broker, StreamPublisher(
        "p",
        FEATS,
        "classification",
        "dp-logreg",
        1.0,
        1e-5,
        Bounds(np.zeros(3), np.ones(3)),
        k=k,
        classes=["0", "1"],
        broker=broker,
    )


def _chunk(rng, ids):
    x = rng.random((len(ids), 3))
    return x, (x[:, 0] > 0.5).astype(int), np.asarray(ids)


def test_the_k_latest_models_stay_published_and_the_guarantee_does_not_grow(tmp_path):
    broker, pub = _publisher(tmp_path, k=2)
    rng = np.random.default_rng(0)
    for t in range(5):
        ev = pub.add_chunk(*_chunk(rng, range(t * 40, (t + 1) * 40)))
        assert ev["live_chunks"] == list(range(max(0, t - 1), t + 1))
    live = broker.models(publisher="p")
    assert sorted(m["chunk"] for m in live) == [3, 4] and all(m["epsilon"] == 1.0 for m in live)
    assert pub.guarantee()["epsilon"] == 1.0 and pub.guarantee()["chunks"] == 5
    assert len(pub.used_ids) == 200


def test_overlapping_or_repeated_records_are_refused(tmp_path):
    broker, pub = _publisher(tmp_path)
    rng = np.random.default_rng(1)
    pub.add_chunk(*_chunk(rng, range(0, 30)))
    with pytest.raises(ConfigError, match="must be disjoint"):
        pub.add_chunk(*_chunk(rng, range(29, 60)))
    with pytest.raises(ConfigError, match="distinct record id"):
        pub.add_chunk(*_chunk(rng, [100] * 30))
    assert len(broker.models(publisher="p")) == 1 and pub.chunks == 1  # nothing changed
    with pytest.raises(ConfigError, match="k must be"):
        StreamPublisher(
            "p", FEATS, "classification", "dp-logreg", 1.0, 1e-5, Bounds(np.zeros(3), np.ones(3)), k=0
        )
