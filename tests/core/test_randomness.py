"""silofl.core.randomness: per-party seeds of a research run, secret ones otherwise, the secure
generator's stream."""

import numpy as np
import torch

from silofl.core.randomness import SecureRandom, client_seeds, party_seeds


def test_client_seeds_are_numpys_seed_sequence_of_run_seed_and_party():
    want = [int(s) for s in np.random.SeedSequence([7, 2]).generate_state(4)]  # the documented derivation
    assert client_seeds(7, 2) == want == party_seeds(7, 2)
    assert client_seeds(7, 2, n=6)[:4] == want and len(client_seeds(7, 2, n=6)) == 6
    # parties never share a stream, nor do runs; a party's seeds do not depend on the others
    assert len({tuple(client_seeds(7, k)) for k in range(50)}) == 50
    assert client_seeds(8, 2) != want


def test_without_a_run_seed_party_seeds_are_fresh_secrets():
    a, b = party_seeds(None, 0), party_seeds(None, 0)
    assert a != b and len(a) == 4 and all(0 <= s < 2**63 for s in a + b)


def test_the_secure_generator_never_repeats_and_saves_nothing():
    r = SecureRandom()
    first, second = r.bytes(64), r.bytes(64)
    assert first != second and len(first) == 64  # a stream, not one block again
    assert r.state_dict() == {"secure": True}
    u = r.uniform(1000)
    assert u.dtype == torch.float64 and bool(((u >= 0) & (u < 1)).all()) and len(set(u.tolist())) == 1000
    assert r.uniform(0).shape == (0,)
    z = r.normal(5)
    assert z.shape == (5,) and bool(torch.isfinite(z).all())
