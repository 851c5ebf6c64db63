"""Secure aggregation with the sub-client privacy unit: each of a hospital's v sub-clients is a summand of
its own (clipped to C, rotated, scaled and rounded on its own), the hospital's discrete noise is added once
and calibrated to one sub-client's sensitivity; the accountant's ε per sub-client (and per hospital, all v
summands together) equals an independent port of the Skellam bound."""

import math

import numpy as np
import pytest
import torch

from silofl.privacy import discrete as D
from silofl.training.local_sgd import flat
from tests.helpers import build_run, secure_or_plain
from tests.secure.test_client_level import config

ORDERS = list(range(2, 129)) + [160, 192, 256, 384, 512, 1024]


# -------------------------------------------------------------------- an independent computation
# The calibration written out from its definition (Agarwal, Kairouz & Liu 2021; google-research/federated's
# skellam_params closed form with n·v summands of norm ≤ C and n parties' noise), the conditional rounding
# bound (Kairouz, Liu & Steinke 2021, Prop. 22), the Skellam RDP bound (Theorem 3.5) with one sub-client's
# rounded vector as the sensitivity (or v of them for a hospital, by the triangle inequality), converted by
# dp_accounting (not Opacus, which silofl uses).
def _ref_gamma(dim, clip, bits, parties, survivors, z, v, k=D.DEFAULT_K):
    d = 2 ** math.ceil(math.log2(dim))
    room = 4.0 ** (bits - 1) / k**2 - parties * v / 4
    return math.sqrt(room / (clip**2 * ((parties * v) ** 2 / d + parties * z**2 / survivors))), d


def _ref_epsilon(gamma, d, clip, variance, group, rounds, delta, beta=D.DEFAULT_BETA):
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    x = gamma * clip
    l2 = min(
        x + math.sqrt(d),
        math.sqrt(x * x + d / 4 + math.sqrt(2 * math.log(1 / beta)) * (x + math.sqrt(d) / 2)),
    )
    l1 = l2 * min(math.sqrt(d), l2)
    l2, l1 = group * l2, group * l1
    rdp = [
        a * l2**2 / (2 * variance)
        + min(((2 * a - 1) * l2**2 + 6 * l1) / (4 * variance**2), 3 * l1 / (2 * variance))
        for a in ORDERS
    ]
    return compute_epsilon(ORDERS, [rounds * r for r in rdp], delta)[0]


@pytest.mark.parametrize(
    "dim,clip,bits,parties,survivors,z,v,rounds",
    [(100, 1.0, 24, 4, 3, 1.0, 3, 5), (3000, 0.05, 20, 6, 5, 1.3, 8, 20), (1, 0.5, 20, 3, 2, 4.0, 2, 1)],
)
def test_the_subclient_calibration_equals_an_independent_computation(
    dim, clip, bits, parties, survivors, z, v, rounds
):
    m = D.calibrate(
        dim=dim,
        clip=clip,
        bits=bits,
        parties=parties,
        min_survivors=survivors,
        noise_multiplier=z,
        per_party=v,
    )
    gamma, d = _ref_gamma(dim, clip, bits, parties, survivors, z, v)
    assert m.per_party == v and m.scale == pytest.approx(gamma, rel=1e-12)
    # the noise of min_survivors hospitals meets the central Gaussian's for one sub-client: z·C, not z·v·C
    assert math.sqrt(survivors * m.local_mu) / m.scale == pytest.approx(z * clip, rel=1e-9)
    assert survivors * m.local_mu >= (z * clip * m.scale) ** 2
    for group, whole in ((1, False), (v, True)):
        eps = D.epsilon([m], rounds=rounds, delta=1e-5, whole_party=whole)
        ref = _ref_epsilon(gamma, d, clip, survivors * m.local_mu, group, rounds, 1e-5)
        assert eps == pytest.approx(ref, rel=1e-9)
    assert D.epsilon([m], rounds=rounds, delta=1e-5, whole_party=True) > D.epsilon(
        [m], rounds=rounds, delta=1e-5
    )
    # the group holds n·v summands: the finer the split, the coarser γ
    assert (
        m.scale
        < D.calibrate(
            dim=dim, clip=clip, bits=bits, parties=parties, min_survivors=survivors, noise_multiplier=z
        ).scale
    )
    assert D.DiscreteMechanism.from_dict(m.to_dict()) == m


