"""Arithmetic in the group Z_{2**bits} on uint64 numpy vectors, and masks: a 32-byte seed expanded by the
ChaCha20 stream cipher (``cryptography``) into uniform elements of the group."""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

MAX_BITS = 62  # sums of up to 2**(64-62) masks stay exact in uint64 before the reduction


def check_bits(bits: int) -> int:
    """``bits`` if it is an integer in [1, MAX_BITS], else ValueError."""
    if not isinstance(bits, int) or isinstance(bits, bool) or not 1 <= bits <= MAX_BITS:
        raise ValueError(f"bits must be an integer in [1, {MAX_BITS}], got {bits!r}")
    return bits


def modulus_mask(bits: int) -> np.uint64:
    """2**bits − 1 as a uint64 (reducing mod 2**bits is a bitwise and with it)."""
    return np.uint64((1 << check_bits(bits)) - 1)


def reduce(x: np.ndarray, bits: int) -> np.ndarray:
    """``x`` (uint64) reduced into [0, 2**bits)."""
    return np.bitwise_and(np.asarray(x, dtype=np.uint64), modulus_mask(bits))


def add(a: np.ndarray, b: np.ndarray, bits: int) -> np.ndarray:
    """a + b in Z_{2**bits} (uint64 arithmetic wraps modulo 2**64, a multiple of 2**bits)."""
    with np.errstate(over="ignore"):
        return reduce(np.asarray(a, dtype=np.uint64) + np.asarray(b, dtype=np.uint64), bits)


def sub(a: np.ndarray, b: np.ndarray, bits: int) -> np.ndarray:
    """a − b in Z_{2**bits}."""
    with np.errstate(over="ignore"):
        return reduce(np.asarray(a, dtype=np.uint64) - np.asarray(b, dtype=np.uint64), bits)


def expand(seed: bytes, n: int, bits: int) -> np.ndarray:
    """``n`` uniform elements of Z_{2**bits} from a single-use 32-byte ``seed`` (ChaCha20 keystream, zero
    nonce: every seed is derived for one purpose and one round, never reused)."""
    if len(seed) != 32:
        raise ValueError("a mask seed is 32 bytes")
    if n < 0:
        raise ValueError("negative length")
    enc = Cipher(algorithms.ChaCha20(seed, b"\0" * 16), mode=None).encryptor()
    stream = enc.update(b"\0" * (8 * n))
    return reduce(np.frombuffer(stream, dtype="<u8").astype(np.uint64), bits)
