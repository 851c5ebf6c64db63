"""DP FL baselines: the server noise is calibrated to the target ε and an independent accountant
(Google's dp-accounting) agrees on the spend; bad settings are clear errors."""

import dp_accounting
import numpy as np
import pytest

from silofl.core.errors import ConfigError
from studies.fl_baselines import evaluate, fine_tune, run_fl


def _sites(k=4, n=60, d=5, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(k):
        x = rng.random((n, d))
        out.append((x, (x[:, 0] + x[:, 1] > 1).astype(int)))
    return out


def test_noise_is_calibrated_and_dp_accounting_agrees():
    model, info = run_fl("fedavg", _sites(), "classification", 2, epsilon=2.0, delta=1e-5, rounds=10)
    assert 1.9 < info["epsilon"] <= 2.0 and info["unit"].startswith("one site")
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(info["noise_multiplier"]), 10)
    assert acc.get_epsilon(1e-5) == pytest.approx(info["epsilon"], rel=0.02)


def test_methods_differ_and_fine_tuning_uses_only_local_data():
    sites = _sites()
    # batches of 16: several local steps a round, so FedProx's proximal term acts (it is 0 at a round's first)
    a, _ = run_fl("fedavg", sites, "classification", 2, epsilon=5.0, delta=1e-5, rounds=3, seed=1, batch=16)
    p, _ = run_fl(
        "fedprox", sites, "classification", 2, epsilon=5.0, delta=1e-5, rounds=3, seed=1, mu=1.0, batch=16
    )
    m, info = run_fl(
        "fedadam", sites, "classification", 2, epsilon=5.0, delta=1e-5, rounds=3, seed=1, nonprivate=True
    )
    assert any((x - y).abs().max() > 0 for x, y in zip(a.parameters(), p.parameters(), strict=True))
    assert info["private"] is False and "epsilon" not in info
    x, y = sites[0]
    tuned = fine_tune(m, x, y, "classification", epochs=30)
    assert evaluate(tuned, x, y, "classification") >= evaluate(m, x, y, "classification") - 0.05


def test_bad_settings():
    with pytest.raises(ConfigError, match="unknown FL baseline"):
        run_fl("scaffold", _sites(), "classification", 2, epsilon=1.0, delta=1e-5)
    with pytest.raises(ConfigError, match="δ ≤ 1/4"):
        run_fl("fedavg", _sites(), "classification", 2, epsilon=1.0, delta=0.5)
