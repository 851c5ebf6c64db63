"""Client-level DP with the sub-client unit: one absent sub-client moves the centred unclipped count by 1, not
½ (finding 4: z = 1.0 was recorded and ε 8.416 reported where the mechanism that ran had z 0.945 and ε 9.059).
Each unit's multiplier is now composed block by block, checked here against an independent computation and
Google's dp-accounting."""

import math

import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.rdp import RdpAccountant

from silofl.privacy.analysis import (
    DEFAULT_ORDERS,
    epsilon_of,
    unit_noise_multipliers,
    update_noise_multiplier,
)
from silofl.site.subclients import UNCLIPPED, UNITS
from tests.helpers import build_run


def test_the_count_moves_by_one_when_a_subclient_is_absent(tmp_path):
    """What the server centres: a hospital's unclipped count u with its v fixed and public; removing one
    sub-client (its update absent, so it no longer counts) moves u − v/2 by 1."""
    v = 4
    present = [1, 0, 1, 1]  # which sub-clients' updates needed no clipping
    with_all = sum(present) - v / 2
    without_first = sum(present[1:]) - v / 2  # the first sub-client absent; the server still centres by v/2
    assert abs(with_all - without_first) == 1


@pytest.mark.parametrize("count_std", [2.5, 1.5])
def test_the_subclient_calibrated_mechanism_is_the_one_recorded(count_std):
    z_update = update_noise_multiplier(1.0, count_std, None, count_sensitivity=1.0)
    # independently: the update block (sensitivity C, noise z_Δ·C) and the count (sensitivity 1, noise σ_b)
    effective = (z_update**-2 + (1.0 / count_std) ** 2) ** -0.5
    assert effective == pytest.approx(1.0, abs=1e-12)
    old = (1.0**-2 - (2 * count_std) ** -2) ** -0.5  # the sensitivity-½ calibration
    was = (old**-2 + (1.0 / count_std) ** 2) ** -0.5
    if count_std == 2.5:
        assert was == pytest.approx(0.9449, abs=1e-4)  # what had run while z = 1.0 was recorded


def test_each_units_multiplier_block_by_block():
    z, v, sb, zn = 1.2, 3, 2.0, 5.0
    for unit in ("hospital", "subclient"):
        zs = unit_noise_multipliers(z, v, unit, sb, zn)
        zd = update_noise_multiplier(z, sb, zn, 0.5 if unit == "hospital" else 1.0)
        if unit == "hospital":  # sub-client: C/v of the update and norm sums, 1/v of the count fraction
            other = ((1 / (v * zd)) ** 2 + (1 / (v * sb)) ** 2 + (1 / (v * zn)) ** 2) ** -0.5
            assert zs == {"hospital": z, "subclient": pytest.approx(other)}
        else:  # hospital: v·C of the update and norm sums, v/2 of the count
            other = ((v / zd) ** 2 + (v / (2 * sb)) ** 2 + (v / zn) ** 2) ** -0.5
            assert zs == {"subclient": z, "hospital": pytest.approx(other)}
        assert unit_noise_multipliers(z, v, unit) == (
            {"hospital": z, "subclient": z * v} if unit == "hospital" else {"hospital": z / v, "subclient": z}
        )


@pytest.mark.slow
def test_a_subclient_run_with_adaptive_clipping_records_what_ran_and_dp_accounting_agrees(tmp_path):
    from silofl.runner.config import RunConfig
    from silofl.runner.loop import run

    cfg = RunConfig.from_dict(
        dict(
            method="dp-fedavg",
            dataset="digits",
            partition="iid",
            clients=4,
            samples_per_client=160,
            batch_size=16,
            rounds=3,
            delta=1e-3,
            proxy_model="mlp256",
            test_limit=100,
            intermediaries="2",
            privacy_unit="subclient",
            adaptive_clip=True,
            out=str(tmp_path / "r"),
        )
    )
    s = run(cfg, progress=False)
    srv = s["privacy"]
    z_update = srv["noise_multiplier_update"]
    assert z_update == pytest.approx(update_noise_multiplier(1.0, 2.5, None, 1.0))
    acc = RdpAccountant(list(DEFAULT_ORDERS))
    effective = (z_update**-2 + (1 / 2.5) ** 2) ** -0.5
    acc.compose(dp_event.GaussianDpEvent(effective), 3)
    assert s["accounting"][0]["epsilon"] == pytest.approx(acc.get_epsilon(1e-3), rel=1e-6)
    hospital = unit_noise_multipliers(1.0, 2, "subclient", 2.5)["hospital"]
    assert srv["epsilon_hospital"] == pytest.approx(epsilon_of("rdp", ((hospital, 1.0, 3),), 1e-3))
    assert "not one record" in srv["note_units"]


def test_the_server_recomputes_the_count_bounds_for_the_unit(tmp_path):
    from silofl.runner.config import RunConfig

    b = build_run(
        RunConfig.from_dict(
            dict(
                method="dp-fedavg",
                dataset="digits",
                partition="iid",
                clients=4,
                samples_per_client=160,
                batch_size=16,
                rounds=2,
                delta=1e-3,
                proxy_model="mlp256",
                test_limit=100,
                intermediaries="2",
                privacy_unit="subclient",
                adaptive_clip=True,
                out=str(tmp_path / "r"),
            )
        )
    )
    srv = b.coordinator.server
    assert srv.z_update == pytest.approx(1 / math.sqrt(1 - 0.16))
    b.coordinator.start()
    b.coordinator.flush()
    msg = b.sites[0].train(1)
    from silofl.comm.wire import decode

    t, _ = decode(msg)
    assert float(t[UNITS]) == 2 and 0 <= float(t[UNCLIPPED]) <= 2
    assert torch.isfinite(t["update"]).all()
