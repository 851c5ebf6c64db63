"""Signed models and declared spend, without a server: the signature covers metadata, receipt and tensors; the
broker refuses a model whose declared spend is missing or over the site's budget, a replayed ledger entry, a
second key for a site; a subscriber verifies what a (remote) broker returns against the registered key."""

import json

import httpx
import numpy as np
import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from silofl.core.errors import ConfigError, ModelRejected
from silofl.pubsub.broker import Broker
from silofl.pubsub.client import RemoteBroker
from silofl.pubsub.dp_models import Bounds, train
from silofl.pubsub.signing import header_metadata, load_signing_key, public_key_hex, sign_model, verify_model

FEATS = ["x0", "x1", "x2"]
JOIN = {f: ["continuous", 0.5, 0.0, 1.0] for f in FEATS}


def model_bytes(site="a", seed=0) -> bytes:
    rng = np.random.default_rng(seed)
    x = rng.random((200, 3))
    y = (x.sum(1) > 1.5).astype(int)
    m = train(
        "dp-logreg",
        x,
        y,
        publisher=site,
        features=FEATS,
        task="classification",
        bounds=Bounds(np.zeros(3), np.ones(3)),
        epsilon=1.0,
        delta=1e-5,
        classes=["0", "1"],
        seed=seed,
    )
    return m.to_bytes()


def receipt(site="a", spent=1.0, seq=0, lifetime=(4.0, 1e-4)):
    return {
        "site": site,
        "epsilon_spent": spent,
        "delta_spent": 1e-5,
        "lifetime": list(lifetime),
        "ledger_seq": seq,
        "join": JOIN,
    }


def test_a_signature_covers_metadata_receipt_and_tensors(tmp_path):
    key = load_signing_key(tmp_path / "a")
    assert (tmp_path / "a" / "sign.key").stat().st_mode & 0o777 == 0o600
    data = sign_model(model_bytes(), key, receipt())
    rel = verify_model(data, public_key_hex(key))
    assert rel["epsilon_spent"] == 1.0 and rel["public_key"] == public_key_hex(key)
    other = load_signing_key(tmp_path / "b")
    with pytest.raises(ModelRejected, match="does not verify"):
        verify_model(data, public_key_hex(other))
    meta = header_metadata(data)
    tensors = st_load(data)
    tensors["coef"] = tensors["coef"] + 0.01  # a changed weight
    with pytest.raises(ModelRejected, match="does not verify"):
        verify_model(st_save(tensors, metadata=meta), public_key_hex(key))
    rel2 = {**json.loads(meta["silofl.release"]), "epsilon_spent": 0.5}  # a lowered declared spend
    with pytest.raises(ModelRejected, match="does not verify"):
        verify_model(
            st_save(st_load(data), metadata={**meta, "silofl.release": json.dumps(rel2)}), public_key_hex(key)
        )
    with pytest.raises(ModelRejected, match="not signed"):
        verify_model(model_bytes(), public_key_hex(key))


def test_a_strict_broker_checks_key_spend_and_ledger_order(tmp_path):
    b = Broker(tmp_path / "broker", require_signed=True)
    key = load_signing_key(tmp_path / "a")
    with pytest.raises(ModelRejected, match="no registered signing key"):
        b.publish(sign_model(model_bytes(), key, receipt()))
    b.register_publisher("a", public_key_hex(key), (4.0, 1e-4))
    with pytest.raises(ConfigError, match="registers once"):
        b.register_publisher("a", public_key_hex(key), (40.0, 1e-4))
    refused = {
        "not signed": model_bytes(),
        "does not verify": sign_model(model_bytes(), load_signing_key(tmp_path / "evil"), receipt()),
        "declares no finite spend": sign_model(
            model_bytes(), key, {k: v for k, v in receipt().items() if k != "epsilon_spent"}
        ),
        "over 'a'": sign_model(model_bytes(), key, receipt(spent=4.5)),
        "below the model's own": sign_model(model_bytes(), key, receipt(spent=0.5)),
        "names site": sign_model(model_bytes(), key, receipt(site="b")),
    }
    for why, data in refused.items():
        with pytest.raises(ModelRejected, match=why):
            b.publish(data)
        assert b.models() == [] and b.sites() == []
    assert b.publish(sign_model(model_bytes(), key, receipt(spent=1.0, seq=3))) == 1
    assert b.sites() == ["a"] and b.publisher("a")["epsilon_spent"] == 1.0
    with pytest.raises(ModelRejected, match="not after"):  # a replayed or rolled-back ledger entry
        b.publish(sign_model(model_bytes(seed=1), key, receipt(spent=2.0, seq=3)))
    assert b.publish(sign_model(model_bytes(seed=1), key, receipt(spent=2.0, seq=4))) == 2
    assert b.publisher("a")["epsilon_spent"] == 2.0 and [m["epsilon_spent"] for m in b.models()] == [1.0, 2.0]
    assert b.fetch(2).publisher == "a"


def test_a_folder_broker_keeps_a_sites_first_key_and_catches_a_changed_store(tmp_path):
    b = Broker(tmp_path / "broker")
    key = load_signing_key(tmp_path / "a")
    b.publish(sign_model(model_bytes(), key, receipt()))
    with pytest.raises(ModelRejected, match="does not verify"):  # another key for the same site
        b.publish(sign_model(model_bytes(seed=1), load_signing_key(tmp_path / "x"), receipt(seq=1)))
    with pytest.raises(ModelRejected, match="not signed"):
        b.publish(model_bytes(seed=2))
    b.join("u", JOIN)
    b.publish(model_bytes(site="u"))  # an unsigned research model of a site without a key is still accepted
    import sqlite3

    with sqlite3.connect(b.db_path) as db:  # model 1's file (the store holds the others too)
        fname = db.execute("SELECT file FROM models WHERE id = 1").fetchone()[0]
    path = tmp_path / "broker" / "models" / fname
    tensors, meta = st_load(path.read_bytes()), header_metadata(path.read_bytes())
    tensors["intercept"] = tensors["intercept"] + 1
    data = st_save(tensors, metadata=meta)
    path.write_bytes(data)  # the stored file and its checksum changed by whoever holds the folder
    with sqlite3.connect(b.db_path) as db:
        from silofl.pubsub.model import checksum

        db.execute("UPDATE models SET checksum = ? WHERE id = 1", (checksum(data),))
    with pytest.raises(ModelRejected, match="does not verify"):
        b.fetch(1)


def test_a_subscriber_verifies_what_the_broker_service_returns(tmp_path):
    key = load_signing_key(tmp_path / "a")
    good = sign_model(model_bytes(), key, receipt())
    tensors, meta = st_load(good), header_metadata(good)
    tensors["coef"] = torch.zeros_like(tensors["coef"])
    altered = st_save(tensors, metadata=meta)
    served = {"1": good, "2": altered}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/publishers":
            return httpx.Response(200, json=[{"site": "a", "public_key": public_key_hex(key)}])
        if request.url.path == "/health":
            return httpx.Response(200, json={"max_upload": 1 << 20})
        return httpx.Response(200, content=served[request.url.path.rsplit("/", 1)[1]])

    rb = RemoteBroker("https://broker.test", {"site": "s", "token": "t"})
    rb._http = httpx.Client(base_url="https://broker.test", transport=httpx.MockTransport(handler))
    assert rb.fetch(1).publisher == "a"
    with pytest.raises(ModelRejected, match="does not verify"):
        rb.fetch(2)
    with pytest.raises(ConfigError, match="cannot act as"):
        rb.subscribe("b", [["x0"]])
