"""The torch.distributed engine (gloo on CPU) for research clusters, launched by torchrun or by
``silofl launch --survive-faults``.

Sites map to processes (ranks): site k runs on rank ``k % world``. Rank 0 runs the coordinator (and its
own share of sites) and writes the run folder; every other rank serves its sites' steps
(:func:`serve`). A call sends each rank one frame with the requests for its sites
(:mod:`silofl.comm.messages`: JSON and raw bytes, never pickle), as two tensors — its length (int64)
and the bytes (uint8) — and waits for one reply frame per rank; ranks work in parallel. Every frame
is bounded before its buffer is allocated.

Faults (crash-stop). Every wait of rank 0 has a timeout. A rank whose connection closes (a crash) or
that does not answer within the timeout (a hang) is *lost*: nothing is sent to it or awaited from it
again, and its sites are reported lost to the coordinator, which retires them (with the method's
repair, e.g. PushSum mass taken back). A serving rank that loses rank 0 stops. The timeout is
silofl's: gloo's own timeout closes every connection of the process (its context signals it to all
pairs), so gloo's wait runs in a helper thread on a process group whose gloo timeout is far away.

Authentication. The processes of a run share a secret *run key* (``SILOFL_RUN_KEY``, hex; ``silofl launch``
makes one for a single machine, and reads ``--auth-key-file`` on several). Every frame carries its
sequence number on its link and an HMAC-SHA256 over (sender rank, receiver rank, sequence number, frame):
a process that joined the rendezvous without the key (an impostor), a forged, replayed or reordered frame
is refused, logged, and its sender treated as lost. Frames are not encrypted: this engine is for a
research cluster's own network (use the Flower engine between institutions); summary.json records that.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from silofl.comm.engine import Engine, SiteHandle, run_here
from silofl.comm.messages import MAX_FRAME_BYTES, Message, pack, unpack
from silofl.core.errors import ConfigError, PeerModelRejected, SiloflError

log = logging.getLogger("silofl")

TAG = 7  # every frame between rank 0 and a serving rank
GLOO_TIMEOUT = timedelta(days=7)
FAULT_ENV = "SILOFL_INJECT_FAULT"  # testing hook: "RANK:ROUND:KIND", see inject_fault
FAULT_KINDS = ("crash", "hang", "crash-receiving", "hang-receiving")
STOP, ERROR = "__stop__", "__error__"
KEY_ENV = "SILOFL_RUN_KEY"
MAC_BYTES, SEQ_BYTES = 32, 8


def run_key() -> bytes:
    """The run's shared secret from the environment; a clear error without one."""
    text = os.environ.get(KEY_ENV, "")
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 16:
        raise ConfigError(
            f"{KEY_ENV} must hold the run's shared key (hex, at least 16 bytes): start the processes "
            "with `silofl launch` (several machines: --auth-key-file)"
        )
    return key


def init_from_env(backend: str = "gloo", timeout_s: float = 300.0) -> None:
    """Join the process group torchrun (or ``silofl launch``) set up: RANK, WORLD_SIZE, MASTER_ADDR and
    MASTER_PORT in the environment (torch.distributed's env:// rendezvous on a TCP store).

    Under torchrun's agent store the keys of each restart attempt get their own prefix: torch 2.13 reuses
    the agent's store across restarts, and the workers of a restarted group would otherwise read the
    previous attempt's addresses and fail to connect."""
    if dist.is_initialized():
        return
    timeout = timedelta(seconds=timeout_s)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False, timeout=timeout
        )
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        dist.init_process_group(
            backend,
            store=dist.PrefixStore(f"silofl/attempt{attempt}", store),
            rank=rank,
            world_size=world,
            timeout=timeout,
        )
    else:
        dist.init_process_group(backend, timeout=timeout)


def inject_fault(rank: int, rnd: int, stage: str = "start") -> None:
    """Testing hook: ``SILOFL_INJECT_FAULT=R:N:KIND`` makes process R fail in round N. ``crash`` kills it
    (SIGKILL, no clean-up) at its first step of the round, ``hang`` stops it there (SIGSTOP: it neither
    answers nor closes its connections); ``crash-receiving`` / ``hang-receiving`` do so mid-round, after it
    trained and sent, when it is asked to receive. Only on a first start under torchrun (a restarted worker
    runs on)."""
    spec = os.environ.get(FAULT_ENV)
    if not spec or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    try:
        r_text, n_text, kind = spec.split(":")
        r, n = int(r_text), int(n_text)
        if kind not in FAULT_KINDS:
            raise ValueError
    except ValueError:
        raise ConfigError(
            f"{FAULT_ENV} takes RANK:ROUND:KIND (KIND one of {', '.join(FAULT_KINDS)}), got {spec!r}"
        ) from None
    at = "receiving" if kind.endswith("-receiving") else "start"
    if (r, n, at) == (rank, rnd, stage):
        log.warning("process %d: injected %s in round %d", rank, kind, rnd)
        os.kill(os.getpid(), signal.SIGKILL if kind.startswith("crash") else signal.SIGSTOP)


