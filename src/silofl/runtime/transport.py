"""The one interface algorithms use for everything that crosses a site boundary.

Algorithms call ``send(src, dst, payload_bytes)`` and ``receive(dst, sources)``; they never know
whether the bytes move within one process (:class:`InProcessTransport`, the simulator) or between
processes (:class:`~silofl.runtime.distributed.TorchDistTransport`). ``is_local(node)`` says
whether this process runs a node (in-process: every node), ``agree`` merges per-node decisions
(who stays in the protocol) so that every process sees the same ones (and, between processes, which
processes were lost), and ``gather_json`` brings
plain-JSON reports to the process that writes the run folder. Every transport counts the bytes
each node sent and received.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import defaultdict
from dataclasses import dataclass


@dataclass
class Envelope:
    src: int
    data: bytes


class Transport(ABC):
    def __init__(self) -> None:
        self.bytes_sent: dict[int, int] = defaultdict(int)
        self.bytes_received: dict[int, int] = defaultdict(int)

    @abstractmethod
    def send(self, src: int, dst: int, data: bytes) -> None: ...

    @abstractmethod
    def receive(self, dst: int, sources: list[int] | None = None) -> list[Envelope]:
        """The messages addressed to ``dst`` since its last receive, ordered by sender id. ``sources``
        lists the senders expected this round (a transport between processes waits for exactly those)."""

    def is_local(self, node: int) -> bool:
        """Whether this process runs ``node``."""
        return True

    @property
    def writes_reports(self) -> bool:
        """Whether this process writes the run folder's shared files (one process does)."""
        return True

    def agree(self, decisions: dict[int, bool], nodes: int) -> dict[int, bool]:
        """Every process's decisions for its own nodes, merged (in-process: already all of them)."""
        return dict(decisions)

    def lost_nodes(self) -> dict[int, str]:
        """Nodes whose process crashed or stopped answering -> why (in-process: none)."""
        return {}

    @property
    def isolated(self) -> bool:
        """Whether this process lost every other one (in-process: never)."""
        return False

    def all_min(self, value: int) -> int:
        """The smallest ``value`` over the live processes (in-process: ``value``)."""
        return value

    def gather_json(self, obj) -> list | None:
        """``obj`` (plain JSON) of every process, in process order, on the reporting process; else None."""
        return [obj]

    def close(self) -> None:
        return None


class InProcessTransport(Transport):
    """Mailboxes in memory; bytes are real serialized messages, so sizes and validation are real."""

    def __init__(self) -> None:
        super().__init__()
        self._boxes: dict[int, list[Envelope]] = defaultdict(list)

    def send(self, src: int, dst: int, data: bytes) -> None:
        self.bytes_sent[src] += len(data)
        self._boxes[dst].append(Envelope(src, bytes(data)))

    def receive(self, dst: int, sources: list[int] | None = None) -> list[Envelope]:
        msgs, self._boxes[dst] = self._boxes[dst], []
        for m in msgs:
            self.bytes_received[dst] += len(m.data)
        return sorted(msgs, key=lambda m: m.src)
