"""`silofl tune`: trials are scored on the validation split (training data no client holds), never the test
set; the best config and the tuning-inclusive spend are written."""

import json

import pytest
import torch
import yaml
from typer.testing import CliRunner

import silofl.runner.data as run_data
from silofl.cli.main import app
from silofl.core.errors import ConfigError
from silofl.data.types import Dataset
from silofl.experiments.tune import parse_grid, tune, tuning_cost
from silofl.privacy import epsilon_of
from silofl.privacy.analysis import DEFAULT_ORDERS, rdp_curve
from silofl.privacy.tuning import poisson, repeat_and_select_epsilon
from silofl.runner.config import RunConfig


@pytest.fixture
def poisoned_test_split(monkeypatch):
    """Any read of the test split fails; its tensors are garbage (NaN inputs, impossible labels)."""
    real = run_data.load_dataset

    def load(*a, **kw):
        d = real(*a, **kw)
        d.x_test = torch.full_like(d.x_test, float("nan"))
        d.y_test = torch.full_like(d.y_test, -1)
        return d

    def refuse(self, limit=None):
        raise AssertionError("the test split was read")

    monkeypatch.setattr(run_data, "load_dataset", load)
    monkeypatch.setattr(Dataset, "test_split", refuse)


def _base(tmp_path):
    return RunConfig.from_dict(
        dict(
            method="proxyfl",
            dataset="digits",
            clients=3,
            rounds=2,
            samples_per_client=100,
            batch_size=25,
            delta=1e-3,
            private_model="mlp",
            proxy_model="mlp",
            target_epsilon=4.0,
            eval_split="validation",
            validation_size=300,
            seed=1,
            out=str(tmp_path / "unused"),
        )
    )


@pytest.mark.slow  # a whole run (fast tier ≤ 60 s)
def test_tune_never_touches_the_test_set(tmp_path, poisoned_test_split):
    res = tune(_base(tmp_path), parse_grid(["lr=0.001,0.01"]), tmp_path / "t")
    assert len(res["trials"]) == 2
    for r in res["trials"]:
        assert r["test_set"].startswith("validation: 300 digits training examples held by no client")
        assert 0.0 < r["validation"] <= 1.0  # a NaN test set would give 0
        assert r["epsilon"] <= 4.0
    best = yaml.safe_load((tmp_path / "t" / "best.yaml").read_text())
    assert best["eval_split"] == "test" and best["proxyfl"]["lr"] == res["best"]["settings"]["lr"]
    assert best["target_epsilon"] == 4.0
    # the tuning-inclusive spend: two runs composed per client — more than one run's budget
    c = res["tuning_cost"]
    assert c["trials"] == 2 and 4.0 < c["max"]
    one = json.loads((tmp_path / "t/trials/trial0/summary.json").read_text())["accounting"][0]["history"]
    assert c["per_party"]["client0"] <= epsilon_of("rdp", tuple(tuple(h) for h in one * 2), 1e-3) + 1e-9
    assert "Tuning-inclusive" in (tmp_path / "t" / "tune.md").read_text()
    assert len((tmp_path / "t" / "tune.csv").read_text().splitlines()) == 3


def test_validation_is_disjoint_from_every_client(tmp_path):
    from silofl.runner.data import prepare_data

    cfg = _base(tmp_path).resolve()
    cfg, split = prepare_data(cfg, torch.device("cpu"))
    train = {tuple(x.flatten().tolist()) for x, _ in split.parts for x in x}
    assert not any(tuple(x.flatten().tolist()) in train for x in split.test[0])
    assert len(split.test[1]) == 300 and split.test_set.startswith("validation")


def test_cli_bad_grid_is_one_line(tmp_path):
    r = CliRunner().invoke(
        app, ["tune", "--target-epsilon", "5", "--grid", "lr", "--out", str(tmp_path / "b")]
    )
    assert r.exit_code == 2 and "KEY=V1,V2" in r.output and "Traceback" not in r.output


