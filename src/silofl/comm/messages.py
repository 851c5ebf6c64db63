"""The messages of the engine seam, and their framing when they cross a process or machine boundary.

A :class:`Message` is plain JSON (``meta``) plus :class:`Packet` s: wire-format bytes (safetensors,
:mod:`silofl.comm.wire`) travelling from one node to another. Nodes are sites (ids ``0..K-1``) or a
role the coordinator plays (a server, node ``K``). An engine delivers a request message to a site and
brings back its reply; packets between two sites ride in the sender's reply and the recipient's next
request, so the coordinator routes them without ever opening them.

:func:`pack` / :func:`unpack` turn ``{node: Message}`` plus a step name into one frame of bytes and
back — JSON and raw bytes only, never pickle. Everything in a received frame is bounded and checked
before anything is allocated from it: the frame size, the header size, every declared length, the
node ids, the JSON types.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from silofl.core.errors import PeerModelRejected

MAX_FRAME_BYTES = 1 << 30  # one call's frame (all packets of all sites of one process)
MAX_HEADER_BYTES = 16 << 20
MAX_JSON_DEPTH = 64  # nesting of a frame's JSON header (a parser recursing 200,000 levels deep never returns)
# a whole string, or a bracket. Once a string has started the match cannot fail — it ends at its closing quote
# or at the header's end (an unterminated string, a lone trailing backslash) — so nothing is backtracked or
# rescanned and the scan stays linear (a failing string match from every quote made it quadratic: 20 kB of
# '"\\' took 5.8 s)
_STRUCTURE = re.compile(rb'"(?:[^"\\]|\\.)*(?:"|\\?\Z)|[\[\]{}]', re.DOTALL)


def json_depth(text: bytes, limit: int = MAX_JSON_DEPTH) -> int:
    """The nesting depth of JSON ``text`` (at most ``limit`` when it has no more brackets than that) by one
    linear scan over its strings and brackets (no recursion; brackets inside strings do not count);
    PeerModelRejected as soon as it exceeds ``limit``."""
    if (
        text.count(b"[") + text.count(b"{") <= limit
    ):  # cannot nest deeper than it has brackets (the common case)
        return limit
    depth = deepest = 0
    for m in _STRUCTURE.finditer(text):
        c = m.group()
        if c in (b"[", b"{"):
            depth += 1
            if depth > limit:
                raise PeerModelRejected(f"frame header nests deeper than {limit} levels")
            deepest = max(deepest, depth)
        elif c in (b"]", b"}"):
            depth -= 1
    return deepest


@dataclass
class Packet:
    """Wire bytes from node ``src`` to node ``dst``."""

    src: int
    dst: int
    data: bytes


@dataclass
class Message:
    """What an engine delivers to a site (a request) or brings back from it (a reply)."""

    meta: dict = field(default_factory=dict)
    packets: list[Packet] = field(default_factory=list)


def pack(step: str, messages: dict[int, Message]) -> bytes:
    """One frame: 8-byte little-endian header length, the JSON header, then every packet's bytes."""
    header = {
        "step": step,
        "messages": {
            str(k): {"meta": m.meta, "packets": [[p.src, p.dst, len(p.data)] for p in m.packets]}
            for k, m in messages.items()
        },
    }
    head = json.dumps(header, allow_nan=False).encode()
    return b"".join(
        [len(head).to_bytes(8, "little"), head, *(p.data for m in messages.values() for p in m.packets)]
    )


def _int(v, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise PeerModelRejected(f"frame: {what} must be a non-negative integer, got {v!r}")
    return v


def unpack(frame: bytes | memoryview, max_bytes: int = MAX_FRAME_BYTES) -> tuple[str, dict[int, Message]]:
    """The step and messages of a frame; PeerModelRejected with the reason if it is malformed or too large."""
    n = len(frame)
    if n > max_bytes:
        raise PeerModelRejected(f"frame of {n} bytes exceeds the limit of {max_bytes}")
    if n < 8:
        raise PeerModelRejected("frame shorter than its header length")
    hlen = int.from_bytes(bytes(frame[:8]), "little")
    if hlen > min(MAX_HEADER_BYTES, n - 8):
        raise PeerModelRejected(f"frame declares a header of {hlen} bytes in a frame of {n}")
    head = bytes(frame[8 : 8 + hlen])
    json_depth(head)  # bounded before the (recursive) parser sees it
    try:
        header = json.loads(head)
    except (ValueError, RecursionError) as e:
        raise PeerModelRejected(f"frame header is not JSON: {e}") from None
    if (
        not isinstance(header, dict)
        or not isinstance(header.get("step"), str)
        or not isinstance(header.get("messages"), dict)
    ):
        raise PeerModelRejected("frame header must hold a step name and a mapping of messages")
    offset, out = 8 + hlen, {}
    for key, m in header["messages"].items():
        if (
            not key.isdigit()
            or not isinstance(m, dict)
            or not isinstance(m.get("meta"), dict)
            or not isinstance(m.get("packets"), list)
        ):
            raise PeerModelRejected(f"frame: malformed message for node {key!r}")
        packets = []
        for desc in m["packets"]:
            if not isinstance(desc, list) or len(desc) != 3:
                raise PeerModelRejected("frame: a packet is described by [src, dst, length]")
            src, dst, length = (_int(v, w) for v, w in zip(desc, ("src", "dst", "length"), strict=True))
            if length > n - offset:
                raise PeerModelRejected(f"frame: a packet declares {length} bytes, {n - offset} remain")
            packets.append(Packet(src, dst, bytes(frame[offset : offset + length])))
            offset += length
        out[int(key)] = Message(m["meta"], packets)
    if offset != n:
        raise PeerModelRejected(f"frame: {n - offset} bytes after the last packet")
    return header["step"], out
