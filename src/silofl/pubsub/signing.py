"""Signed published models: the publisher signs every model it releases, and the broker and every
subscriber verify the signature against the publisher's registered Ed25519 key before using it.

A signed model is the ordinary safetensors blob of :meth:`PublishedModel.to_bytes` with two more entries in
its header metadata: ``silofl.release`` (the release receipt: the publisher's name and public key, the spend
its ledger declares for the released records *including this release*, its lifetime budget, the ledger entry
that recorded it and, optionally, the public feature metadata a new site joins the broker with) and
``silofl.signature`` (Ed25519 over :func:`canonical_bytes`). The signature covers the model's metadata string
exactly as published, the receipt's canonical JSON and every tensor (name, dtype, shape, raw bytes), so
neither the broker nor anyone on the way can change a model, its (ε, δ) or its declared spend unnoticed.

The signing key lives in the site's own folder (``keys/sign.key``, :mod:`silofl.site.folder`, mode 0600)
and never leaves it; only the public key (32 bytes, hex) is given to the broker's operator.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

import torch
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from silofl.core.errors import ModelRejected

MODEL_KEY, RELEASE_KEY, SIGNATURE_KEY = "silofl.pubsub", "silofl.release", "silofl.signature"
SIGNED_FORMAT = "silofl.pubsub.signed/1"
SIGN_KEY_FILE = "sign.key"
MAX_HEADER = 1 << 20  # a safetensors header larger than this is refused before it is parsed


def load_signing_key(folder: str | Path) -> Ed25519PrivateKey:
    """The site's Ed25519 signing key in ``folder/sign.key`` (created with mode 0600 on first use)."""
    path = Path(folder) / SIGN_KEY_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(32).hex())
    try:
        raw = bytes.fromhex(path.read_text().strip())
        return Ed25519PrivateKey.from_private_bytes(raw)
    except ValueError:
        raise ModelRejected(f"{path} is not an Ed25519 signing key") from None


def public_key_hex(key: Ed25519PrivateKey) -> str:
    """The public half of a signing key, as 64 hex digits."""
    from silofl.deploy.pki import public_raw

    return public_raw(key.public_key()).hex()


def parse_public_key(text: str) -> Ed25519PublicKey:
    """An Ed25519 public key from 64 hex digits (ModelRejected otherwise)."""
    try:
        raw = bytes.fromhex(str(text))
        if len(raw) != 32:
            raise ValueError
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        raise ModelRejected(f"not an Ed25519 public key (64 hex digits): {str(text)[:80]!r}") from None


def _lp(b: bytes) -> bytes:
    return struct.pack(">Q", len(b)) + b


def _canonical_json(obj) -> bytes:
    from silofl.privacy.ledger import canonical_json

    try:
        return canonical_json(obj)
    except ValueError:
        raise ModelRejected("the release receipt holds a non-finite number") from None


def canonical_bytes(model_meta: str, release: dict, tensors: dict[str, torch.Tensor]) -> bytes:
    """What a signature covers: the model's metadata string, the receipt and every tensor, length-prefixed."""
    parts = [SIGNED_FORMAT.encode(), _lp(model_meta.encode()), _lp(_canonical_json(release))]
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        parts += [
            _lp(name.encode()),
            _lp(str(t.dtype).encode()),
            _lp(json.dumps(list(t.shape)).encode()),
            _lp(t.reshape(-1).view(torch.uint8).numpy().tobytes()),
        ]
    return b"".join(parts)


