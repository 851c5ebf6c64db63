"""Budget-first σ: a run given --target-epsilon E and its planned rounds ends at ε ≤ E, close to E — checked
with the run's own accountant (Opacus RDP) and with an independent one (Google's dp-accounting RDP
accountant)."""

import json

import pytest
from dp_accounting import dp_event
from dp_accounting import rdp as gdp_rdp
from typer.testing import CliRunner

from silofl.cli.main import app
from silofl.core.errors import ConfigError
from silofl.privacy import epsilon_of
from silofl.privacy.analysis import CALIBRATION_TOLERANCE, DEFAULT_ORDERS, calibrate_sigma
from silofl.runner.config import RunConfig
from silofl.runner.loop import run

# dp-accounting's RDP conversion and order grid differ slightly from Opacus' (see test_accountant.py)
INDEPENDENT_REL = 0.02


def google_rdp(history, delta):
    acc = gdp_rdp.RdpAccountant(orders=list(DEFAULT_ORDERS))
    for sigma, q, steps in history:
        acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), int(steps))
    return acc.get_epsilon(delta)


@pytest.mark.parametrize(
    "target,q,steps",
    [
        (1.0, 0.25, 1200),
        (3.0, 0.25, 1200),
        (8.0, 0.25, 1200),
        (8.0, 0.25, 12),
        (3.0, 1.0, 50),
        (1.0, 0.01, 5000),
    ],
)
def test_calibrated_sigma_ends_at_the_target(target, q, steps):
    sigma = calibrate_sigma(target, 1e-5, q, steps)
    eps = epsilon_of("rdp", ((sigma, q, steps),), 1e-5)
    assert target - CALIBRATION_TOLERANCE <= eps <= target
    ref = google_rdp([(sigma, q, steps)], 1e-5)
    assert ref == pytest.approx(target, rel=INDEPENDENT_REL)


def test_unreachable_budget_is_a_config_error():
    with pytest.raises(ConfigError, match="unreachable"):
        calibrate_sigma(0.01, 1e-5, 0.25, 12000)


def _digits(tmp_path, **kw):
    return RunConfig.from_dict(
        dict(
            dataset="digits",
            clients=3,
            rounds=4,
            samples_per_client=100,
            batch_size=25,
            delta=1e-3,
            private_model="mlp",
            proxy_model="mlp",
            test_limit=100,
            out=str(tmp_path / "run"),
            **kw,
        ),
        strict=False,
    )


@pytest.mark.parametrize(
    "method,extra",
    [("proxyfl", {}), ("fedavg", {}), ("regular", {}), ("joint", {}), ("dp-fedavg", {"client_rate": 0.8})],
)
def test_a_budget_first_run_ends_at_its_target(tmp_path, method, extra):
    target = 3.0
    cfg = _digits(tmp_path, method=method, target_epsilon=target, **extra)
    summary = run(cfg, progress=False)
    cal = summary["privacy"]["noise_calibration"]
    assert cal is not None and cal["rounds_planned"] == 4
    assert (
        summary["rounds_run"] == 4 and not summary["left"]
    )  # nobody stopped early: the plan fits the budget
    for acc in summary["accounting"]:
        history = acc.get("history") or acc.get("history_hospital")
        eps = acc["epsilon"] if "history" in acc else acc["epsilon_hospital"]
        assert target - CALIBRATION_TOLERANCE <= eps <= target
        assert google_rdp(history, acc["delta"]) == pytest.approx(target, rel=INDEPENDENT_REL)
        assert {h[0] for h in history} == {cal["noise_multiplier"]}
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())  # what the run derived: σ from the budget
    assert plan["noise_multiplier"] == cal["noise_multiplier"] and plan["noise_calibrated"]
    assert plan["calibration"] == cal
    asked = (
        tmp_path / "run" / "config.yaml"
    ).read_text()  # what was asked: the budget, σ left to calibration
    assert (
        "noise_multiplier: 1.0" in asked
        and "calibrate_noise: null" in asked
        and "target_epsilon: 3.0" in asked
    )


def test_cli_prints_sigma_and_refuses_an_unreachable_budget(tmp_path):
    runner = CliRunner()
    base = [
        "run",
        "--dataset",
        "digits",
        "--clients",
        "3",
        "--samples-per-client",
        "100",
        "--batch-size",
        "25",
        "--delta",
        "1e-3",
        "--private-model",
        "mlp",
        "--test-limit",
        "50",
        "--quiet",
    ]
    r = runner.invoke(app, [*base, "--rounds", "2", "--target-epsilon", "5", "--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    assert "budget-first: σ =" in " ".join(r.output.split())
    r = runner.invoke(
        app, [*base, "--rounds", "5000", "--target-epsilon", "0.01", "--out", str(tmp_path / "b")]
    )
    assert r.exit_code == 2 and "unreachable" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "b" / "summary.json").exists()


def test_explicit_sigma_keeps_the_budget_as_a_stop(tmp_path):
    runner = CliRunner()
    r = runner.invoke(
        app,
        [
            "run",
            "--dataset",
            "digits",
            "--clients",
            "3",
            "--samples-per-client",
            "100",
            "--batch-size",
            "25",
            "--delta",
            "1e-3",
            "--private-model",
            "mlp",
            "--test-limit",
            "50",
            "--rounds",
            "3",
            "--noise-multiplier",
            "1.3",
            "--target-epsilon",
            "50",
            "--quiet",
            "--out",
            str(tmp_path / "c"),
        ],
    )
    assert r.exit_code == 0, r.output
    summary = json.loads((tmp_path / "c" / "summary.json").read_text())
    assert summary["privacy"]["noise_calibration"] is None
    assert {a["noise_multiplier"] for a in summary["accounting"]} == {1.3}


def test_calibrate_noise_needs_a_budget(tmp_path):
    with pytest.raises(ConfigError, match="needs a budget"):
        _digits(tmp_path, calibrate_noise=True).resolve()
