"""RunPlan: what a run derived from its config and its data, computed once and saved as plan.json next to the
config.yaml the user asked; RunState: the round loop's state, which checkpoints save."""

import json

import pytest
import torch
import yaml

from silofl.core.errors import ConfigError
from silofl.fl.methods.common import dpsgd_settings
from silofl.privacy.analysis import CALIBRATION_TOLERANCE
from silofl.runner.checkpoint import RunState, load_run, saved_rounds
from silofl.runner.config import RunConfig
from silofl.runner.folder import read_config, read_run_config
from silofl.runner.plan import (
    PLAN_FILE,
    as_run,
    auto_sizes,
    calibrated_sigma,
    config_with_plan,
    party_plans,
    plan,
    read_plan,
)
from silofl.site.dpsgd import round_schedule


class _Split:
    """The part of a split a plan reads: each client's (x, y)."""

    def __init__(self, sizes):
        self.parts = [(torch.zeros(n, 2), torch.zeros(n, dtype=torch.long)) for n in sizes]


def test_auto_sizes_fill_only_what_was_left_to_auto():
    assert auto_sizes(RunConfig(dataset="digits"), 1348) == (168, 42)  # 8 clients share 1348 images; q = 1/4
    assert auto_sizes(RunConfig(), 60000) == (1000, 250)  # the papers' settings
    given = RunConfig.from_dict({"samples_per_client": 100, "batch_size": 10})
    assert auto_sizes(given, 60000) == (100, 10)
    held = RunConfig.from_dict({"combine": "weights", "combine_holdout": 0.2})
    assert auto_sizes(held, 60000, smallest=400) == (1000, 80)  # a quarter of the 320 rows that train


def test_the_plan_derives_q_and_steps_as_the_sites_do():
    cfg = RunConfig.from_dict(
        dict(method="fedavg", clients=3, rounds=5, delta=1e-3, target_epsilon=2.0, noise_multiplier=0.8)
    ).resolve()
    sizes = [100, 80, 60]
    p = plan(cfg, _Split(sizes), split_seed=11, samples_per_client=100, batch_size=20)
    assert p.site_sizes == (100, 80, 60) and (p.split_seed, p.samples_per_client, p.batch_size) == (
        11,
        100,
        20,
    )
    for party, n in zip(p.parties, sizes, strict=True):
        q, steps = round_schedule(n, 20)
        assert (party.sample_rate, party.steps_per_round, party.steps, party.target_epsilon) == (
            q,
            steps,
            5 * steps,
            2.0,
        )
    assert not p.noise_calibrated and p.noise_multiplier == 0.8 and calibrated_sigma(cfg, sizes, 20) is None
    # the config stays what was asked (plan.config); the plan holds the derived values, and a method built
    # from the plan reads both, typed, with no config rewritten
    assert cfg.batch_size is None and cfg.split_seed is None and p.config is cfg
    method = cfg.info.cls(p)
    assert method.plan is p and method.opts is cfg.options
    s = dpsgd_settings(p, 1)
    assert (s.batch_size, s.noise_multiplier, s.clip, s.delta, s.target_epsilon) == (
        20,
        0.8,
        cfg.clip,
        1e-3,
        2.0,
    )
    assert p.party(2) == p.parties[2] and p.party(3) is None
    # consumers outside the methods that read one flat config get the values written in
    ran = config_with_plan(p)
    assert (ran.split_seed, ran.samples_per_client, ran.batch_size, ran.noise_multiplier) == (
        11,
        100,
        20,
        0.8,
    )
    json.dumps(p.to_dict())  # plan.json is plain JSON
    assert as_run(cfg.to_dict(), p.to_dict())["batch_size"] == 20
    steps = RunConfig.from_dict(dict(method="fedavg", clients=2, sample_rate=0.5, local_steps=3)).resolve()
    assert [(x.sample_rate, x.steps_per_round) for x in party_plans(steps, [100, 10], 20)] == [
        (0.5, 3),
        (0.5, 3),
    ]


def test_a_given_sigma_is_kept_and_budgets_only_stop_clients():
    cfg = RunConfig.from_dict(
        dict(method="proxyfl", clients=2, noise_multiplier=0.9, target_epsilons=[1.0, 3.0])
    ).resolve()
    p = plan(cfg, _Split([50, 40]), split_seed=None, samples_per_client=50, batch_size=10)
    assert not p.noise_calibrated and p.noise_multiplier == 0.9 and p.calibration is None
    assert [x.target_epsilon for x in p.parties] == [1.0, 3.0] and p.target_epsilon_of(1) == 3.0
    assert config_with_plan(p).calibrate_noise is False
    client = RunConfig.from_dict(dict(method="dp-fedavg", clients=2, client_rate=0.5, rounds=7)).resolve()
    [server] = party_plans(client, [50, 40])
    assert (server.party, server.sample_rate, server.steps) == ("server", 0.5, 7)
    off = RunConfig.from_dict(dict(method="proxyfl", privacy="off")).resolve()
    assert plan(off, _Split([50]), None, 50, 10).parties == ()


