"""What the protocol's messages look like on the wire (safetensors via :mod:`silofl.comm.wire`, never
pickle), and their bounded, validated parsing: a masked vector (the narrowest integer type that holds the
group) with the sealed shares for the neighbours, and the sealed shares the server forwards."""

from __future__ import annotations

import numpy as np
import torch

from silofl.comm import wire
from silofl.core.errors import PeerModelRejected
from silofl.secure.protocol import SEALED_SHARE_BYTES

MASKED = "masked"
SHARE = "share_"
MAX_SHARES = 1 << 16
_OVERHEAD = 1 << 16  # safetensors header and metadata


def _int_dtype(bits: int) -> tuple[torch.dtype, type]:
    return (torch.int32, np.uint32) if bits <= 32 else (torch.int64, np.uint64)


def _shares(tensors: dict[str, torch.Tensor], allowed: set[int] | None) -> dict[int, bytes]:
    out = {}
    for name, t in tensors.items():
        key = name.removeprefix(SHARE)
        if not name.startswith(SHARE) or not key.isdigit() or len(key) > 6:
            raise PeerModelRejected(f"unexpected tensor {name[:40]!r}")
        v = int(key)
        if allowed is not None and v not in allowed:
            raise PeerModelRejected(f"a share for party {v}, not a neighbour")
        if t.dtype != torch.uint8 or tuple(t.shape) != (SEALED_SHARE_BYTES,):
            raise PeerModelRejected(f"{name}: not a sealed share")
        out[v] = bytes(t.numpy().tobytes())
    return out


def _share_tensors(sealed: dict[int, bytes]) -> dict[str, torch.Tensor]:
    return {f"{SHARE}{v}": torch.frombuffer(bytearray(b), dtype=torch.uint8) for v, b in sealed.items()}


def pack_masked(y: np.ndarray, sealed: dict[int, bytes], bits: int, meta: dict) -> bytes:
    """A party's step-1 message: its masked vector and its sealed shares."""
    tdtype, ndtype = _int_dtype(bits)
    y = np.ascontiguousarray(np.asarray(y, dtype=np.uint64).astype(ndtype))
    view = y.view(np.int32 if ndtype is np.uint32 else np.int64)
    return wire.encode({MASKED: torch.from_numpy(view.copy()), **_share_tensors(sealed)}, meta=meta)


def unpack_masked(
    data: bytes, dim: int, bits: int, expect: dict, max_shares: int = MAX_SHARES
) -> tuple[np.ndarray, dict[int, bytes]]:
    """(masked vector as uint64, sealed shares) of a step-1 message; PeerModelRejected if it is not one."""
    tdtype, ndtype = _int_dtype(bits)
    limit = dim * (4 if ndtype is np.uint32 else 8) + max_shares * (SEALED_SHARE_BYTES + 64) + _OVERHEAD
    tensors, meta = wire.decode(data, max_bytes=limit)
    for k, v in expect.items():
        if meta.get(k) != v:
            raise PeerModelRejected(f"message {k} is {meta.get(k)!r}, expected {v!r} (replayed or forged)")
    masked = tensors.pop(MASKED, None)
    if masked is None or masked.dtype != tdtype or tuple(masked.shape) != (dim,):
        raise PeerModelRejected(f"the masked vector must be {dim} elements of {tdtype}")
    y = masked.numpy().view(ndtype).astype(np.uint64)
    if len(tensors) > max_shares:
        raise PeerModelRejected("too many shares")
    return y, _shares(tensors, None)


def pack_shares(sealed: dict[int, bytes], meta: dict) -> bytes:
    """The sealed shares the server forwards to one party (keyed by their sender)."""
    return wire.encode(_share_tensors(sealed), meta=meta)


def unpack_shares(data: bytes, expect: dict, allowed: set[int]) -> dict[int, bytes]:
    """The forwarded shares, each from one of ``allowed``; PeerModelRejected otherwise."""
    limit = len(allowed) * (SEALED_SHARE_BYTES + 64) + _OVERHEAD
    tensors, meta = wire.decode(data, max_bytes=limit)
    for k, v in expect.items():
        if meta.get(k) != v:
            raise PeerModelRejected(f"message {k} is {meta.get(k)!r}, expected {v!r} (replayed or forged)")
    return _shares(tensors, allowed)