def rank_of(site: int, world: int) -> int:
    """The rank that runs ``site``."""
    return site % world


class _Link:
    """Frames between this rank and others over a gloo group, with silofl's own timeouts."""

    def __init__(self, timeout_s: float | None, key: bytes | None = None):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.timeout_s = timeout_s
        self.key = key if key is not None else run_key()
        self.sent: dict[int, int] = defaultdict(int)  # next sequence number per peer, each way
        self.received: dict[int, int] = defaultdict(int)
        # point-to-point traffic on its own group, whose gloo timeout never fires (see the module doc)
        self.group = dist.new_group(list(range(self.world)), timeout=GLOO_TIMEOUT, backend="gloo")
        self._pending: list = []  # isends in flight: their buffers must outlive them

    def _mac(self, src: int, dst: int, seq: bytes, frame: bytes) -> bytes:
        head = src.to_bytes(4, "little") + dst.to_bytes(4, "little") + seq
        return hmac.new(self.key, head + frame, hashlib.sha256).digest()

    def send(self, peer: int, frame: bytes) -> None:
        """Post a frame to ``peer``: its length, then its sequence number, the frame and their MAC."""
        seq = self.sent[peer].to_bytes(SEQ_BYTES, "little")
        self.sent[peer] += 1
        frame = seq + frame + self._mac(self.rank, peer, seq, frame)
        n = torch.tensor([len(frame)], dtype=torch.int64)
        data = (
            torch.frombuffer(bytearray(frame), dtype=torch.uint8)
            if frame
            else torch.zeros(0, dtype=torch.uint8)
        )
        for t in (n, data):
            self._pending.append((dist.isend(t, peer, tag=TAG, group=self.group), t))

    def recv(self, peer: int, what: str, timeout_s: float | None) -> bytes:
        """One authenticated frame from ``peer``; SiloflError (with the reason) if it fails, times out, is too
        large (checked before anything is allocated), or fails its MAC or sequence number."""
        n = torch.zeros(1, dtype=torch.int64)
        self._wait(self._irecv(n, peer, what), what, timeout_s)
        size = int(n)
        if not SEQ_BYTES + MAC_BYTES <= size <= MAX_FRAME_BYTES + SEQ_BYTES + MAC_BYTES:
            raise SiloflError(
                f"{what}: refused a frame of declared size {size} (outside "
                f"{SEQ_BYTES + MAC_BYTES}…{MAX_FRAME_BYTES + SEQ_BYTES + MAC_BYTES} bytes)"
            )
        buf = torch.zeros(size, dtype=torch.uint8)
        self._wait(self._irecv(buf, peer, what), what, timeout_s)
        raw = buf.numpy().tobytes()
        seq, frame, mac = raw[:SEQ_BYTES], raw[SEQ_BYTES:-MAC_BYTES], raw[-MAC_BYTES:]
        if not hmac.compare_digest(mac, self._mac(peer, self.rank, seq, frame)):
            raise SiloflError(f"{what}: refused a frame that fails its MAC (not from a process of this run)")
        if int.from_bytes(seq, "little") != self.received[peer]:
            raise SiloflError(
                f"{what}: refused frame {int.from_bytes(seq, 'little')}, expected "
                f"{self.received[peer]} (replayed or reordered)"
            )
        self.received[peer] += 1
        return frame

    def _irecv(self, t: torch.Tensor, peer: int, what: str):
        """Post a receive; a peer whose connection is already closed fails here, not in the wait."""
        try:
            return dist.irecv(t, peer, tag=TAG, group=self.group)
        except RuntimeError as e:
            raise SiloflError(f"{what}: {_reason(e)}") from None

    def _wait(self, work, what: str, timeout_s: float | None) -> None:
        box: dict = {}

        def wait() -> None:
            try:
                work.wait()
                box["ok"] = True
            except RuntimeError as e:
                box["error"] = e

        helper = threading.Thread(target=wait, daemon=True)
        helper.start()
        helper.join(timeout_s)
        if "ok" in box:
            return
        why = _reason(box["error"]) if "error" in box else f"no answer within {timeout_s:g} s"
        raise SiloflError(f"{what}: {why}")

    def flush(self, timeout_s: float | None) -> None:
        """Wait for posted sends (their peers may be gone: failures are ignored here)."""
        for work, _ in self._pending:
            try:
                self._wait(work, "sending", timeout_s)
            except SiloflError:
                pass
        self._pending.clear()


