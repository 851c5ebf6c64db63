"""The protocol's wire messages: round trips, and refusal of anything else before it is used."""

import numpy as np
import pytest
import torch

from silofl.comm.wire import encode
from silofl.core.errors import PeerModelRejected
from silofl.secure.messages import pack_masked, pack_shares, unpack_masked, unpack_shares
from silofl.secure.protocol import SEALED_SHARE_BYTES

SHARE = bytes(range(SEALED_SHARE_BYTES))


@pytest.mark.parametrize("bits", [20, 40])
def test_masked_round_trip_in_the_narrowest_type(bits):
    y = np.array([0, 1, (1 << bits) - 1, 12345], dtype=np.uint64)
    data = pack_masked(y, {3: SHARE}, bits, {"round": 2, "src": 1})
    got, sealed = unpack_masked(data, 4, bits, {"round": 2, "src": 1})
    assert np.array_equal(got, y) and sealed == {3: SHARE}
    assert len(data) < 4 * (4 if bits <= 32 else 8) + SEALED_SHARE_BYTES + 400


def test_hostile_masked_messages_are_refused():
    good = pack_masked(np.zeros(4, dtype=np.uint64), {3: SHARE}, 20, {"round": 2, "src": 1})
    with pytest.raises(PeerModelRejected, match="replayed"):
        unpack_masked(good, 4, 20, {"round": 3, "src": 1})
    with pytest.raises(PeerModelRejected, match="must be 5 elements"):
        unpack_masked(good, 5, 20, {})
    with pytest.raises(PeerModelRejected, match="exceeds"):
        unpack_masked(good + b"\0" * (1 << 17), 4, 20, {}, max_shares=1)
    bad = [
        {"masked": torch.zeros(4, dtype=torch.float32)},
        {
            "masked": torch.zeros(4, dtype=torch.int32),
            "share_x": torch.zeros(SEALED_SHARE_BYTES, dtype=torch.uint8),
        },
        {"masked": torch.zeros(4, dtype=torch.int32), "share_1": torch.zeros(3, dtype=torch.uint8)},
        {"masked": torch.zeros(4, dtype=torch.int32), "other": torch.zeros(1)},
    ]
    for tensors in bad:
        with pytest.raises(PeerModelRejected):
            unpack_masked(encode(tensors, {}), 4, 20, {})
    with pytest.raises(PeerModelRejected):
        unpack_masked(b"garbage", 4, 20, {})


def test_forwarded_shares_only_from_allowed_senders():
    data = pack_shares({0: SHARE, 2: SHARE}, {"round": 1, "dst": 1})
    assert unpack_shares(data, {"round": 1, "dst": 1}, {0, 2}) == {0: SHARE, 2: SHARE}
    with pytest.raises(PeerModelRejected, match="not a neighbour"):
        unpack_shares(data, {"round": 1, "dst": 1}, {0})
    with pytest.raises(PeerModelRejected, match="replayed"):
        unpack_shares(data, {"round": 1, "dst": 3}, {0, 2})
