"""The in-process engine: steps reach the addressed sites in order, and every packet's bytes are counted once
for its source when it leaves and once for its destination when it arrives."""

from silofl.comm.engine import InProcessEngine
from silofl.comm.messages import Message, Packet


class Echo:
    """A stand-in site: records the steps it ran; replies with packets described in the request."""

    def __init__(self, cid):
        self.cid, self.steps, self.eval_cache = cid, [], None

    def handle(self, step, msg):
        self.steps.append((step, self.eval_cache is not None))
        return Message(
            {"seen": len(msg.packets)}, [Packet(self.cid, d, b"x" * n) for d, n in msg.meta.get("send", [])]
        )


def test_calls_reach_sites_and_bytes_are_counted_where_packets_cross():
    sites = {k: Echo(k) for k in range(3)}
    eng = InProcessEngine(sites)
    # site 0 sends 5 bytes to site 1 and 7 to the coordinator's node 3 (a server)
    replies = eng.call("train", {0: Message({"send": [[1, 5], [3, 7]]}), 1: Message()})
    assert set(replies) == {0, 1} and sites[2].steps == []
    assert eng.bytes_sent[0] == 12 and eng.bytes_received[3] == 7 and eng.bytes_received[1] == 0
    # the coordinator delivers site 0's packet to site 1, and the server (node 3) sends 4 bytes to site 2
    pkt = replies[0].packets[0]
    replies = eng.call("receive", {1: Message({}, [pkt]), 2: Message({}, [Packet(3, 2, b"abcd")])})
    assert replies[1].meta["seen"] == 1
    assert eng.bytes_received[1] == 5 and eng.bytes_received[2] == 4 and eng.bytes_sent[3] == 4
    eng.call("evaluate", {0: Message()})
    assert (
        sites[0].steps[-1] == ("evaluate", True) and sites[0].eval_cache is None
    )  # a cache for that call only
