"""One process per site on ``torch.distributed`` (gloo on CPU), launched by torchrun or by
``silofl launch --survive-faults``.

Nodes map to processes (ranks): client k runs on rank ``k % world``, a server node (id = number of
clients) on rank 0, which also writes the run folder. A message is two tensors sent point to point
with ``isend``/``irecv``: a header ``[src, dst, length]`` (int64) and the payload bytes (uint8) —
tensors cross as tensors, nothing is pickled. The tag is the destination node, so two nodes on one
rank never take each other's messages, and messages between a pair of ranks keep their order.
Messages between nodes on the same rank stay in memory.

Faults (crash-stop). Every wait has a timeout. A peer process whose connection closes (a crash) or
that does not answer within the timeout (a hang) is marked *lost*: nothing is sent to it or awaited
from it again, and its nodes leave the protocol. Who is lost is merged in :meth:`agree`, which
replaces a collective by point-to-point exchanges among the live processes (a collective would
fail with a dead member): every process sends its decisions and the processes it has lost to every
live one, twice, and takes the union, so every live process ends the exchange with the same view
unless another process fails during it (then the next round's exchange merges it). A process that
loses every other process stops its own clients (it may be the one that was cut off).
``gather_json`` brings each live rank's plain-JSON report to rank 0 as bytes; if rank 0 is lost no
run folder is written (each process still writes its own clients' models).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections import defaultdict
from datetime import timedelta

import torch
import torch.distributed as dist

from silofl.errors import ConfigError, SiloflError
from silofl.runtime.transport import Envelope, Transport

log = logging.getLogger("silofl")

REPORT_TAG = 1_000_000  # tag of gather_json messages (node ids are below it)
AGREE_TAG = 1_000_001  # tag of agree's exchanges
# methods whose rounds run across processes so far; CWT, Joint and the client-level methods do not yet
SUPPORTED = ("proxyfl", "avgpush", "fedavg", "fml", "regular")
GLOO_TIMEOUT = timedelta(days=7)
FAULT_ENV = "SILOFL_INJECT_FAULT"  # testing hook: "RANK:ROUND:KIND", see inject_fault
FAULT_KINDS = ("crash", "hang", "crash-receiving", "hang-receiving")


def check_method(method: str) -> None:
    if method not in SUPPORTED:
        raise ConfigError(f"method {method!r} does not run across processes yet; use one of: {', '.join(SUPPORTED)} "
                          "(or `silofl run` in one process)")


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
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                              timeout=timeout)
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        dist.init_process_group(backend, store=dist.PrefixStore(f"silofl/attempt{attempt}", store), rank=rank,
                                world_size=world, timeout=timeout)
    else:
        dist.init_process_group(backend, timeout=timeout)


def inject_fault(rank: int, rnd: int, stage: str = "start") -> None:
    """Testing hook: ``SILOFL_INJECT_FAULT=R:N:KIND`` makes process R fail in round N. ``crash`` kills it
    (SIGKILL, no clean-up) at the start of the round, ``hang`` stops it there (SIGSTOP: it neither answers
    nor closes its connections); ``crash-receiving`` / ``hang-receiving`` do so mid-round, after it
    trained and sent, when it starts receiving. Only on a first start under torchrun (a restarted
    worker runs on)."""
    spec = os.environ.get(FAULT_ENV)
    if not spec or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    try:
        r, n, kind = spec.split(":")
        r, n = int(r), int(n)
        if kind not in FAULT_KINDS:
            raise ValueError
    except ValueError:
        raise ConfigError(f"{FAULT_ENV} takes RANK:ROUND:KIND (KIND one of {', '.join(FAULT_KINDS)}), "
                          f"got {spec!r}") from None
    at = "receiving" if kind.endswith("-receiving") else "start"
    if (r, n, at) == (rank, rnd, stage):
        log.warning("process %d: injected %s in round %d", rank, kind, rnd)
        os.kill(os.getpid(), signal.SIGKILL if kind.startswith("crash") else signal.SIGSTOP)


class TorchDistTransport(Transport):
    def __init__(self, clients: int, timeout_s: float = 300.0):
        super().__init__()
        if not dist.is_initialized():
            raise SiloflError("torch.distributed is not initialised: start the run with `silofl launch`")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if self.world > clients:
            raise SiloflError(f"{self.world} processes for {clients} clients: use at most one process per client")
        self.clients = clients
        self.timeout = timedelta(seconds=timeout_s)
        # point-to-point traffic on its own group, whose gloo timeout never fires (see _wait)
        self.group = dist.new_group(list(range(self.world)), timeout=GLOO_TIMEOUT, backend="gloo")
        self._local_boxes: dict[int, list[Envelope]] = defaultdict(list)
        self.wait_s: dict[int, float] = defaultdict(float)  # seconds each node spent receiving (waiting included)
        self._pending: list = []  # (work, peer rank, tensor) of isends in flight: the buffers must outlive them
        self.lost: dict[int, str] = {}  # rank -> why it was lost
        self.round = 0  # set by the runner each round (for fault injection only)

    def rank_of(self, node: int) -> int:
        return 0 if node >= self.clients else node % self.world

    def is_local(self, node: int) -> bool:
        return self.rank_of(node) == self.rank

    @property
    def writes_reports(self) -> bool:
        return self.rank == 0

    def live_ranks(self) -> list[int]:
        return [r for r in range(self.world) if r != self.rank and r not in self.lost]

    def lost_nodes(self) -> dict[int, str]:
        """Nodes of lost processes (clients and, on rank 0, the server) -> why."""
        nodes = range(self.clients + 1)
        return {n: self.lost[self.rank_of(n)] for n in nodes if self.rank_of(n) in self.lost}

    def _lose(self, rank: int, why: str) -> None:
        if rank not in self.lost and rank != self.rank:
            log.warning("process %d lost process %d: %s", self.rank, rank, why)
            self.lost[rank] = why

    def _isend(self, tensor: torch.Tensor, peer: int, tag: int) -> None:
        if peer in self.lost:
            return
        try:
            self._pending.append((dist.isend(tensor, peer, tag=tag, group=self.group), peer, tensor))
        except RuntimeError as e:
            self._lose(peer, f"sending: {_reason(e)}")

    def _irecv(self, buf: torch.Tensor, peer: int, tag: int, what: str) -> bool:
        """Receive into ``buf`` from ``peer`` within the timeout; False (and the peer lost) if it failed."""
        if peer in self.lost:
            return False
        try:
            work = dist.irecv(buf, peer, tag=tag, group=self.group)
        except RuntimeError as e:  # the connection to that peer already failed
            self._lose(peer, f"{what}: {_reason(e)}")
            return False
        return self._wait(work, peer, what)

    def _wait(self, work, peer: int, what: str) -> bool:
        """Wait for one operation up to the timeout; False (and the peer lost) if it failed or timed out.

        The timeout is ours: gloo's wait runs in a helper thread on a process group whose own timeout is
        far away, because a timeout inside gloo closes every connection of the process (gloo's context
        signals it to all pairs). A wait given up on stays in its thread until that peer sends or its
        connection closes; that peer is never used again. A crashed peer fails the wait at once
        (connection closed)."""
        box: dict = {}

        def wait() -> None:
            try:
                work.wait()
                box["ok"] = True
            except RuntimeError as e:
                box["error"] = e

        helper = threading.Thread(target=wait, daemon=True)
        helper.start()
        helper.join(self.timeout.total_seconds())
        if "ok" in box:
            return True
        why = _reason(box["error"]) if "error" in box else f"no answer within {self.timeout.total_seconds():g} s"
        self._lose(peer, f"{what}: {why}")
        return False

    # ------------------------------------------------------------------ point to point
    def send(self, src: int, dst: int, data: bytes) -> None:
        if self.is_local(dst):
            self.bytes_sent[src] += len(data)
            self._local_boxes[dst].append(Envelope(src, bytes(data)))
            return
        peer = self.rank_of(dst)
        if peer in self.lost:
            return
        self.bytes_sent[src] += len(data)
        header = torch.tensor([src, dst, len(data)], dtype=torch.int64)
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)
        self._isend(header, peer, dst)
        self._isend(payload, peer, dst)

    def _recv(self, src: int, dst: int) -> bytes | None:
        peer = self.rank_of(src)
        if peer in self.lost:
            return None
        header = torch.zeros(3, dtype=torch.int64)
        what = f"node {dst} waiting for node {src}"
        if not self._irecv(header, peer, dst, what):
            return None
        h_src, h_dst, n = (int(v) for v in header)
        if (h_src, h_dst) != (src, dst):
            raise SiloflError(f"node {dst} expected a message from node {src}, got one from {h_src} to {h_dst}")
        payload = torch.zeros(n, dtype=torch.uint8)
        if n and not self._irecv(payload, peer, dst, what):
            return None
        return payload.numpy().tobytes()

    def receive(self, dst: int, sources: list[int] | None = None) -> list[Envelope]:
        inject_fault(self.rank, self.round, "receiving")
        msgs, self._local_boxes[dst] = self._local_boxes[dst], []
        t0 = time.perf_counter()
        for src in sources or []:
            if not self.is_local(src):
                data = self._recv(src, dst)
                if data is not None:
                    msgs.append(Envelope(src, data))
        self.wait_s[dst] += time.perf_counter() - t0
        for m in msgs:
            self.bytes_received[dst] += len(m.data)
        # no flush here: a peer may still be about to post the receive for one of our sends (a rank
        # hosting several nodes receives for them one after another); sends complete at the next agree
        return sorted(msgs, key=lambda m: m.src)

    def flush(self) -> None:
        """Wait for this process's sends to complete (their buffers can then be freed)."""
        for work, peer, _ in self._pending:
            if peer not in self.lost:
                self._wait(work, peer, "sending")
        self._pending.clear()

    # ------------------------------------------------------------------ exchanges among live processes
    def _exchange(self, row: torch.Tensor, tag: int) -> dict[int, torch.Tensor]:
        """Send ``row`` to every live process and take theirs ({rank: row}, own included); a process that
        does not answer in time is lost."""
        peers = self.live_ranks()
        for r in peers:
            self._isend(row, r, tag)
        got = {self.rank: row}
        for r in peers:
            buf = torch.zeros_like(row)
            if self._irecv(buf, r, tag, "exchange"):
                got[r] = buf
        return got

    def agree(self, decisions: dict[int, bool], nodes: int) -> dict[int, bool]:
        """Every live process's decisions for its own nodes, and a merged view of which processes are lost
        (two exchanges, so a loss seen by one process reaches all)."""
        self.flush()
        said = torch.zeros(2 * nodes + self.world, dtype=torch.int64)  # has an opinion | says yes | rank lost
        for node, ok in decisions.items():
            said[node], said[nodes + node] = 1, int(bool(ok))
        for _ in range(2):
            for r in self.lost:
                said[2 * nodes + r] = 1
            rows = self._exchange(said.clone(), AGREE_TAG)
            for r, row in rows.items():
                for lost in torch.nonzero(row[2 * nodes:]).flatten().tolist():
                    if lost != self.rank:
                        self._lose(lost, f"lost by process {r}" if r != self.rank else self.lost.get(lost, ""))
            merged = torch.stack(list(rows.values())).amax(0)
            said[: 2 * nodes] = merged[: 2 * nodes]
        self.flush()
        return {k: bool(said[nodes + k]) for k in range(nodes) if said[k] and self.rank_of(k) not in self.lost}

    @property
    def isolated(self) -> bool:
        """Whether every other process is lost (this one may be the one that was cut off)."""
        return self.world > 1 and not self.live_ranks()

    def all_min(self, value: int) -> int:
        """The smallest ``value`` over the live processes."""
        rows = self._exchange(torch.tensor([value], dtype=torch.int64), AGREE_TAG)
        return int(min(int(v) for v in rows.values()))

    def gather_json(self, obj) -> list | None:
        self.flush()
        data = json.dumps(obj).encode()
        if self.rank != 0:
            if 0 not in self.lost:
                self._isend(torch.tensor([len(data)], dtype=torch.int64), 0, REPORT_TAG)
                self._isend(torch.frombuffer(bytearray(data), dtype=torch.uint8), 0, REPORT_TAG)
                self.flush()
            return None
        out = [obj]
        for r in self.live_ranks():
            n = torch.zeros(1, dtype=torch.int64)
            if not self._irecv(n, r, REPORT_TAG, "report"):
                continue
            buf = torch.zeros(int(n), dtype=torch.uint8)
            if self._irecv(buf, r, REPORT_TAG, "report"):
                out.append(json.loads(buf.numpy().tobytes()))
        return out

    def close(self) -> None:
        """Finish sends, wait until every live process got here (so none exits while another still
        needs its messages), and leave the process group."""
        self.flush()
        if self.live_ranks():
            self._exchange(torch.zeros(1, dtype=torch.int64), AGREE_TAG)
        self.flush()
        if dist.is_initialized():
            dist.destroy_process_group()


def _reason(e: Exception) -> str:
    text = str(e)
    if "closed by peer" in text.lower() or "connection reset" in text.lower():
        return "connection closed (the process crashed or exited)"
    return text.splitlines()[0][:200]
