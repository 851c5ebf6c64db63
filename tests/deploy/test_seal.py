"""Sealed payloads: only the recipient opens them, only the pinned sender makes them, each once, in its
round."""

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519, x25519

from silofl.core.errors import PeerModelRejected
from silofl.deploy.seal import ReplayGuard, header_of, open_sealed, seal

A_SIGN, B_SEAL, C_SIGN, C_SEAL = (
    ed25519.Ed25519PrivateKey.generate(),
    x25519.X25519PrivateKey.generate(),
    ed25519.Ed25519PrivateKey.generate(),
    x25519.X25519PrivateKey.generate(),
)
DATA = bytes(range(256)) * 8


def sealed(**kw):
    args = dict(
        run_id="run1",
        src="a",
        dst="b",
        rnd=3,
        step="train_send",
        index=0,
        sign_key=A_SIGN,
        recipient=B_SEAL.public_key(),
    )
    return seal(DATA, **{**args, **kw})


def opened(blob, **kw):
    args = dict(run_id="run1", src="a", dst="b", seal_key=B_SEAL, sender=A_SIGN.public_key())
    return open_sealed(blob, **{**args, **kw})


def test_the_recipient_opens_what_the_sender_sealed_and_the_relay_sees_no_plaintext():
    blob = sealed()
    assert DATA[:64] not in blob and len(blob) < len(DATA) + 300
    assert opened(blob) == ({"round": 3, "step": "train_send", "i": 0}, DATA)
    assert header_of(blob)["round"] == 3
    assert sealed() != blob  # fresh ephemeral key and nonce every time


@pytest.mark.parametrize("case", ["flip ciphertext", "flip header", "truncate", "unsealed"])
def test_an_altered_payload_is_refused(case):
    blob = bytearray(sealed())
    if case == "flip ciphertext":
        blob[-5] ^= 1
    elif case == "flip header":
        blob[8] = ord("4") if blob[8] != ord("4") else ord("5")
    elif case == "truncate":
        blob = blob[:50]
    else:
        blob = bytearray(DATA)
    with pytest.raises(PeerModelRejected):
        opened(bytes(blob))


def test_a_payload_is_bound_to_its_run_sender_and_recipient():
    blob = sealed()
    with pytest.raises(PeerModelRejected, match="signature"):
        opened(blob, run_id="run2")  # replayed into another run
    with pytest.raises(PeerModelRejected, match="signature"):
        opened(blob, src="c", sender=C_SIGN.public_key())  # passed off as another site's
    with pytest.raises(PeerModelRejected, match="signature"):
        opened(blob, dst="c", seal_key=C_SEAL)  # redirected to another site
    forged = sealed(sign_key=C_SIGN)  # signed by a key that is not a's pinned one
    with pytest.raises(PeerModelRejected, match="signature"):
        opened(forged)


def test_the_replay_guard_admits_each_context_once_and_only_in_its_rounds():
    g = ReplayGuard(window=1)
    h = {"round": 3, "step": "s", "i": 0}
    g.check("a", h, 3)
    g.check(
        "a", h, 3
    )  # checking alone uses nothing up: a forged payload that fails to open must not block the real one
    g.mark("a", h, 3)  # opened: delivered
    with pytest.raises(PeerModelRejected, match="replay"):
        g.check("a", h, 3)
    g.check("a", {"round": 3, "step": "s", "i": 1}, 4)  # one round late (a cycle hands on next round)
    with pytest.raises(PeerModelRejected, match="round"):
        g.check("a", {"round": 2, "step": "s", "i": 0}, 4)
    with pytest.raises(PeerModelRejected, match="round"):
        g.check("a", {"round": 5, "step": "s", "i": 0}, 4)
