import json

import pytest
import torch

from silofl.core.checkpoint import flatten, load_node, save_node, unflatten
from silofl.core.errors import ConfigError
from silofl.runner.loop import run as simulate


def test_flatten_round_trips_nested_state_without_pickle(tmp_path):
    state = {
        "model": {"w": torch.randn(3, 2), "b": torch.zeros(2)},
        "opt": {"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": [{"lr": 0.1, "params": [0]}]},
        "gen": torch.Generator().manual_seed(1).get_state(),
        "n": 4,
        "none": None,
        "hist": [[1.0, 0.5, 3]],
        "name": "x",
    }
    tensors, skel = flatten(state)
    json.dumps(skel)  # the skeleton is plain JSON
    back = unflatten(tensors, skel)
    assert back["opt"]["state"][0]["step"] == 3.0 and back["opt"]["param_groups"] == [
        {"lr": 0.1, "params": [0]}
    ]
    assert torch.equal(back["model"]["w"], state["model"]["w"]) and torch.equal(back["gen"], state["gen"])
    assert back["hist"] == [[1.0, 0.5, 3]] and back["none"] is None and back["n"] == 4
    save_node(tmp_path, 3, state, meta={"round": 7})
    loaded, meta = load_node(tmp_path, 3)
    assert meta == {"round": 7} and torch.equal(loaded["model"]["b"], state["model"]["b"])
    with pytest.raises(ConfigError, match="no checkpoint"):
        load_node(tmp_path, 4)
    (tmp_path / "node3.safetensors").write_bytes(b"garbage")
    with pytest.raises(ConfigError, match="unreadable"):
        load_node(tmp_path, 3)
    with pytest.raises(TypeError):
        flatten({"f": object()})


def _records(out):
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items()} for r in recs]


CASES = {
    "proxyfl": {},
    "fedavg": {},
    "cwt": {},
    "dp-fedadam": {
        "intermediaries": "adaptive",
        "adaptive_clip": True,
        "partition": "iid",
        "batch_size": 15,
        "proxy_model": "mlp256",
    },
    "dp2-rmsprop": {
        "intermediaries": "2",
        "dp2_delay": 1,
        "partition": "iid",
        "batch_size": 15,
        "proxy_model": "mlp256",
    },
}


@pytest.mark.slow
@pytest.mark.parametrize("method", list(CASES))
def test_a_resumed_run_continues_exactly_where_it_stopped(method, tiny_cfg, tmp_path):
    cfg = tiny_cfg.replace(method=method, rounds=4, eval_every=1, seed=0, **CASES[method])
    whole = simulate(cfg.replace(out=str(tmp_path / "whole")), progress=False)
    part = cfg.replace(out=str(tmp_path / "part"), checkpoint_every=2)
    simulate(part.replace(rounds=3), progress=False)  # "crashes" after round 3; the checkpoint is round 2
    assert (tmp_path / "part/checkpoint/latest").read_text() == "round3"  # the last round is saved too
    resumed = simulate(part, progress=False, resume=True)
    assert _records(tmp_path / "whole") == _records(tmp_path / "part")
    assert resumed["final"] == whole["final"]
    assert resumed["accounting"] == whole["accounting"]  # the privacy spend carried on, never reset
    assert resumed["rounds_run"] == 4


def test_resume_refuses_other_options_missing_checkpoints_and_no_new_rounds(tiny_cfg, tmp_path):
    cfg = tiny_cfg.replace(method="fedavg", rounds=2, checkpoint_every=1, out=str(tmp_path / "r"))
    with pytest.raises(ConfigError, match="no checkpoint"):
        simulate(cfg, progress=False, resume=True)
    simulate(cfg, progress=False)
    with pytest.raises(ConfigError, match="different options.*noise_multiplier"):
        simulate(cfg.replace(rounds=4, noise_multiplier=2.0), progress=False, resume=True)
    with pytest.raises(ConfigError, match="more rounds"):
        simulate(cfg, progress=False, resume=True)
