"""The DP-SGD recipe as method options: validated with one-line errors, today's defaults, budget-first σ from
the steps that will run; whole FedAvg runs with one local DP step per round, server momentum, SGD momentum,
EMA and augmentation multiplicity whose accountant counts exactly what ran (dp-accounting agrees)."""

import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.rdp import RdpAccountant
from typer.testing import CliRunner

from silofl.cli.main import app
from silofl.fl.options import DPSGDOptions
from silofl.privacy.analysis import DEFAULT_ORDERS
from silofl.runner.config import RunConfig

runner = CliRunner()
TINY = [
    "--dataset",
    "digits",
    "--clients",
    "3",
    "--rounds",
    "2",
    "--samples-per-client",
    "100",
    "--batch-size",
    "25",
    "--delta",
    "1e-3",
    "--test-limit",
    "150",
    "--quiet",
]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--optimizer", "rmsprop"], "unknown optimizer 'rmsprop'; choose one of: adam, sgd"),
        (["--momentum", "0.9"], "momentum and nesterov apply to optimizer 'sgd'"),
        (["--server-momentum", "0.9"], "option server_momentum does not apply to method 'proxyfl'"),
    ],
)
def test_recipe_flags_are_refused_with_one_line_before_anything_is_written(tmp_path, args, message):
    r = runner.invoke(app, ["run", *TINY, "--out", str(tmp_path / "x"), *args])
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.split()) and "Traceback" not in r.output
    assert not (tmp_path / "x").exists()


def test_recipe_options_are_validated():
    from silofl.core.errors import ConfigError

    for opts, message in [
        ({"optimizer": "sgd", "nesterov": True}, "nesterov needs momentum > 0"),
        ({"optimizer": "sgd", "momentum": 1}, "momentum must lie in [0, 1)"),
        ({"ema_decay": 1}, "ema_decay must lie in [0, 1)"),
        ({"sample_rate": 1.5}, "sample_rate must lie in (0, 1]"),
        ({"sample_rate": 0}, "sample_rate must lie in (0, 1]"),
        ({"local_steps": 0}, "local_steps must lie in [1, 100000]"),
        ({"sample_rate": 1e-9}, "DP steps a round (at most 100,000)"),
        ({"augmult": -1}, "augmult must be 0 (off)"),
        ({"aug_pad": -1}, "aug_pad must be a non-negative number"),
        ({"server_momentum": -0.1}, "server_momentum must lie in [0, 1)"),
        ({"server_lr": 0}, "server_lr must be a finite positive number"),
    ]:
        with pytest.raises(ConfigError) as e:
            RunConfig.from_dict({"method": "fedavg", **opts}).resolve()
        assert message in str(e.value), (opts, str(e.value))


def test_momentum_that_a_replaced_model_would_clear_every_round_is_flagged(caplog, monkeypatch):
    from silofl.fl import options

    monkeypatch.setattr(options, "_WARNED", set())  # warned once per process
    base = {"method": "proxyfl", "optimizer": "sgd", "momentum": 0.9, "local_steps": 1}
    with caplog.at_level("WARNING", logger="silofl"):
        RunConfig.from_dict(base).resolve()
    assert "momentum 0.9 does nothing here" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="silofl"):
        RunConfig.from_dict({**base, "optimizer_state": "keep"}).resolve()
        RunConfig.from_dict({**base, "local_steps": 4}).resolve()
    assert "does nothing" not in caplog.text


def test_augmult_on_a_table_is_refused():
    cfg = RunConfig.from_dict(
        dict(method="fedavg", dataset="table", site_data=["a.csv", "b.csv"], schema="s.yaml", augmult=2)
    )
    with pytest.raises(Exception, match="augmult augments images; dataset 'table' has none"):
        cfg.resolve()

    class WithFeatures:  # a run whose sites compute features once per image (the `features` run option)
        dataset, features = "fashion-mnist", "scatter"

    with pytest.raises(Exception, match="augmult augments raw images; with features"):
        RunConfig.from_dict(dict(method="fedavg", augmult=2)).options.validate(WithFeatures())


def test_defaults_keep_todays_recipe_and_clip_0_1_is_accepted():
    d = DPSGDOptions.defaults()
    assert {
        k: d[k]
        for k in ("optimizer", "momentum", "nesterov", "ema_decay", "augmult", "sample_rate", "local_steps")
    } == {
        "optimizer": "adam",
        "momentum": 0.0,
        "nesterov": False,
        "ema_decay": 0.0,
        "augmult": 0,
        "sample_rate": None,
        "local_steps": None,
    }
    cfg = RunConfig.from_dict(dict(method="fedavg", clip=0.1)).resolve()
    assert cfg.clip == 0.1 and cfg.options.server_lr == 1.0 and cfg.options.server_momentum == 0.0
    fml = RunConfig.from_dict(
        dict(method="fml", server_momentum=0.9, optimizer="sgd", momentum=0.5)
    ).resolve()
    assert fml.to_dict()["fml"]["server_momentum"] == 0.9 and fml.to_dict()["fml"]["optimizer"] == "sgd"