class TorchDistEngine(Engine):
    """Rank 0's side: the coordinator's engine over every rank (see the module doc)."""

    name = "torch.distributed"

    def __init__(self, make_site: Callable[[int], SiteHandle], n_sites: int, timeout_s: float = 300.0):
        super().__init__(list(range(n_sites)))
        if not dist.is_initialized():
            raise SiloflError("torch.distributed is not initialised: start the run with `silofl launch`")
        self.link = _Link(timeout_s)
        if self.link.rank != 0:
            raise SiloflError("the coordinator runs on rank 0; other ranks serve their sites (serve())")
        self.world = self.link.world
        self.timeout_s = timeout_s
        self.sites = {k: make_site(k) for k in range(n_sites) if rank_of(k, self.world) == 0}
        self.lost_processes: dict[str, str] = {}
        self.receive_seconds: dict[str, float] = defaultdict(
            float
        )  # per site: waiting for its reply included

    @property
    def processes(self) -> int:
        return self.world

    def describe(self) -> dict:
        return {
            "name": self.name,
            "processes": self.world,
            "backend": "gloo",
            "tls": False,
            "node_auth": "HMAC-SHA256 of every frame with the run's shared key, sequence numbers",
            "sealed": False,
            "note": "a research cluster's engine: frames are authenticated but not encrypted",
        }

    def _lose(self, rank: int, why: str) -> None:
        if str(rank) in self.lost_processes:
            return
        log.warning("process 0 lost process %d: %s", rank, why)
        self.lost_processes[str(rank)] = why
        for k in self.site_ids:
            if rank_of(k, self.world) == rank:
                self.lost[k] = why

    def _call(self, step: str, requests: dict[int, Message]) -> dict[int, Message]:
        by_rank: dict[int, dict[int, Message]] = defaultdict(dict)
        for k, m in requests.items():
            by_rank[rank_of(k, self.world)][k] = m
        for r, reqs in by_rank.items():
            if r != 0 and str(r) not in self.lost_processes:
                try:
                    self.link.send(r, pack(step, reqs))
                except RuntimeError as e:
                    self._lose(r, f"sending: {_reason(e)}")
        replies: dict[int, Message] = run_here(self.sites, step, by_rank.get(0, {}))
        for r, reqs in sorted(by_rank.items()):
            if r == 0 or str(r) in self.lost_processes:
                continue
            t0 = time.perf_counter()
            try:
                got_step, got = unpack(self.link.recv(r, f"waiting for process {r}", self.timeout_s))
            except (SiloflError, PeerModelRejected) as e:
                self._lose(r, str(e))
                continue
            if got_step == ERROR:
                raise SiloflError(f"process {r}: {got[min(got)].meta.get('error') if got else 'failed'}")
            for k in reqs:
                if k in got:
                    replies[k] = got[k]
                    self.receive_seconds[str(k)] += time.perf_counter() - t0
        self.link.flush(self.timeout_s)
        return replies

    def close(self) -> None:
        """Tell every live rank this run is over (the process group stays for the next one:
        :func:`shutdown`)."""
        for r in range(1, self.world):
            if str(r) not in self.lost_processes:
                try:
                    self.link.send(r, pack(STOP, {}))
                except RuntimeError:
                    pass
        self.link.flush(self.timeout_s)


def shutdown() -> None:
    """Leave the process group."""
    if dist.is_initialized():
        dist.destroy_process_group()


def serve(make_site: Callable[[int], SiteHandle], n_sites: int) -> bool:
    """A serving rank: build this rank's sites and run the steps rank 0 asks for until it says the run is over
    (True) or is lost (False)."""
    link = _Link(None)
    rank, world = link.rank, link.world
    sites = {k: make_site(k) for k in range(n_sites) if rank_of(k, world) == rank}
    current, started = None, False
    while True:
        try:
            step, requests = unpack(link.recv(0, "waiting for process 0", None))
        except (SiloflError, PeerModelRejected) as e:
            log.warning("process %d lost process 0 and stops: %s", rank, e)
            return False
        if step == STOP:
            return True
        # the testing hook, at each step this request carries (a batch carries several: silofl.comm.batch)
        for part, meta in _steps_of(step, requests):
            rnd = int(meta["round"]) if isinstance(meta.get("round"), int) else None
            if rnd is not None and rnd != current:
                current, started = rnd, False
            if rnd is not None and not started:
                started = True
                inject_fault(rank, rnd, "start")
            if rnd is not None and part.startswith("receive"):
                inject_fault(rank, rnd, "receiving")
        try:
            stray = sorted(set(requests) - set(sites))
            if stray:
                raise SiloflError(f"process {rank} runs no site {stray[0]}")
            frame = pack(step, run_here(sites, step, requests))
        except Exception as e:  # noqa: BLE001 - reported to rank 0, which stops the run with it
            log.exception("process %d failed in step %s", rank, step)
            frame = pack(ERROR, {0: Message({"error": f"{type(e).__name__}: {e}"})})
        link.send(0, frame)
        link.flush(None)


def _reason(e: Exception) -> str:
    text = str(e)
    if "closed by peer" in text.lower() or "connection reset" in text.lower():
        return "connection closed (the process crashed or exited)"
    return text.splitlines()[0][:200]


def _steps_of(step: str, requests: dict[int, Message]) -> list[tuple[str, dict]]:
    """(step, meta) of what a request asks, in order: itself, or a batch's parts (of the site with the
    most)."""
    from silofl.comm import batch

    if not requests:
        return []
    first = max(requests.values(), key=lambda m: len(m.meta.get("parts") or []))
    if step != batch.BATCH:
        return [(step, first.meta)]
    try:
        return [(s, m.meta) for s, m in batch.split(first)]
    except PeerModelRejected:
        return []