def test_plan_json_is_read_back_and_a_foreign_file_refused(tmp_path):
    assert read_plan(tmp_path) is None  # a folder written before plans: config.yaml holds the values
    (tmp_path / PLAN_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match="unreadable"):
        read_plan(tmp_path)
    (tmp_path / PLAN_FILE).write_text(json.dumps({"format": "other"}))
    with pytest.raises(ConfigError, match="not a silofl plan"):
        read_plan(tmp_path)


def test_run_state_round_trips_and_reads_records_of_the_previous_format():
    s = RunState(
        round=3,
        last={0: {"round": 3}},
        left=[{"client": 1, "round": 2}],
        rejoined=[{"client": 1, "round": 3}],
        train_s=1.5,
        eval_s=0.5,
        bytes_sent={0: 10},
        bytes_received={0: 20},
    )
    cfg = RunConfig.from_dict({"method": "fedavg"}).resolve()
    rec = {"round": 3, **s.to_record(cfg, None, 4)}
    rec = json.loads(json.dumps(rec))
    back = RunState.from_record(rec)
    assert (back.round, back.last, back.left, back.rejoined, back.bytes_sent) == (
        3,
        s.last,
        s.left,
        s.rejoined,
        {0: 10},
    )
    old = {k: v for k, v in rec.items() if k not in ("rejoined", "plan")}  # written before RunState
    assert RunState.from_record(old).rejoined == []
    with pytest.raises(ConfigError, match="malformed"):
        RunState.from_record({k: v for k, v in rec.items() if k != "last"})


@pytest.mark.slow
def test_a_run_folder_keeps_what_was_asked_and_what_was_planned(tiny_cfg, tmp_path):
    from silofl.runner.loop import run

    small = dict(
        tiny_cfg.replace(method="fedavg").to_flat(), clients=2, rounds=2, eval_every=2, batch_size=None
    )
    cfg = RunConfig.from_dict({**small, "target_epsilon": 4.0, "out": str(tmp_path / "r")})
    summary = run(cfg, progress=False)
    out = tmp_path / "r"
    asked = yaml.safe_load((out / "config.yaml").read_text())
    saved = json.loads((out / "plan.json").read_text())
    assert asked["batch_size"] is None and asked["split_seed"] is None and asked["calibrate_noise"] is None
    assert saved["batch_size"] == 30 and isinstance(saved["split_seed"], int) and saved["noise_calibrated"]
    assert saved["calibration"] == summary["privacy"]["noise_calibration"]
    assert [(r["sample_rate"], r["steps"]) for r in saved["calibration"]["parties"]] == [
        (0.25, 8)
    ] * 2  # 2 × 4 steps
    assert all(
        4.0 - CALIBRATION_TOLERANCE <= r["planned_epsilon"] <= 4.0 for r in saved["calibration"]["parties"]
    )
    ran = read_run_config(out)
    assert (ran.batch_size, ran.split_seed, ran.noise_multiplier) == (
        30,
        saved["split_seed"],
        saved["noise_multiplier"],
    )
    assert {h[0] for a in summary["accounting"] for h in a["history"]} == {saved["noise_multiplier"]}
    # an old run folder (its config.yaml as it ran, no plan.json) reads the same
    (out / "config.yaml").write_text(ran.to_yaml())
    (out / PLAN_FILE).unlink()
    assert read_config(out) == ran.to_flat()

    # a checkpoint of the previous format (no plan, no rejoined) resumes
    cp = RunConfig.from_dict({**small, "checkpoint_every": 1, "out": str(tmp_path / "c")})
    run(cp, progress=False)
    root = tmp_path / "c" / "checkpoint"
    rnd = saved_rounds(root)[-1]
    run_file = root / f"round{rnd}" / "run.json"
    record = json.loads(run_file.read_text())
    assert record["plan"]["batch_size"] == 30 and load_run(root, rnd)[1]["round"] == rnd == 2
    run_file.write_text(json.dumps({k: v for k, v in record.items() if k not in ("plan", "rejoined")}))
    resumed = run(cp.replace(rounds=3), progress=False, resume=True)
    assert resumed["rounds_run"] == 3 and resumed["data_split_seed"] == record["config"]["split_seed"]
    assert [sum(h[2] for h in a["history"]) for a in resumed["accounting"]] == [
        12,
        12,
    ]  # 3 rounds × 4 steps: carried on
