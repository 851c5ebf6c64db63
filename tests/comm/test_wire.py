import pytest
import torch

from silofl.comm.wire import decode, encode, validate
from silofl.core.errors import PeerModelRejected


def test_roundtrip():
    state = {"a": torch.randn(3, 4), "b": torch.arange(5)}
    got, meta = decode(encode(state, {"round": 3}))
    assert meta == {"round": 3} and torch.equal(got["a"], state["a"]) and torch.equal(got["b"], state["b"])


def test_rejections():
    ref = {"w": torch.zeros(2, 2)}
    with pytest.raises(PeerModelRejected, match="not valid safetensors"):
        decode(b"\x10\x00\x00\x00garbage")
    with pytest.raises(PeerModelRejected, match="exceeds"):
        decode(encode(ref), max_bytes=10)
    with pytest.raises(PeerModelRejected, match="non-finite"):
        validate({"w": torch.tensor([[1.0, float("nan")], [0, 0]])}, ref)
    with pytest.raises(PeerModelRejected, match="shape"):
        validate({"w": torch.zeros(3, 2)}, ref)
    with pytest.raises(PeerModelRejected, match="dtype"):
        validate({"w": torch.zeros(2, 2, dtype=torch.float64)}, ref)
    with pytest.raises(PeerModelRejected, match="names"):
        validate({"v": torch.zeros(2, 2)}, ref)
