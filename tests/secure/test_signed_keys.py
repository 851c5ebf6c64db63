"""Signed relayed keys: with the sites' identities (what a deployed site has: its pinned Ed25519 key and the
run's roster), every key-agreement public key the coordinator relays is checked against its owner's
signature; a coordinator that substitutes one is detected, no session is made and nothing is released."""

import logging

import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from silofl.fl.exchange.secure_round import SecAggIdentity
from silofl.secure import Party
from tests.helpers import build_run
from tests.secure.test_client_level import config, weights


def test_an_identity_verifies_only_its_owners_signature_on_that_key():
    own, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    ident = SecAggIdentity(own, {0: own.public_key(), 1: other.public_key()}, "run-a")
    pk = Party(0, config_settings()).public_key()
    sig = ident.sign(0, pk)
    ident.verify(0, pk, sig)
    from silofl.secure import SecAggRefused

    for pid, key, s in ((1, pk, sig), (0, bytes(32), sig), (0, pk, None), (0, pk, "zz" * 64), (7, pk, sig)):
        with pytest.raises(SecAggRefused):
            ident.verify(pid, key, s)
    other_run = SecAggIdentity(own, {0: own.public_key()}, "run-b")
    with pytest.raises(SecAggRefused, match="not signed"):
        other_run.verify(0, pk, sig)


def config_settings():
    from silofl.secure import SecAggSettings

    return SecAggSettings(bits=20, min_survivors=2)


@pytest.mark.slow
def test_a_coordinator_that_substitutes_a_key_is_detected_and_nothing_is_released(tmp_path, caplog):
    b = build_run(config(tmp_path))
    ids = {k: Ed25519PrivateKey.generate() for k in b.engine.sites}
    roster = {k: sk.public_key() for k, sk in ids.items()}
    for k, site in b.engine.sites.items():
        site.identity = SecAggIdentity(ids[k], roster, "run-x")
    coord = b.coordinator
    coord.start()
    coord.run_round(1)  # honest: signed keys verify, the round is released
    srv = coord.server
    assert srv.history[-1]["survivors"] == 4 and len(srv.secure_released) == 1
    # the coordinator turns hostile: at the next key agreement it swaps site 2's key for its own, signed by
    # a key of its own
    mallory, mallory_id = Party(2, config_settings()), Ed25519PrivateKey.generate()
    real_call = coord.call

    def hostile(step, requests):
        if step == "secagg_setup":
            for m in requests.values():
                pk = mallory.public_key()
                m.meta["keys"]["2"] = pk.hex()
                m.meta["signatures"]["2"] = SecAggIdentity(mallory_id, {}, "run-x").sign(2, pk)
        return real_call(step, requests)

    coord.call = hostile
    srv.secagg.keys_ready = False
    before, eps = weights(srv), srv.epsilon_vs_server()
    with caplog.at_level(logging.WARNING, logger="silofl"):
        coord.run_round(2)
    assert srv.history[-1]["abandoned"] and srv.secure_abandoned == 1
    assert torch.equal(weights(srv), before) and srv.epsilon_vs_server() == eps
    assert len(srv.secure_released) == 1
    refusals = [r.message for r in caplog.records if "not signed by its pinned identity" in r.message]
    assert len(refusals) == 4  # every site, the victim too, refused the session