def header_metadata(data: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors blob, read with its size bounded first."""
    if len(data) < 8:
        raise ModelRejected("not a safetensors blob (shorter than its header length)")
    n = int.from_bytes(data[:8], "little")
    if n > min(MAX_HEADER, len(data) - 8):
        raise ModelRejected(
            f"safetensors header of {n} bytes is larger than the blob or the {MAX_HEADER}-byte bound"
        )
    try:
        meta = json.loads(data[8 : 8 + n]).get("__metadata__") or {}
    except (ValueError, AttributeError):
        raise ModelRejected("the safetensors header is not JSON") from None
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ModelRejected("the safetensors metadata is not a mapping of strings")
    return meta


def sign_model(data: bytes, key: Ed25519PrivateKey, release: dict) -> bytes:
    """The model blob ``data`` (of :meth:`PublishedModel.to_bytes`) with ``release`` and a signature added."""
    meta = header_metadata(data)
    if MODEL_KEY not in meta:
        raise ModelRejected("not a silofl published model")
    tensors = st_load(data)
    release = {**release, "public_key": public_key_hex(key)}
    sig = key.sign(canonical_bytes(meta[MODEL_KEY], release, tensors))
    return st_save(
        tensors,
        metadata={
            MODEL_KEY: meta[MODEL_KEY],
            RELEASE_KEY: _canonical_json(release).decode(),
            SIGNATURE_KEY: json.dumps({"alg": "ed25519", "sig": sig.hex()}),
        },
    )


def release_of(data: bytes) -> dict | None:
    """The (unverified) release receipt of a blob, or None for an unsigned model."""
    meta = header_metadata(data)
    if RELEASE_KEY not in meta:
        return None
    try:
        rel = json.loads(meta[RELEASE_KEY])
    except ValueError:
        raise ModelRejected("the release receipt is not JSON") from None
    if not isinstance(rel, dict):
        raise ModelRejected("the release receipt is not a mapping")
    return rel


def verify_model(data: bytes, public_key: str) -> dict:
    """Verify a signed model blob against the publisher's registered public key (hex); its release receipt.
    ModelRejected if it is unsigned, signed by another key or changed after signing."""
    meta = header_metadata(data)
    if MODEL_KEY not in meta or RELEASE_KEY not in meta or SIGNATURE_KEY not in meta:
        raise ModelRejected("the model is not signed by its publisher")
    rel = release_of(data)
    assert rel is not None
    try:
        sig = json.loads(meta[SIGNATURE_KEY])
        if sig.get("alg") != "ed25519":
            raise ValueError
        raw = bytes.fromhex(sig["sig"])
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ModelRejected("the model's signature is malformed") from None
    try:
        tensors = st_load(data)
    except Exception as e:  # noqa: BLE001 - any parse failure is a corrupt model
        raise ModelRejected(f"not a safetensors blob: {e}") from None
    try:
        parse_public_key(public_key).verify(raw, canonical_bytes(meta[MODEL_KEY], rel, tensors))
    except InvalidSignature:
        raise ModelRejected(
            "the model's signature does not verify against its publisher's registered key: it was "
            "changed after signing or signed by someone else"
        ) from None
    return rel


def check_receipt(
    rel: dict, model_publisher: str, model_eps: float, model_delta: float, lifetime: tuple[float, float]
) -> tuple[float, float]:
    """The declared (ε, δ) spend of a receipt, after checking it names the model's publisher, covers at least
    the model's own (ε, δ) and stays within the site's declared lifetime budget (ModelRejected otherwise)."""
    if rel.get("site") != model_publisher:
        raise ModelRejected(
            f"the release receipt names site {rel.get('site')!r}, the model {model_publisher!r}"
        )
    spent = rel.get("epsilon_spent"), rel.get("delta_spent")
    if any(
        isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 for v in spent
    ):
        raise ModelRejected(
            "the model declares no finite spend (epsilon_spent, delta_spent) from its publisher's ledger"
        )
    eps, dlt = float(spent[0]), float(spent[1])
    if not math.isfinite(model_eps) or eps < model_eps * (1 - 1e-9) or dlt < model_delta * (1 - 1e-9):
        raise ModelRejected(
            f"the declared spend ε={eps:g}, δ={dlt:g} is below the model's own ε={model_eps:g}, "
            f"δ={model_delta:g}"
        )
    if eps > lifetime[0] * (1 + 1e-9) or dlt > lifetime[1] * (1 + 1e-9):
        raise ModelRejected(
            f"the declared spend ε={eps:g}, δ={dlt:g} is over {model_publisher!r}'s declared "
            f"lifetime budget ε={lifetime[0]:g}, δ={lifetime[1]:g}"
        )
    return eps, dlt
