"""What crosses a site boundary: safetensors bytes (tensors + plain string metadata), never pickle.

Everything received is checked before use: it parses as safetensors (whose header is bounded by the
message size before anything is read from it), stays under a size limit, and holds exactly the expected
tensor names, with the expected shapes and dtypes, all finite and no larger in magnitude than
``max_abs`` (a finite 3e38 would pass a finiteness check and still overflow whatever it touches); its
metadata names the round and the sender it is expected from (a message replayed from another round, or
claiming another sender, is refused).
"""

from __future__ import annotations

import json

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from silofl.core.errors import PeerModelRejected

DEFAULT_MAX_BYTES = 512 * 1024 * 1024
DEFAULT_MAX_ABS = 1e6  # no trained weight of a silofl model comes near this; a hostile one is refused


def encode(tensors: dict[str, torch.Tensor], meta: dict | None = None) -> bytes:
    """Tensors (moved to the CPU) and plain-JSON metadata as safetensors bytes."""
    state = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    return st_save(state, metadata={"silofl": json.dumps(meta or {})})


def decode(data: bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors, metadata) of wire bytes; PeerModelRejected if they are too large or not valid safetensors."""
    if len(data) > max_bytes:
        raise PeerModelRejected(f"message of {len(data)} bytes exceeds the limit of {max_bytes}")
    try:
        tensors = st_load(data)
        n = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + n])
        meta = json.loads(header.get("__metadata__", {}).get("silofl", "{}"))
    except Exception as e:  # any parse failure means a corrupt message
        raise PeerModelRejected(f"message is not valid safetensors: {e}") from None
    if not isinstance(meta, dict):
        raise PeerModelRejected("message metadata is not a JSON object")
    return tensors, meta


def validate(
    tensors: dict[str, torch.Tensor], reference: dict[str, torch.Tensor], max_abs: float = DEFAULT_MAX_ABS
) -> None:
    """Raise PeerModelRejected unless ``tensors`` matches ``reference`` in names, shapes, dtypes, and is
    finite and bounded by ``max_abs``."""
    missing = sorted(set(reference) - set(tensors))
    extra = sorted(set(tensors) - set(reference))
    if missing or extra:
        raise PeerModelRejected(f"tensor names differ (missing {missing[:5]}, unexpected {extra[:5]})")
    for k, ref in reference.items():
        t = tensors[k]
        if tuple(t.shape) != tuple(ref.shape):
            raise PeerModelRejected(f"{k}: shape {tuple(t.shape)}, expected {tuple(ref.shape)}")
        if t.dtype != ref.dtype:
            raise PeerModelRejected(f"{k}: dtype {t.dtype}, expected {ref.dtype}")
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise PeerModelRejected(f"{k}: contains non-finite values")
        if (
            t.numel()
            and (t.is_floating_point() or t.dtype in (torch.int32, torch.int64))
            and float(t.abs().max()) > max_abs
        ):
            raise PeerModelRejected(
                f"{k}: values of magnitude {float(t.abs().max()):.3g} exceed the bound {max_abs:g}"
            )


def read_model(
    data: bytes,
    reference: dict[str, torch.Tensor],
    scalars: tuple[str, ...] = (),
    positive: bool = False,
    expect: dict | None = None,
    max_abs: float = DEFAULT_MAX_ABS,
) -> tuple[dict[str, torch.Tensor], dict[str, float], dict]:
    """Decode a model message carrying extra scalar weights (e.g. a PushSum or aggregation weight).

    Returns (model tensors, {scalar name: value}, meta). Every scalar must be present, single,
    finite and non-negative (strictly positive with ``positive``); the model must match ``reference``
    (:func:`validate`); the metadata must hold every ``expect`` item (e.g. the round and the sender).
    """
    tensors, meta = decode(data)
    for k, v in (expect or {}).items():
        if meta.get(k) != v:
            raise PeerModelRejected(f"message {k} is {meta.get(k)!r}, expected {v!r} (replayed or forged)")
    values = {}
    for k in scalars:
        v = tensors.pop(k, None)
        if v is None:
            raise PeerModelRejected(f"message lacks {k}")
        if (
            v.numel() != 1
            or not bool(torch.isfinite(v).all())
            or float(v) < 0
            or (positive and float(v) == 0)
        ):
            raise PeerModelRejected(f"invalid {k}: {v.flatten()[:3].tolist()}")
        values[k] = float(v)
    validate(tensors, reference, max_abs)
    return tensors, values, meta


def read_model_shared(
    cache: dict | None,
    data: bytes,
    reference: dict[str, torch.Tensor],
    scalars: tuple[str, ...] = (),
    expect: dict | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, float], dict]:
    """:func:`read_model`, computed once per message among the readers that share ``cache``.

    The sites one process runs for one step (:func:`silofl.comm.engine.run_here`) receive the same bytes
    many times — a complete graph's K − 1 copies of each payload, a server's broadcast K times. Decoding
    and checking them gives the same answer for every reader that holds a model of the same names, shapes
    and dtypes, so it is computed once: the entry is keyed by the bytes themselves (not an address), the
    reference's signature, the scalars and the expected metadata, and a refusal is shared as well. Each call
    returns fresh dicts; the tensors are shared and read-only (every reader copies them into its own model
    or mixes them into a new tensor). ``cache`` None: plain :func:`read_model`.
    """
    if cache is None or not isinstance(data, bytes):  # a buffer that is not bytes is not a dict key
        return read_model(data, reference, scalars, expect=expect)
    sig = tuple((k, tuple(v.shape), v.dtype) for k, v in reference.items())
    key = ("read_model", data, sig, tuple(scalars), tuple(sorted((expect or {}).items())))
    if key not in cache:
        try:
            cache[key] = read_model(data, reference, scalars, expect=expect)
        except PeerModelRejected as e:
            cache[key] = e
    got = cache[key]
    if isinstance(got, PeerModelRejected):
        raise PeerModelRejected(str(got))
    tensors, values, meta = got
    return dict(tensors), dict(values), dict(meta)