def test_one_subclient_moves_the_hospitals_sum_by_its_own_rounded_vector():
    """Without noise, the encodings of a hospital's sub-clients with and without the last one (the same
    randomness for the others) differ by that sub-client's rounded vector: within the L2 / L1 sensitivity,
    and γ·R·x to within the rounding."""
    m = D.calibrate(dim=50, clip=1.0, bits=30, parties=3, min_survivors=2, noise_multiplier=0.0, per_party=4)
    rng = np.random.default_rng(1)
    parts = [rng.normal(size=50) * s for s in (0.1, 3.0, 0.5, 2.0)]  # two of them clipped
    seed = 12345
    full = D.encode_parts(parts, m, rotation_seed=seed, rng=D.DiscreteRandom(7))
    without = D.encode_parts([*parts[:3], np.zeros(50)], m, rotation_seed=seed, rng=D.DiscreteRandom(7))
    diff = D.centre((full - without) & np.uint64((1 << m.bits) - 1), m.bits)
    assert 0 < np.linalg.norm(diff) <= m.l2_sensitivity() and np.abs(diff).sum() <= m.l1_sensitivity()
    last = parts[3] / np.linalg.norm(parts[3]) * 1.0  # clipped to C
    exact = D.rotate(last, m, rotation_seed=seed) * m.scale
    assert np.max(np.abs(diff - exact)) < 1.0
    # the sum of three hospitals' encodings decodes to the sum of every clipped summand
    hospitals = [[rng.normal(size=50) * 0.05 for _ in range(4)] for _ in range(3)]
    total = np.zeros(m.padded_dim(), dtype=np.uint64)
    for i, h in enumerate(hospitals):
        total = D.add_mod(total, D.encode_parts(h, m, rotation_seed=seed, rng=D.DiscreteRandom(i)), m.bits)
    want = sum(x for h in hospitals for x in h)
    assert np.max(np.abs(D.decode(total, m, rotation_seed=seed) - want)) < 12 / m.scale
    with pytest.raises(ValueError, match="4 summands"):
        D.encode_parts(parts[:3], m, rotation_seed=seed, rng=D.DiscreteRandom(0))
    with pytest.raises(ValueError, match="encode_parts"):
        D.encode(parts[0], m, rotation_seed=seed, rng=D.DiscreteRandom(0))


def weights(server):
    return flat({k: p.detach().clone() for k, p in server.model.named_parameters()})


@pytest.mark.slow
def test_the_subclient_unit_matches_central_noise_and_accounts_per_subclient(tmp_path):
    """One round, 2 sub-clients per hospital, negligible noise and 40 bits: the model moves as in the
    central-noise run (within the discretisation error), and so does the adaptive clip; the mechanisms are
    per sub-client."""
    kw = dict(noise_multiplier=1e-6, secagg_bits=40, clip=0.05, privacy_unit="subclient", intermediaries="2")
    kw["adaptive_clip"] = True  # each sub-client's centred unclipped indicator is a summand too
    moves, clips = [], []
    for secure in (False, True):
        b = build_run(config(tmp_path / str(secure), **secure_or_plain(kw, secure)))
        b.coordinator.start()
        before = weights(b.coordinator.server)
        b.coordinator.run_round(1)
        moves.append(weights(b.coordinator.server) - before)
        clips.append(b.coordinator.server.clip.clip)
        if secure:
            srv = b.coordinator.server
            mech, count = [D.DiscreteMechanism.from_dict(x) for x in srv.secure_released]
            assert (count.dim, count.clip, count.per_party) == (1, 1.0, 2)  # indicators, sensitivity 1
            # the count's noise std is the central run's σ_b (2.5·z by default) with min_survivors' shares
            assert count.central_std(3) == pytest.approx(2.5e-6, rel=1e-9)
            assert mech.per_party == 2 and mech.clip == pytest.approx(0.05) and mech.parties == 4
            assert srv.history[-1]["survivors"] == 4 and srv.history[-1]["step"] is True
            gamma, _ = _ref_gamma(srv.d, 0.05, 40, 4, 3, 1e-6, 2)
            assert mech.scale <= gamma * (1 + 1e-12)  # capped at 2^50 steps per C; ε: test_sampling.py
            sub, hosp = srv.epsilon_vs_server_of(0), srv.epsilon_vs_server_of(0, "hospital")
            assert 0 < sub < hosp
            summary = b.coordinator.privacy_summary()
            assert summary["epsilon_vs_server"] == sub and summary["epsilon_vs_server_hospital"] == hosp
            assert "one subclient" in summary["note_sampling"]
    assert clips[0] != 0.05 and clips[1] == pytest.approx(clips[0], rel=1e-6)
    assert float(moves[0].abs().max()) > 1e-3
    assert float((moves[0] - moves[1]).abs().max()) < 1e-6
    assert torch.isfinite(moves[1]).all()


@pytest.mark.slow
def test_too_few_bits_for_the_model_is_a_config_error_before_any_round(tmp_path):
    """The group cannot hold the sum: a one-line ConfigError at setup (not a run of abandoned rounds); with
    the sub-client unit and adaptive v, checked at the largest v the run may reach."""
    from silofl.core.errors import ConfigError

    with pytest.raises(ConfigError, match="secure aggregation: 8 bits are too few"):
        build_run(config(tmp_path / "a", secagg_bits=8))
    with pytest.raises(ConfigError, match="secure aggregation: 8 bits are too few"):
        build_run(config(tmp_path / "b", secagg_bits=8, privacy_unit="subclient", intermediaries="adaptive"))
    b = build_run(config(tmp_path / "c", secagg_bits=12, privacy_unit="subclient", intermediaries="adaptive"))
    assert b.coordinator.server.v == 1  # the check leaves the run's v as it was
