"""Key agreement and the keys derived from it: X25519 (``cryptography``), HKDF-SHA256 bound to the
session, the pair and the purpose, and ChaCha20-Poly1305 for the shares that travel between neighbours
through the server."""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

PUBLIC_KEY_BYTES = 32
NONCE_BYTES = 12
LABEL = b"silofl secagg v1"


def new_private_key() -> X25519PrivateKey:
    """A fresh X25519 private key from the operating system's randomness."""
    return X25519PrivateKey.generate()


def public_bytes(sk: X25519PrivateKey) -> bytes:
    """The raw 32 bytes of ``sk``'s public key."""
    return sk.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def load_public(raw: bytes) -> X25519PublicKey:
    """An X25519 public key from its raw 32 bytes (ValueError on any other input)."""
    if not isinstance(raw, bytes | bytearray) or len(raw) != PUBLIC_KEY_BYTES:
        raise ValueError("an X25519 public key is 32 bytes")
    return X25519PublicKey.from_public_bytes(bytes(raw))


def agree(sk: X25519PrivateKey, peer: bytes) -> bytes:
    """The raw X25519 shared secret with ``peer`` (ValueError for a low-order / invalid point)."""
    return sk.exchange(load_public(peer))


def _pair(a: int, b: int) -> bytes:
    lo, hi = sorted((a, b))
    return lo.to_bytes(4, "big") + hi.to_bytes(4, "big")


def derive(shared: bytes, session: bytes, purpose: bytes, a: int, b: int, rnd: int = 0) -> bytes:
    """A 32-byte key for ``purpose`` between parties ``a`` and ``b`` in round ``rnd`` of ``session``."""
    info = LABEL + b"|" + purpose + b"|" + _pair(a, b) + rnd.to_bytes(8, "big")
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=session, info=info).derive(shared)


def associated_data(session: bytes, rnd: int, src: int, dst: int) -> bytes:
    """What a sealed share is bound to: the session, the round, its sender and its addressee."""
    return LABEL + session + rnd.to_bytes(8, "big") + src.to_bytes(4, "big") + dst.to_bytes(4, "big")


def seal(key: bytes, plaintext: bytes, ad: bytes) -> bytes:
    """ChaCha20-Poly1305 of ``plaintext`` under ``key`` bound to ``ad``: a fresh random nonce, then the
    ciphertext with its tag."""
    nonce = os.urandom(NONCE_BYTES)
    return nonce + ChaCha20Poly1305(key).encrypt(nonce, plaintext, ad)


def open_sealed(key: bytes, blob: bytes, ad: bytes) -> bytes:
    """The plaintext, or ValueError when the ciphertext was altered, replayed or misaddressed."""
    if len(blob) < NONCE_BYTES + 16:
        raise ValueError("ciphertext too short")
    try:
        return ChaCha20Poly1305(key).decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], ad)
    except InvalidTag:
        raise ValueError("ciphertext failed authentication") from None
