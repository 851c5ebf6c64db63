import math

import numpy as np
import pytest
import torch

from silofl.core.errors import ConfigError
from silofl.privacy import epsilon_of
from silofl.privacy.analysis import subclient_clip, unit_noise_multipliers, update_noise_multiplier
from silofl.privacy.client_level import AdaptiveClip, clip_update


def test_clip_update_bounds_the_global_norm_and_keeps_small_updates():
    g = torch.Generator().manual_seed(0)
    big = torch.randn(1000, generator=g) * 5
    clipped, norm = clip_update(big, 2.0)
    assert norm == pytest.approx(float(big.norm()), rel=1e-6)
    assert float(clipped.norm()) == pytest.approx(2.0, rel=1e-6)
    assert torch.allclose(clipped / clipped.norm(), big / big.norm())  # direction kept
    small = torch.full((10,), 0.01)
    same, _ = clip_update(small, 2.0)
    assert torch.equal(same, small)
    zero, n0 = clip_update(torch.zeros(5), 1.0)
    assert n0 == 0 and torch.equal(zero, torch.zeros(5))


def test_units_calibration_and_group_privacy_multipliers():
    assert subclient_clip(1.0, 4, "hospital") == 0.25 and subclient_clip(1.0, 4, "subclient") == 1.0
    assert unit_noise_multipliers(1.2, 4, "hospital") == {"hospital": 1.2, "subclient": 4.8}
    assert unit_noise_multipliers(1.2, 4, "subclient") == {"hospital": 0.3, "subclient": 1.2}
    with pytest.raises(ConfigError):
        unit_noise_multipliers(1.0, 2, "patient")
    with pytest.raises(ConfigError):
        unit_noise_multipliers(1.0, 0, "hospital")


def test_auxiliary_releases_leave_the_total_noise_multiplier_the_accountant_sees():
    z = 1.0
    z_upd = update_noise_multiplier(z, count_std=2.5, norm_z=5.0)
    assert z_upd**-2 + (2 * 2.5) ** -2 + 5.0**-2 == pytest.approx(z**-2)
    assert update_noise_multiplier(z) == z
    with pytest.raises(ConfigError, match="whole noise budget"):
        update_noise_multiplier(1.0, count_std=0.3)  # (2·0.3)^-2 > 1: nothing left for the update


def test_joint_release_equals_one_gaussian_of_the_total_multiplier_in_dp_accounting():
    """Independent reference: Google's dp-accounting composes the three Gaussian releases of a
    round; their ε equals that of one Gaussian with the total multiplier z (what silofl accounts)."""
    dpa = pytest.importorskip("dp_accounting")
    from dp_accounting.rdp import RdpAccountant

    z, rounds, delta = 1.3, 40, 1e-5
    z_upd = update_noise_multiplier(z, count_std=2.0, norm_z=6.0)
    parts = dpa.ComposedDpEvent(
        [dpa.GaussianDpEvent(z_upd), dpa.GaussianDpEvent(2 * 2.0), dpa.GaussianDpEvent(6.0)]
    )
    acc = RdpAccountant()
    acc.compose(parts, rounds)
    ref = RdpAccountant()
    ref.compose(dpa.GaussianDpEvent(z), rounds)
    assert acc.get_epsilon(delta) == pytest.approx(ref.get_epsilon(delta), rel=1e-6)
    # and silofl's accountant (Opacus RDP) agrees with dp-accounting on that mechanism
    assert epsilon_of("rdp", ((z, 1.0, rounds),), delta) == pytest.approx(ref.get_epsilon(delta), rel=0.02)


@pytest.mark.parametrize("q", [1.0, 0.3])
def test_hospital_epsilon_of_a_subclient_calibrated_run_matches_dp_accounting(q):
    """Group privacy of v sub-clients: a hospital sees the Gaussian mechanism with multiplier z/v."""
    dpa = pytest.importorskip("dp_accounting")
    from dp_accounting.rdp import RdpAccountant

    from silofl.privacy.analysis import DEFAULT_ORDERS

    z, v, rounds, delta = 1.5, 2, 30, 1e-4
    zh = unit_noise_multipliers(z, v, "subclient")["hospital"]
    ours = epsilon_of("rdp", ((zh, q, rounds),), delta)
    ref = RdpAccountant(orders=list(DEFAULT_ORDERS))
    event = dpa.GaussianDpEvent(z / v)
    ref.compose(event if q == 1.0 else dpa.PoissonSampledDpEvent(q, event), rounds)
    assert ours == pytest.approx(ref.get_epsilon(delta), rel=0.03)
    # the sub-client figure the published code reports is far smaller
    assert epsilon_of("rdp", ((z, q, rounds),), delta) < ours / 2


def test_adaptive_clip_converges_to_the_target_quantile_of_synthetic_norms():
    rng = np.random.default_rng(0)
    units, target = 200, 0.5
    clip = AdaptiveClip(initial=0.05, quantile=target, lr=0.2, count_std=units / 20)
    for _ in range(400):
        norms = rng.lognormal(mean=0.0, sigma=0.5, size=units)  # median exp(0) = 1
        centred = float(np.sum(norms <= clip.clip) - units / 2)
        clip.update(clip.noisy_fraction(centred, units, float(rng.standard_normal())))
    assert clip.clip == pytest.approx(1.0, rel=0.15)
    clip90 = AdaptiveClip(initial=5.0, quantile=0.9, lr=0.2, count_std=units / 20)
    for _ in range(400):
        norms = rng.lognormal(mean=0.0, sigma=0.5, size=units)
        centred = float(np.sum(norms <= clip90.clip) - units / 2)
        clip90.update(clip90.noisy_fraction(centred, units, float(rng.standard_normal())))
    assert clip90.clip == pytest.approx(math.exp(0.5 * 1.2816), rel=0.15)  # lognormal 90% quantile


def test_adaptive_clip_rejects_bad_settings():
    with pytest.raises(ConfigError):
        AdaptiveClip(0.0)
    with pytest.raises(ConfigError):
        AdaptiveClip(1.0, quantile=1.0)
    with pytest.raises(ConfigError):
        AdaptiveClip(1.0, lr=0)
