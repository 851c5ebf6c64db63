"""The building blocks: group arithmetic and mask expansion, Shamir sharing, the SecAgg+ graph, keys."""

import itertools

import numpy as np
import pytest

from silofl.secure import graph, group, keys, shamir


def test_group_add_sub_are_inverse_and_wrap():
    bits = 10
    a = np.array([0, 1, 1023, 512], dtype=np.uint64)
    b = np.array([1023, 1023, 1, 512], dtype=np.uint64)
    s = group.add(a, b, bits)
    assert s.tolist() == [1023, 0, 0, 0]
    assert group.sub(s, b, bits).tolist() == a.tolist()
    with pytest.raises(ValueError):
        group.check_bits(63)


def test_expand_is_deterministic_in_range_and_seed_dependent():
    s1, s2 = b"\1" * 32, b"\2" * 32
    m = group.expand(s1, 1000, 7)
    assert m.dtype == np.uint64 and int(m.max()) < 128
    assert np.array_equal(m, group.expand(s1, 1000, 7))
    assert not np.array_equal(m, group.expand(s2, 1000, 7))
    # the keystream is ChaCha20's: the first 8 bytes of the RFC 8439 keystream for this key and a zero nonce
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    ks = Cipher(algorithms.ChaCha20(s1, b"\0" * 16), mode=None).encryptor().update(b"\0" * 8)
    assert int(group.expand(s1, 1, 62)[0]) == int.from_bytes(ks, "little") & ((1 << 62) - 1)


def test_shamir_any_t_shares_recover_and_a_wrong_share_is_detected():
    secret = int.from_bytes(b"\x07" * 32, "big")
    xs = [1, 2, 5, 9, 11]
    shares = shamir.split(secret, 3, xs)
    for sub in itertools.combinations(xs, 3):
        assert shamir.combine({x: shares[x] for x in sub}, 3) == secret
    with pytest.raises(shamir.ShareError):
        shamir.combine({x: shares[x] for x in xs[:2]}, 3)
    bad = dict(shares)
    bad[9] = (bad[9] + 1) % shamir.PRIME
    with pytest.raises(shamir.ShareError, match="inconsistent"):
        shamir.combine(bad, 3)
    assert shamir.from_bytes(shamir.to_bytes(shares[1])) == shares[1]


def test_shamir_fewer_than_t_shares_fit_every_secret():
    """t − 1 shares are consistent with any secret: for each candidate there is a degree-(t−1) polynomial
    through them (the one Lagrange gives with the candidate at 0)."""
    shares = shamir.split(12345, 3, [1, 2, 3])
    two = [(1, shares[1]), (2, shares[2])]
    for candidate in (0, 12345, 999):
        pts = [(0, candidate), *two]
        assert shamir._interpolate(pts, 0) == candidate
        assert shamir._interpolate(pts, 1) == shares[1]


def test_graph_is_symmetric_and_regular():
    parts = list(range(3, 23))
    seed = b"s" * 16
    g = graph.neighbours(parts, 6, seed)
    assert all(len(v) == 6 and u not in v for u, v in g.items())
    assert all(u in g[v] for u in g for v in g[u])
    assert g == graph.neighbours(parts, 6, seed)
    assert g != graph.neighbours(parts, 6, b"t" * 16)
    full = graph.neighbours([0, 1, 2, 3], 5, seed)
    assert full[0] == [1, 2, 3]
    assert graph.default_neighbours(8) == 7 and graph.default_neighbours(100) % 2 == 0


def test_keys_agree_and_sealed_shares_are_bound_to_their_address():
    a, b = keys.new_private_key(), keys.new_private_key()
    sa, sb = keys.agree(a, keys.public_bytes(b)), keys.agree(b, keys.public_bytes(a))
    assert sa == sb
    ka = keys.derive(sa, b"x" * 16, b"shares", 1, 2)
    assert ka == keys.derive(sb, b"x" * 16, b"shares", 2, 1)
    assert ka != keys.derive(sa, b"y" * 16, b"shares", 1, 2)
    ad = keys.associated_data(b"x" * 16, 4, 1, 2)
    blob = keys.seal(ka, b"hello", ad)
    assert keys.open_sealed(ka, blob, ad) == b"hello"
    for wrong_ad in (keys.associated_data(b"x" * 16, 5, 1, 2), keys.associated_data(b"x" * 16, 4, 2, 1)):
        with pytest.raises(ValueError, match="authentication"):
            keys.open_sealed(ka, blob, wrong_ad)
    with pytest.raises(ValueError):
        keys.agree(a, b"\0" * 32)  # a low-order point
