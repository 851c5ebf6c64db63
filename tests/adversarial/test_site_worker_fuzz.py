"""A worker nothing can wedge (issue 25, item 4): against a real ``silofl site run`` process, a header nesting
200,000 lists, requesters that hang up before the reply or mid-frame, a writer that stalls holding its
connection open, and a few hundred malformed and truncated frames each cost their own request — then the same
worker answers a normal hello, joins a run and trains a round."""

import os
import random
import re
import socket
import struct
import subprocess
import sys
import time

import pytest

from silofl.comm.messages import Message, pack, unpack
from silofl.deploy.local import free_port, make_site_folders
from silofl.deploy.site import ERROR, HELLO, SETUP
from silofl.runner.data import prepare_data


def frame_of(step, meta, k=0):
    return pack(step, {k: Message(meta)})


def request(sock_path, frame, timeout=20.0):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
        c.settimeout(timeout)
        c.connect(sock_path)
        c.sendall(struct.pack("<Q", len(frame)) + frame)
        n = struct.unpack("<Q", _exact(c, 8))[0]
        return unpack(_exact(c, n))


def _exact(c, n):
    buf = b""
    while len(buf) < n:
        chunk = c.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def raw(sock_path, data, read=False, timeout=5.0):
    """Send raw bytes and hang up (optionally after reading whatever comes back)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
        c.settimeout(timeout)
        c.connect(sock_path)
        c.sendall(data)
        if read:
            try:
                c.recv(1 << 16)
            except OSError:
                pass


@pytest.mark.slow
@pytest.mark.deploy
@pytest.mark.multiprocess
def test_no_frame_hang_up_or_stall_wedges_a_real_site_worker(tiny_cfg, tmp_path):
    import torch

    cfg = tiny_cfg.replace(method="proxyfl", clients=2, rounds=2, seed=0).resolve()
    cfg, split = prepare_data(cfg, torch.device("cpu"))
    cards, folders = make_site_folders(cfg, split, tmp_path / "sites")
    log = open(tmp_path / "site.log", "wb")  # noqa: SIM115
    # the SuperLink it names does not exist: the worker serves its socket while its SuperNode keeps trying
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "silofl.cli.main",
            "site",
            "run",
            "--site-dir",
            str(folders[0]),
            "--superlink",
            f"127.0.0.1:{free_port()}",
            "--insecure",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "SILOFL_NO_PROGRESS": "1"},
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        path = None
        while path is None and time.monotonic() < deadline:
            m = re.search(r"serves (\S+site\.sock)", (tmp_path / "site.log").read_text(errors="replace"))
            path = m.group(1) if m else None
            assert proc.poll() is None, (tmp_path / "site.log").read_text()
            time.sleep(0.2)
        assert path, (tmp_path / "site.log").read_text()
        hello = frame_of(HELLO, {"nonce": "n0"})
        assert request(path, hello)[0] == HELLO

        deep = (
            b'{"step": "__hello__", "messages": {"0": {"meta": {"x": '
            + b"[" * 200_000
            + b"]" * 200_000
            + b"}}}}"
        )
        attacks = [len(deep).to_bytes(8, "little") + deep]
        rng = random.Random(0)
        setup = frame_of(SETUP, {"run_id": "r1", "sites": ["site0", "site1"], "config": cfg.to_dict()})
        for good in (hello, setup, frame_of("train_send", {"round": 1, "to": [1]})):
            for _ in range(60):  # truncated, bit-flipped and spliced frames
                cut = rng.randrange(len(good))
                bad = bytearray(good[:cut] if rng.random() < 0.5 else good)
                for _ in range(rng.randrange(1, 6)):
                    if bad:
                        bad[rng.randrange(len(bad))] = rng.randrange(256)
                attacks.append(bytes(bad))
        attacks += [
            b"",
            b"\x00" * 8,
            b"\xff" * 8 + b"{}",
            (7).to_bytes(8, "little") + b"[[[[[[[",
            b"not a frame at all",
            frame_of("../../etc", {}),
            frame_of(HELLO, {"nonce": "x" * 10_000}),
        ]
        for i, a in enumerate(attacks):
            if i % 3 == 0:  # hang up right after sending, before the reply
                raw(path, struct.pack("<Q", len(a)) + a)
            elif i % 3 == 1:  # a length prefix promising more than is sent, then hang up mid-frame
                raw(path, struct.pack("<Q", len(a) + 100) + a)
            else:  # a whole frame, its reply read
                try:
                    got, _ = request(path, a, timeout=30)
                    assert got == ERROR or got in (HELLO, SETUP, "train_send")
                except ConnectionError:
                    pass
        raw(path, struct.pack("<Q", len(hello)) + hello)  # a well-formed request whose requester left
        # a writer that stalls mid-frame holds its connection open while others are answered
        stall = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stall.connect(path)
        stall.sendall(struct.pack("<Q", 1000) + b"{")
        t0 = time.monotonic()
        got, msgs = request(path, hello, timeout=20)
        assert got == HELLO and msgs[0].meta["name"] == "site0" and time.monotonic() - t0 < 15
        # and the same worker still joins a run and trains a round
        got, msgs = request(
            path,
            frame_of(
                SETUP,
                {
                    "run_id": "fuzz-run",
                    "sites": ["site0", "site1"],
                    "config": cfg.with_data(200, smallest=100).to_dict(),
                },
            ),
            timeout=60,
        )
        assert got == SETUP and msgs[0].meta["joined"], msgs
        got, msgs = request(path, frame_of("train_send", {"round": 1, "to": [1]}), timeout=120)
        assert got == "train_send" and [p.data[:4] for p in msgs[0].packets] == [b"SFS1"]
        stall.close()
        assert proc.poll() is None
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(30)
        log.close()
