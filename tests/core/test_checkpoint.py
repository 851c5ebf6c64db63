"""silofl.core.checkpoint: what flatten writes, named nodes, the format check and the half-written file."""

import json

import pytest
import torch
from safetensors.torch import load_file

from silofl.core.checkpoint import FORMAT, flatten, load_node, save_node, unflatten
from silofl.core.errors import ConfigError


def test_flatten_moves_tensors_out_in_order_and_keeps_int_keys_and_tuples_as_lists():
    a, b = torch.ones(2), torch.arange(3)
    tensors, skel = flatten({"w": a, 3: [b, (1, "x")], "ok": True})
    assert list(tensors) == ["t.0", "t.1"] and torch.equal(tensors["t.1"], b)
    assert skel == {
        "__dict__": [
            ["w", {"__tensor__": "t.0"}],
            [3, {"__list__": [{"__tensor__": "t.1"}, {"__list__": [1, "x"]}]}],
            ["ok", True],
        ]
    }
    back = unflatten(tensors, json.loads(json.dumps(skel)))  # through JSON, as on disk: the int key survives
    assert list(back) == ["w", 3, "ok"] and back[3][1] == [1, "x"]
    with pytest.raises(TypeError, match="keys must be str or int"):
        flatten({True: 1})
    with pytest.raises(TypeError, match="keys must be str or int"):
        flatten({(1, 2): 1})


def test_a_named_node_round_trips_and_its_files_hold_no_pickle(tmp_path):
    path = save_node(tmp_path / "ck", "protocol", {"sigma": torch.tensor([0.5]), "step": 4})
    assert path == tmp_path / "ck" / "protocol.json"
    head = json.loads(path.read_text())
    assert (head["format"], head["node"], head["meta"]) == (FORMAT, "protocol", {})
    assert set(load_file(str(tmp_path / "ck" / "protocol.safetensors"))) == {"t.0"}
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == [
        "protocol.json",
        "protocol.safetensors",
    ]  # no .tmp
    state, meta = load_node(tmp_path / "ck", "protocol")
    assert state["step"] == 4 and torch.equal(state["sigma"], torch.tensor([0.5])) and meta == {}


def test_another_nodes_file_or_another_format_is_refused(tmp_path):
    save_node(tmp_path, 1, {"x": 1})
    (tmp_path / "node2.json").write_text(
        (tmp_path / "node1.json").read_text()
    )  # node 1's state under node 2's name
    (tmp_path / "node2.safetensors").write_bytes((tmp_path / "node1.safetensors").read_bytes())
    with pytest.raises(ConfigError, match="is not a silofl checkpoint of node 2"):
        load_node(tmp_path, 2)
    head = json.loads((tmp_path / "node1.json").read_text())
    (tmp_path / "node1.json").write_text(json.dumps({**head, "format": "silofl.checkpoint/1"}))
    with pytest.raises(ConfigError, match="not a silofl checkpoint of node 1"):
        load_node(tmp_path, 1)


def test_a_save_that_crashed_before_the_json_leaves_the_previous_checkpoint(tmp_path):
    save_node(tmp_path, 0, {"round": 1})
    (tmp_path / "node0.json.tmp").write_text("{half")  # a crash while writing the next one
    state, _ = load_node(tmp_path, 0)
    assert state == {"round": 1}
    (tmp_path / "node0.json").unlink()
    with pytest.raises(ConfigError, match="no checkpoint of node 0"):
        load_node(tmp_path, 0)
