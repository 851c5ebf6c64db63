"""Framing of the engine seam's messages: a round trip, and every malformed frame refused before anything is
allocated from it."""

import json

import pytest

from silofl.comm.messages import Message, Packet, pack, unpack
from silofl.core.errors import PeerModelRejected


def test_pack_unpack_roundtrip_keeps_meta_packets_and_order():
    msgs = {
        2: Message({"round": 3, "to": [0, 1]}, [Packet(2, 0, b"abc"), Packet(2, 1, b"")]),
        0: Message({"x": None}),
        5: Message(packets=[Packet(9, 5, bytes(range(256)))]),
    }
    step, got = unpack(pack("train_send", msgs))
    assert step == "train_send" and list(got) == [2, 0, 5]
    for k, m in msgs.items():
        assert got[k].meta == m.meta and got[k].packets == m.packets


def _frame(header: dict, body: bytes = b"") -> bytes:
    head = json.dumps(header).encode()
    return len(head).to_bytes(8, "little") + head + body


@pytest.mark.parametrize(
    "frame, reason",
    [
        (b"\x01\x02", "shorter than its header length"),
        ((2**62).to_bytes(8, "little") + b"{}", "declares a header of"),
        (_frame({"step": 1, "messages": {}}), "step name"),
        (_frame({"step": "s", "messages": {"x": {"meta": {}, "packets": []}}}), "malformed message"),
        (
            _frame({"step": "s", "messages": {"1": {"meta": {}, "packets": [[0, 1, -7]]}}}),
            "non-negative integer",
        ),
        (_frame({"step": "s", "messages": {"1": {"meta": {}, "packets": [[0, 1, 2**62]]}}}), "declares"),
        (
            _frame({"step": "s", "messages": {"1": {"meta": {}, "packets": [[0, 1, 2]]}}}, b"abcd"),
            "after the last packet",
        ),
        (len(b"not json").to_bytes(8, "little") + b"not json", "not JSON"),
    ],
)
def test_malformed_frames_are_refused_with_a_reason(frame, reason):
    with pytest.raises(PeerModelRejected, match=reason):
        unpack(frame)


def test_oversized_frame_is_refused_before_parsing():
    with pytest.raises(PeerModelRejected, match="exceeds the limit"):
        unpack(pack("s", {0: Message(packets=[Packet(0, 1, b"x" * 100)])}), max_bytes=50)


def test_the_depth_scan_of_a_hostile_header_does_not_hang():
    """Over 64 brackets, then 1 MB of '"\\' (a string that never closes, a trailing backslash): the scan must
    stay linear — a string pattern that could fail rescanned from every quote (20 kB took 5.8 s; 1 MB would
    take hours). Checked as a hang (a generous 20 s bound on a thread), not as a speed figure."""
    import threading

    from silofl.comm.messages import json_depth

    out: list[int] = []
    for tail in (b"", b"x", b'"'):
        header = b"[]" * 70 + b'"\\' * 500_000 + tail
        t = threading.Thread(target=lambda h=header: out.append(json_depth(h)), daemon=True)
        t.start()
        t.join(20)
        assert not t.is_alive(), "json_depth did not finish: the scan is not linear"
    assert out == [1, 1, 1]