def test_budget_first_sigma_is_calibrated_for_the_steps_that_will_run():
    base = dict(method="fedavg", rounds=50, batch_size=250, target_epsilon=3.0)
    today = RunConfig.from_dict(base).resolve().calibration_plan([1000, 1000])
    assert today[0]["sample_rate"] == 0.25 and today[0]["steps"] == 200
    one = (
        RunConfig.from_dict({**base, "local_steps": 1, "sample_rate": 0.5})
        .resolve()
        .calibration_plan([1000, 800])
    )
    assert [(p["sample_rate"], p["steps"]) for p in one] == [(0.5, 50), (0.5, 50)]


# ---------------------------------------------------------------------------------------------- whole runs
def dp_accounting_epsilon(sigma, q, steps, delta):
    acc = RdpAccountant(list(DEFAULT_ORDERS))
    acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)
    return acc.get_epsilon(delta)


@pytest.mark.slow
def test_fedavg_one_local_step_server_momentum_sgd_ema_augmult_counts_one_step_per_round(tmp_path):
    from silofl.runner.loop import run

    cfg = RunConfig.from_dict(
        dict(
            method="fedavg",
            dataset="digits",
            clients=3,
            rounds=4,
            samples_per_client=100,
            delta=1e-3,
            test_limit=150,
            seed=5,
            target_epsilon=3.0,
            clip=0.1,
            lr=0.5,
            optimizer="sgd",
            momentum=0.9,
            nesterov=True,
            ema_decay=0.5,
            sample_rate=0.5,
            local_steps=1,
            server_momentum=0.9,
            augmult=2,
            aug_flip=False,
            out=str(tmp_path / "r"),
        )
    )
    s = run(cfg, progress=False)
    plan = s["privacy"]["noise_calibration"]
    assert {(p["sample_rate"], p["steps"]) for p in plan["parties"]} == {(0.5, 4)}
    sigma = plan["noise_multiplier"]
    for a in s["accounting"]:
        assert [tuple(h) for h in a["history"]] == [(sigma, 0.5, 4)]  # one DP step per round, as run
        assert a["epsilon"] == pytest.approx(dp_accounting_epsilon(sigma, 0.5, 4, 1e-3), rel=1e-3)
        assert a["epsilon"] <= 3.0 * 1.005
    written = (tmp_path / "r" / "config.yaml").read_text()
    for line in ("optimizer: sgd", "local_steps: 1", "server_momentum: 0.9", "ema_decay: 0.5", "augmult: 2"):
        assert line in written
    assert s["final"]["global_acc"]["mean"] is not None


@pytest.mark.slow
def test_the_server_steps_with_momentum_on_the_average_of_the_uploads(tiny_cfg):
    from silofl.comm.wire import decode
    from silofl.fl.exchange.centralized import WEIGHT_KEY
    from tests.helpers import build_run, spy_packets

    b = build_run(tiny_cfg.replace(method="fedavg", server_lr=0.7, server_momentum=0.9, local_steps=1))
    proto = b.coordinator
    proto.start()
    w = {k: v.double() for k, v in proto.server.state().items()}
    m = None
    packets = spy_packets(b.engine)
    for rnd in (1, 2):
        packets.clear()
        proto.run_round(rnd)
        proto.flush()  # the round's broadcast goes with each site's next request: deliver it now
        ups = [decode(d)[0] for _, dst, d in packets if dst == proto.server_id]
        for u in ups:
            u.pop(WEIGHT_KEY)
        avg = {k: sum(u[k].double() for u in ups) / len(ups) for k in w}
        delta = {k: avg[k] - w[k] for k in w}
        m = delta if m is None else {k: 0.9 * m[k] + delta[k] for k in w}
        w = {k: w[k] + 0.7 * m[k] for k in w}
        for k, v in proto.server.state().items():
            torch.testing.assert_close(v.double(), w[k], rtol=1e-5, atol=1e-6)
            assert torch.equal(b.sites[0].shared_state()[k], v)  # the sites hold the server's model
        assert all(a["steps"] == rnd for a in [site.privacy_report() for site in b.sites])


def test_a_flag_overrides_a_method_option_nested_in_the_config_file(tmp_path):
    import yaml

    best = tmp_path / "best.yaml"  # as `silofl tune` writes it: the method's options under its name
    best.write_text(
        yaml.safe_dump(
            {"method": "fedavg", "dataset": "digits", "fedavg": {"optimizer": "adam", "momentum": 0.0}}
        )
    )
    r = runner.invoke(app, ["run", "--config", str(best), "--momentum", "0.9", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "momentum and nesterov apply to optimizer 'sgd'" in " ".join(r.output.split())
    assert not (tmp_path / "x").exists()
