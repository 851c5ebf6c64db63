"""An impostor that joined a run's torch.distributed rendezvous knowing only its address (no run key), in the
rank of a genuine site process. It answers process 0's first frame with one of:

* ``forge``  — a well-formed reply whose packet is a proxy with PushSum weight 1e300, under a MAC it cannot
make;
* ``huge``   — a frame header declaring 2^62 bytes;
* ``negative`` — a frame header declaring −7 bytes.

    RANK=1 WORLD_SIZE=3 MASTER_ADDR=… MASTER_PORT=… python tests/adversarial/impostor.py forge
"""

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from silofl.comm.messages import Message, Packet, pack
from silofl.comm.wire import encode

TAG = 7


def main(mode: str) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    group = dist.new_group(list(range(dist.get_world_size())), timeout=timedelta(days=7), backend="gloo")
    n = torch.zeros(1, dtype=torch.int64)
    dist.recv(n, 0, tag=TAG, group=group)
    buf = torch.zeros(int(n), dtype=torch.uint8)
    dist.recv(buf, 0, tag=TAG, group=group)  # process 0's first frame (hello): the impostor can read it
    if mode == "forge":
        evil = encode(
            {"out.weight": torch.zeros(1), "__pushsum_weight__": torch.tensor(1e300, dtype=torch.float64)},
            meta={"round": 1, "src": 1},
        )
        frame = (
            (0).to_bytes(8, "little")
            + pack("hello", {1: Message({"n": 10**9}, [Packet(1, 0, evil)])})
            + os.urandom(32)
        )
        dist.send(torch.tensor([len(frame)], dtype=torch.int64), 0, tag=TAG, group=group)
        dist.send(torch.frombuffer(bytearray(frame), dtype=torch.uint8), 0, tag=TAG, group=group)
    else:
        dist.send(torch.tensor([2**62 if mode == "huge" else -7], dtype=torch.int64), 0, tag=TAG, group=group)
    time.sleep(3)


if __name__ == "__main__":
    main(sys.argv[1])