@pytest.mark.slow
def test_cli_tune(tmp_path):
    runner = CliRunner()
    args = [
        "tune",
        "--method",
        "fedavg",
        "--target-epsilon",
        "5",
        "--set",
        "dataset=digits",
        "--set",
        "clients=2",
        "--set",
        "rounds=1",
        "--set",
        "samples_per_client=100",
        "--set",
        "batch_size=25",
        "--set",
        "delta=0.001",
        "--set",
        "validation_size=100",
    ]
    r = runner.invoke(app, [*args, "--grid", "lr=0.001,0.01", "--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    assert "tuning-inclusive" in " ".join(r.output.split())


def test_tuning_cost_composes_histories():
    s = {
        "accounting": [{"client": 0, "history": [[1.0, 0.25, 8]], "delta": 1e-5, "accountant": "opacus.rdp"}]
    }
    c = tuning_cost([s, s])
    assert c["per_party"]["client0"] == pytest.approx(epsilon_of("rdp", ((1.0, 0.25, 16),), 1e-5))


@pytest.mark.slow  # two pooled runs
def test_tuning_cost_of_pooled_trials_composes_their_site_ledgers(tmp_path):
    """Trials with pooled noise record no DP-SGD history: their cost is every trial's secure-sum entries of
    each site's ledger composed by the site accountant — above one trial's ε, at most the trials' sum."""
    from silofl.privacy.site_accountant import compose, epsilon_at, spend_of

    base = _base(tmp_path).replace(
        method="fedavg",
        secure_aggregation=True,
        noise_placement="pooled",
        optimizer="sgd",
        sample_rate=1.0,
    )
    res = tune(base, parse_grid(["lr=0.01,0.1"]), tmp_path / "t")
    cost = res["tuning_cost"]
    assert "site-ledger" in cost["method"] and set(cost["per_party"]) == {"client0", "client1", "client2"}
    one = []
    for trial in ("trial0", "trial1"):
        lines = (tmp_path / "t" / "trials" / trial / "sites" / "client0" / "ledger.jsonl").read_text()
        spends = [x for x in map(spend_of, map(json.loads, lines.splitlines())) if x is not None]
        assert spends and all(x.kind == "secagg-discrete" for x in spends)
        curve, eps, dlt, _ = compose(spends, "server")
        one.append(epsilon_at(curve, (eps, dlt), 1e-3))
    assert max(one) < cost["per_party"]["client0"] <= sum(one) + 1e-9


# ------------------------------------------------------------------------ random trials (Papernot & Steinke
# 2022)
RANDOM_ARGS = [
    "tune",
    "--method",
    "fedavg",
    "--target-epsilon",
    "5",
    "--set",
    "dataset=digits",
    "--set",
    "clients=2",
    "--set",
    "rounds=1",
    "--set",
    "samples_per_client=100",
    "--set",
    "batch_size=25",
    "--set",
    "delta=0.001",
    "--set",
    "validation_size=100",
    "--grid",
    "lr=0.001,0.01",
]


def _fake_plan(monkeypatch, curve_of=lambda: rdp_curve(((0.8, 0.25, 4),))):
    """Plan without loading data or calibrating: every party's one-trial curve is that of (σ 0.8, q 0.25, 4
    steps)."""
    import silofl.experiments.tune as tune_mod

    monkeypatch.setattr(
        tune_mod, "planned_curves", lambda base, combos: {"client0": curve_of(), "client1": curve_of()}
    )


def _fake_trials(monkeypatch, scores):
    """Trials that train nothing: trial i scores ``scores[settings lr]`` and records (σ 0.8, q 0.25, 4
    steps)."""
    import silofl.experiments.tune as tune_mod

    seen = []

    def fake(cfg, i, combo, score_field, progress, console):
        seen.append(cfg)
        acc = [
            {"client": k, "history": [[0.8, 0.25, 4]], "delta": cfg.delta, "accountant": "opacus.rdp"}
            for k in (0, 1)
        ]
        row = {
            "trial": i,
            "settings": combo,
            "validation": scores[combo["lr"]],
            "epsilon": 4.9,
            "noise_multiplier": 0.8,
            "seconds": 0.0,
            "test_set": "validation: fake",
        }
        return row, {"accounting": acc}

    monkeypatch.setattr(tune_mod, "_run_trial", fake)
    return seen


def test_random_trials_draw_select_and_account(tmp_path, monkeypatch):
    _fake_plan(monkeypatch)
    seen = _fake_trials(monkeypatch, {0.001: 0.5, 0.01: 0.7, 0.1: 0.6})
    base = _base(tmp_path).replace(method="fedavg")
    res = tune(
        base, parse_grid(["lr=0.001,0.01,0.1"]), tmp_path / "r", random_trials="poisson:6", max_trials=24
    )
    rt = res["random_trials"]
    assert rt["drawn"] == len(res["trials"]) == len(rt["settings_drawn"]) == len(seen) >= 1
    assert [r["settings"]["lr"] for r in res["trials"]] == [
        [0.001, 0.01, 0.1][i] for i in rt["settings_drawn"]
    ]
    assert res["best"]["validation"] == max(r["validation"] for r in res["trials"])
    # independent trials: each its own seed (seeded research run), one data split for all
    assert len({c.seed for c in seen}) == len(seen) and {c.data_seed for c in seen} == {1}
    # the bound: one trial < Papernot–Steinke (Theorem 6) < the composition of the trials run, once K is large
    curve = rdp_curve(((0.8, 0.25, 4),))
    want = repeat_and_select_epsilon(DEFAULT_ORDERS, curve, poisson(6), 1e-3, 24)["epsilon"]
    assert rt["per_party"]["client0"]["tuned"] == pytest.approx(want)
    assert rt["per_party"]["client0"]["one_trial"] == pytest.approx(
        epsilon_of("rdp", ((0.8, 0.25, 4),), 1e-3)
    )
    assert (
        rt["theorem"] == "Theorem 6, Poisson" and rt["max_trials"] == 24 and rt["selection"] == "global_acc"
    )
    assert res["tuning_cost"]["per_party"]["client0"] == pytest.approx(
        epsilon_of("rdp", ((0.8, 0.25, 4 * rt["drawn"]),), 1e-3)
    )
    md = (tmp_path / "r" / "tune.md").read_text()
    assert "Theorem 6, Poisson" in md and "best of K" in md and "composition" in md
    assert json.loads((tmp_path / "r" / "tune.json").read_text())["random_trials"]["drawn"] == rt["drawn"]
    # the same seed draws the same K and settings
    again = tune(
        base, parse_grid(["lr=0.001,0.01,0.1"]), tmp_path / "r2", random_trials="poisson:6", max_trials=24
    )
    assert again["random_trials"]["settings_drawn"] == rt["settings_drawn"]


def test_random_trials_mutual_learning_selects_on_the_dp_proxy(tmp_path, monkeypatch):
    _fake_plan(monkeypatch)
    _fake_trials(monkeypatch, {0.001: 0.5, 0.01: 0.7})
    res = tune(_base(tmp_path), parse_grid(["lr=0.001,0.01"]), tmp_path / "p", random_trials="geometric:0.5")
    assert res["selection"] == "proxy_acc" and res["random_trials"]["theorem"].startswith("Theorem 2")
    rt = res["random_trials"]  # the default cap spends at most 0.1% of δ
    assert rt["per_party"]["client0"]["truncation_delta"] <= 1e-3 * 1e-3 and rt["tail"] > 0


def test_random_trials_k_zero_runs_nothing(tmp_path, monkeypatch):
    _fake_plan(monkeypatch)
    seen = _fake_trials(monkeypatch, {0.001: 0.5, 0.01: 0.7})
    base = _base(tmp_path).replace(seed=7)  # its first draw is 0.118 < P[K = 0] = e^{-1}
    res = tune(base, parse_grid(["lr=0.001,0.01"]), tmp_path / "z", random_trials="poisson:1")
    assert res["random_trials"]["drawn"] == 0 and res["trials"] == [] and res["best"] is None and not seen
    assert not (tmp_path / "z" / "best.yaml").exists() and not (tmp_path / "z" / "trials").exists()
    assert "K = 0" in (tmp_path / "z" / "tune.md").read_text()
    assert res["random_trials"]["max"] > 0  # the bound still holds for what was (not) released


def test_random_trials_need_budget_first_trials(tmp_path):
    base = _base(tmp_path).replace(calibrate_noise=False, noise_multiplier=1.0)
    with pytest.raises(ConfigError, match="budget-first"):
        tune(base, parse_grid(["lr=0.001"]), tmp_path / "n", random_trials="poisson:2")
    assert not (tmp_path / "n").exists()


@pytest.mark.parametrize(
    "extra,msg",
    [
        (["--random-trials", "poisson:-1"], "Poisson mean"),
        (["--random-trials", "geometric:2"], "0 < γ < 1"),
        (["--random-trials", "uniform:3"], "random trials are"),
        (["--random-trials", "negbin:0.5"], "negbin:ETA,GAMMA"),
        (["--random-trials", "poisson:2", "--max-trials", "0"], "at least 1"),
        (["--max-trials", "5"], "needs --random-trials"),
        (["--random-trials", "poisson:4", "--max-trials", "3"], "raise the cap"),
    ],
)
def test_cli_random_trials_bad_values(tmp_path, monkeypatch, extra, msg):
    _fake_plan(monkeypatch)
    r = CliRunner().invoke(app, [*RANDOM_ARGS, *extra, "--out", str(tmp_path / "bad")])
    assert r.exit_code == 2 and msg in " ".join(r.output.split()) and "Traceback" not in r.output
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_cli_random_trials_end_to_end(tmp_path):
    """The bundled digits, tiny rounds, seeded: K ~ Poisson(2) trials train for real, the report states
    both bounds."""
    out = tmp_path / "e"
    r = CliRunner().invoke(
        app,
        [
            *RANDOM_ARGS,
            "--set",
            "seed=3",
            "--random-trials",
            "poisson:2",
            "--max-trials",
            "15",
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    res = json.loads((out / "tune.json").read_text())
    rt = res["random_trials"]
    assert rt["drawn"] == len(res["trials"]) >= 1 and "Papernot–Steinke" in " ".join(r.output.split())
    for party, v in rt["per_party"].items():
        assert v["one_trial"] <= 5.0 < v["tuned"]
        assert res["tuning_cost"]["per_party"][party] <= v["one_trial"] * rt["drawn"] + 1e-9
        run = [
            a
            for a in json.loads((out / "trials/trial0/summary.json").read_text())["accounting"]
            if f"client{a['client']}" == party
        ][0]
        assert v["one_trial"] >= epsilon_of("rdp", tuple(tuple(h) for h in run["history"]), 1e-3) - 1e-9
    assert (out / "best.yaml").exists() and "Theorem 6, Poisson" in (out / "tune.md").read_text()


def test_recipe_axes_parse_and_every_combination_is_checked_before_a_trial(tmp_path):
    grid = parse_grid(["features=none,scatter,off", "momentum=0,0.9", "local_steps=1,4", "sample_rate=0.5,1"])
    assert grid == {
        "features": ["none", "scatter", "off"],
        "momentum": [0, 0.9],
        "local_steps": [1, 4],
        "sample_rate": [0.5, 1],
    }
    base = _base(tmp_path).replace(method="fedavg")
    with pytest.raises(
        ConfigError, match="grid setting local_steps=0: local_steps must lie in \\[1, 100000\\]"
    ):
        tune(base, parse_grid(["local_steps=1,0"]), tmp_path / "t")
    with pytest.raises(
        ConfigError, match="grid setting momentum=0.9: momentum and nesterov apply to optimizer 'sgd'"
    ):
        tune(base, parse_grid(["momentum=0,0.9"]), tmp_path / "t")
    assert not (tmp_path / "t").exists()


@pytest.mark.slow
def test_tune_searches_momentum_and_local_steps_and_counts_what_each_trial_ran(tmp_path):
    base = _base(tmp_path).replace(method="fedavg", optimizer="sgd", lr=0.1, clip=0.1, sample_rate=0.5)
    res = tune(base, parse_grid(["momentum=0,0.9", "local_steps=1,2"]), tmp_path / "t")
    assert len(res["trials"]) == 4
    hist = []
    for r in res["trials"]:
        acc = json.loads((tmp_path / "t" / "trials" / f"trial{r['trial']}" / "summary.json").read_text())[
            "accounting"
        ]
        assert acc[0]["steps"] == 2 * r["settings"]["local_steps"] and acc[0]["sample_rate"] == 0.5
        assert r["epsilon"] <= 4.0 * 1.005
        hist += [tuple(h) for h in acc[0]["history"]]
    assert res["tuning_cost"]["per_party"]["client0"] == pytest.approx(epsilon_of("rdp", tuple(hist), 1e-3))
    best = yaml.safe_load((tmp_path / "t" / "best.yaml").read_text())["fedavg"]
    assert (best["momentum"], best["local_steps"]) == (
        res["best"]["settings"]["momentum"],
        res["best"]["settings"]["local_steps"],
    )
