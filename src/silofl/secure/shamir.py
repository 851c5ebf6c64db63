"""Shamir secret sharing over the prime field GF(2**521 − 1) on Python ints (a Mersenne prime: a 256-bit
secret fits with room to spare). Coefficients come from :mod:`secrets`. :func:`combine` checks every share
beyond the threshold against the polynomial the first ``t`` define, so a wrong share is detected, not
silently used."""

from __future__ import annotations

import secrets

PRIME = (1 << 521) - 1
SHARE_BYTES = 66  # one field element, big-endian


class ShareError(ValueError):
    """Shares that cannot be combined (too few, duplicated, out of range, or inconsistent)."""


def split(secret: int, threshold: int, xs: list[int]) -> dict[int, int]:
    """Shares ``{x: f(x)}`` of ``secret`` at the distinct non-zero points ``xs``; any ``threshold`` of them
    determine it, fewer reveal nothing."""
    if not 0 <= secret < PRIME:
        raise ValueError("secret outside the field")
    if not 1 <= threshold <= len(xs):
        raise ValueError(f"threshold {threshold} must lie in [1, {len(xs)}]")
    if len(set(xs)) != len(xs) or any(not 0 < x < PRIME for x in xs):
        raise ValueError("share points must be distinct and non-zero")
    coeffs = [secret] + [secrets.randbelow(PRIME) for _ in range(threshold - 1)]
    return {x: _evaluate(coeffs, x) for x in xs}


def _evaluate(coeffs: list[int], x: int) -> int:
    y = 0
    for c in reversed(coeffs):
        y = (y * x + c) % PRIME
    return y


def _interpolate(points: list[tuple[int, int]], at: int) -> int:
    """The value at ``at`` of the polynomial of degree < len(points) through ``points`` (Lagrange)."""
    total = 0
    for i, (xi, yi) in enumerate(points):
        num = den = 1
        for j, (xj, _) in enumerate(points):
            if i != j:
                num = num * (at - xj) % PRIME
                den = den * (xi - xj) % PRIME
        total = (total + yi * num * pow(den, -1, PRIME)) % PRIME
    return total


def combine(shares: dict[int, int], threshold: int) -> int:
    """The secret from at least ``threshold`` shares; ShareError if there are too few or any share beyond
    the first ``threshold`` disagrees with them."""
    if threshold < 1 or len(shares) < threshold:
        raise ShareError(f"{len(shares)} shares, {threshold} needed")
    pts = sorted(shares.items())
    for x, y in pts:
        if not (isinstance(x, int) and isinstance(y, int) and 0 < x < PRIME and 0 <= y < PRIME):
            raise ShareError("a share lies outside the field")
    base = pts[:threshold]
    for x, y in pts[threshold:]:
        if _interpolate(base, x) != y:
            raise ShareError(f"the share at {x} is inconsistent with the others")
    return _interpolate(base, 0)


def to_bytes(y: int) -> bytes:
    """A share's value as SHARE_BYTES big-endian bytes."""
    return int(y).to_bytes(SHARE_BYTES, "big")


def from_bytes(b: bytes) -> int:
    """A share's value from its bytes (ShareError unless SHARE_BYTES long and below the prime)."""
    if len(b) != SHARE_BYTES:
        raise ShareError(f"a share is {SHARE_BYTES} bytes, got {len(b)}")
    y = int.from_bytes(b, "big")
    if y >= PRIME:
        raise ShareError("a share lies outside the field")
    return y
