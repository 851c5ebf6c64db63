"""The one interface algorithms use for everything that crosses a site boundary.

Algorithms call ``send(src, dst, payload_bytes)`` and ``receive(dst)``; they never know whether the
bytes move within one process (:class:`InProcessTransport`, the simulator) or between processes.
Every transport counts the bytes each client sent and received.
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
    def receive(self, dst: int) -> list[Envelope]:
        """All messages addressed to ``dst`` since its last receive, in send order."""


class InProcessTransport(Transport):
    """Mailboxes in memory; bytes are real serialized messages, so sizes and validation are real."""

    def __init__(self) -> None:
        super().__init__()
        self._boxes: dict[int, list[Envelope]] = defaultdict(list)

    def send(self, src: int, dst: int, data: bytes) -> None:
        self.bytes_sent[src] += len(data)
        self._boxes[dst].append(Envelope(src, bytes(data)))

    def receive(self, dst: int) -> list[Envelope]:
        msgs, self._boxes[dst] = self._boxes[dst], []
        for m in msgs:
            self.bytes_received[dst] += len(m.data)
        return msgs
