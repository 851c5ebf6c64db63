import pytest
import torch

from silofl.errors import PeerModelRejected
from silofl.runtime import InProcessTransport, decode, encode, validate


def test_roundtrip_and_byte_counts():
    state = {"a": torch.randn(3, 4), "b": torch.arange(5)}
    data = encode(state, {"round": 3})
    t = InProcessTransport()
    t.send(0, 1, data)
    (env,) = t.receive(1)
    got, meta = decode(env.data)
    assert meta == {"round": 3} and torch.equal(got["a"], state["a"])
    assert t.bytes_sent[0] == len(data) == t.bytes_received[1]
    assert t.receive(1) == []


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
