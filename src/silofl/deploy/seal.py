"""End-to-end sealed payloads between sites: the relay (Flower's SuperLink and the coordinator's
ServerApp) carries them but can neither read, forge nor replay them.

A payload from site A to site B is

* **encrypted to B**: an ephemeral X25519 key agreed with B's pinned X25519 key, HKDF-SHA256 to a
  ChaCha20-Poly1305 key; the associated data is the *context* below;
* **signed by A**: Ed25519 over everything (context, ephemeral key, nonce, ciphertext), checked against
  A's pinned Ed25519 key *before* anything is decrypted;
* **bound to its context**: run id, sender, recipient, round, step and index. The round, step and index
  travel in the clear (the relay knows them anyway); the recipient checks the run and itself, refuses a
  round outside the window it expects and any context it has opened before (a replay).

Layout: ``b"SFS1"`` | header length (2 bytes) | JSON header | ephemeral key (32) | nonce (12) |
signature (64) | ciphertext. Everything is bounded and checked before use.
"""

from __future__ import annotations

import json
import os

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ed25519, x25519
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from silofl.core.errors import PeerModelRejected
from silofl.deploy.pki import public_raw

MAGIC = b"SFS1"
MAX_HEADER = 512
OVERHEAD = 4 + 2 + 32 + 12 + 64 + 16  # plus the header


def _context(run_id: str, src: str, dst: str, header: bytes) -> bytes:
    return json.dumps({"run": run_id, "src": src, "dst": dst}, sort_keys=True).encode() + b"|" + header


def _key(shared: bytes, eph: bytes, recipient: bytes) -> bytes:
    return HKDF(hashes.SHA256(), 32, salt=None, info=b"silofl seal v1" + eph + recipient).derive(shared)


def seal(
    data: bytes,
    *,
    run_id: str,
    src: str,
    dst: str,
    rnd: int,
    step: str,
    index: int,
    sign_key: ed25519.Ed25519PrivateKey,
    recipient: x25519.X25519PublicKey,
) -> bytes:
    """``data`` sealed from site ``src`` to site ``dst`` (see the module doc)."""
    header = json.dumps({"round": int(rnd), "step": step, "i": int(index)}, sort_keys=True).encode()
    if len(header) > MAX_HEADER:
        raise ValueError("seal header too long")
    eph = x25519.X25519PrivateKey.generate()
    eph_pub, rec_pub = public_raw(eph.public_key()), public_raw(recipient)
    ctx = _context(run_id, src, dst, header)
    nonce = os.urandom(12)
    ct = ChaCha20Poly1305(_key(eph.exchange(recipient), eph_pub, rec_pub)).encrypt(nonce, data, ctx)
    sig = sign_key.sign(MAGIC + ctx + eph_pub + nonce + ct)
    return MAGIC + len(header).to_bytes(2, "little") + header + eph_pub + nonce + sig + ct


def header_of(blob: bytes) -> dict:
    """The clear header (round, step, index) of a sealed payload; PeerModelRejected if malformed."""
    if len(blob) < OVERHEAD or blob[:4] != MAGIC:
        raise PeerModelRejected("not a sealed payload (a site sent it unsealed, or it was altered)")
    n = int.from_bytes(blob[4:6], "little")
    if n > MAX_HEADER or len(blob) < OVERHEAD + n:
        raise PeerModelRejected("sealed payload: bad header length")
    try:
        h = json.loads(blob[6 : 6 + n])
    except ValueError:
        raise PeerModelRejected("sealed payload: header is not JSON") from None
    if not (
        isinstance(h, dict)
        and isinstance(h.get("round"), int)
        and isinstance(h.get("step"), str)
        and isinstance(h.get("i"), int)
    ):
        raise PeerModelRejected("sealed payload: malformed header")
    return h


def open_sealed(
    blob: bytes,
    *,
    run_id: str,
    src: str,
    dst: str,
    seal_key: x25519.X25519PrivateKey,
    sender: ed25519.Ed25519PublicKey,
) -> tuple[dict, bytes]:
    """(header, data) of a payload sealed by ``src`` to this site ``dst``; PeerModelRejected if it is not
    signed by ``src``'s pinned key for this run and recipient, or does not decrypt."""
    h = header_of(blob)
    n = int.from_bytes(blob[4:6], "little")
    header = blob[6 : 6 + n]
    rest = blob[6 + n :]
    eph_pub, nonce, sig, ct = rest[:32], rest[32:44], rest[44:108], rest[108:]
    ctx = _context(run_id, src, dst, header)
    try:
        sender.verify(sig, MAGIC + ctx + eph_pub + nonce + ct)
    except InvalidSignature:
        raise PeerModelRejected(
            f"sealed payload claiming to be from {src} fails its signature (forged, altered, or "
            "sealed for another run or recipient)"
        ) from None
    try:
        eph = x25519.X25519PublicKey.from_public_bytes(eph_pub)
        key = _key(seal_key.exchange(eph), eph_pub, public_raw(seal_key.public_key()))
        data = ChaCha20Poly1305(key).decrypt(nonce, ct, ctx)
    except (InvalidTag, ValueError):
        raise PeerModelRejected(f"sealed payload from {src} does not decrypt") from None
    return h, data


class ReplayGuard:
    """The contexts a site has opened in a run: each may be opened once, and only in the rounds expected."""

    def __init__(self, window: int = 1):
        self.window = window
        self.seen: set[tuple] = set()

    def check(self, src: str, header: dict, current_round: int | None) -> None:
        """PeerModelRejected for a replayed payload or one from a round outside [current − window,
        current]."""
        rnd = header["round"]
        if current_round is not None and not current_round - self.window <= rnd <= current_round:
            raise PeerModelRejected(
                f"sealed payload from {src} is for round {rnd}, this site is in round "
                f"{current_round} (replayed or delayed)"
            )
        key = (src, rnd, header["step"], header["i"])
        if key in self.seen:
            raise PeerModelRejected(
                f"sealed payload from {src} (round {rnd}, {header['step']}) was already delivered: a replay"
            )

    def mark(self, src: str, header: dict, current_round: int | None) -> None:
        """Record a payload as delivered — only once it opened (a forged one must not use up its slot)."""
        self.seen.add((src, header["round"], header["step"], header["i"]))
        if current_round is not None:  # forget what can no longer pass the round window
            self.seen = {k for k in self.seen if k[1] >= current_round - self.window}
