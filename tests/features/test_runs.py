"""A quick ``--features scatter`` run of every example-level method and a client-level one on digits (16×16, J
= 2: 81×4×4 features), and the feature stage's record in the run folder."""

import json

import pytest

from silofl.runner.config import RunConfig
from silofl.runner.loop import run

TINY = dict(
    dataset="digits",
    clients=3,
    rounds=2,
    samples_per_client=100,
    batch_size=25,
    delta=1e-3,
    test_limit=100,
    features="scatter",
    threads=1,
)
HEADS = {
    "proxyfl": dict(private_model="scattercnn", proxy_model="linear"),
    "fml": dict(private_model="linear", proxy_model="scattercnn"),
    "fedavg": dict(proxy_model="linear"),
    "avgpush": dict(proxy_model="linear"),
    "cwt": dict(proxy_model="mlp"),
    "regular": dict(private_model="scattercnn"),
    "joint": dict(private_model="linear"),
    "dp-fedavg": dict(proxy_model="linear", rounds=3),
}


@pytest.mark.slow
@pytest.mark.parametrize("method", list(HEADS))
def test_scatter_run(tmp_path, method):
    out = tmp_path / "run"
    cfg = RunConfig.from_dict({**TINY, **HEADS[method], "method": method, "out": str(out)})
    summary = run(cfg, progress=False)
    rec = summary["features"]
    assert rec["features"]["name"] == "scatter" and rec["feature_shape"] == [81, 4, 4]
    assert rec["input_shape"] == [1, 16, 16] and "costs no privacy budget" in rec["privacy"]
    head = summary["headline"]
    acc = summary["final"][head]["mean"]
    assert 0.0 <= acc <= 1.0
    specs = [
        json.loads(p.read_text()) for p in (out / "models").glob("client*_*.json") if "features" not in p.name
    ]
    assert specs and all(s["input_shape"] == [81, 4, 4] for s in specs)
    feats = list((out / "models").glob("client*_features.json"))
    assert feats and json.loads(feats[0].read_text())["settings"] == {
        "features": "scatter",
        "scatter_j": 2,
        "scatter_l": 8,
    }
