"""--vs-alone: the go-it-alone baseline is Regular without DP on the same split, rounds and architecture."""

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from silofl.cli.main import app
from silofl.runner.alone import alone_config
from silofl.runner.config import RunConfig


def test_alone_config_keeps_the_split_and_model(tmp_path):
    cfg = RunConfig.from_dict(
        dict(
            method="proxyfl",
            dataset="digits",
            clients=3,
            rounds=7,
            samples_per_client=100,
            batch_size=25,
            private_model="cnn1",
            target_epsilon=3.0,
            lr=0.003,
            out=str(tmp_path / "r"),
        )
    ).resolve()
    a = alone_config(cfg, 1234).resolve()
    assert (a.method, a.privacy, a.split_seed, a.rounds, a.options.private_model, a.options.lr) == (
        "regular",
        "off",
        1234,
        7,
        "cnn1",
        0.003,
    )
    assert (a.clients, a.samples_per_client, a.batch_size, a.partition) == (3, 100, 25, "p_major")
    assert a.out == str(tmp_path / "r" / "alone")


@pytest.mark.slow
def test_cli_vs_alone_prints_and_records(tmp_path):
    out = tmp_path / "v"
    r = CliRunner().invoke(
        app,
        [
            "run",
            "--dataset",
            "digits",
            "--clients",
            "2",
            "--samples-per-client",
            "100",
            "--batch-size",
            "25",
            "--delta",
            "1e-3",
            "--private-model",
            "mlp",
            "--rounds",
            "2",
            "--target-epsilon",
            "8",
            "--vs-alone",
            "--quiet",
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    assert "vs training alone" in " ".join(r.output.split())
    s = json.loads((out / "summary.json").read_text())
    assert s["vs_alone"]["alone_private_acc"] == pytest.approx(
        json.loads((out / "alone" / "summary.json").read_text())["final"]["private_acc"]["mean"]
    )


def test_alone_config_copies_every_data_setting_of_a_table_run(tmp_path):
    """The reference of a per-site table run reads the same files with the same schema and shares (it used to
    lose --site-data and fail: "dataset 'table' needs --site-data")."""
    cfg = RunConfig.from_dict(
        dict(
            method="fedavg",
            dataset="table",
            site_data=["a.csv", "b.csv"],
            schema="s.yaml",
            test_data="t.csv",
            test_fraction=0.3,
            rounds=4,
            proxy_model="logreg",
            combine="stack",
            eval_split="test",
            test_limit=50,
            target_epsilon=3.0,
            out=str(tmp_path / "r"),
        )
    ).resolve()
    a = alone_config(cfg, 99).resolve()
    assert (
        a.method,
        a.privacy,
        a.dataset,
        a.site_data,
        a.schema,
        a.test_data,
        a.test_fraction,
        a.partition,
    ) == ("regular", "off", "table", ["a.csv", "b.csv"], "s.yaml", "t.csv", 0.3, "site")
    assert (a.clients, a.rounds, a.test_limit, a.options.private_model, a.combine, a.split_seed) == (
        2,
        4,
        50,
        "logreg",
        "none",
        99,
    )  # going alone trains on all of its rows: nothing held out


@pytest.mark.slow
@pytest.mark.parametrize(
    "method,extra",
    [
        ("fedavg", ["--combine", "weights", "--proxy-model", "mlp"]),
        (
            "dp-fedavg",
            ["--combine", "stack", "--proxy-model", "mlp", "--partition", "iid", "--test-limit", "200"],
        ),
    ],
)
def test_vs_alone_and_combination_on_digits(tmp_path, method, extra):
    """Every method (example- and client-level) compares with going alone; with --combine the combined model
    (own non-DP model + the global DP one) is reported, and the line says its gain."""
    out = tmp_path / method
    r = CliRunner().invoke(
        app,
        [
            "run",
            "--method",
            method,
            "--dataset",
            "digits",
            "--clients",
            "2",
            "--samples-per-client",
            "160",
            "--batch-size",
            "16",
            "--delta",
            "1e-3",
            "--rounds",
            "2",
            "--threads",
            "1",
            "--seed",
            "0",
            "--vs-alone",
            "--quiet",
            "--out",
            str(out),
            *extra,
        ],
    )
    assert r.exit_code == 0, r.output
    line = " ".join(r.output.split()).split("vs training alone")[1]
    s = json.loads((out / "summary.json").read_text())
    comb = s["vs_alone"]["this_run"]["combined_acc"]
    assert f"combined {comb:.3f}" in line and 0.0 <= comb <= 1.0
    assert json.loads((out / "models" / "client0_combined.json").read_text())["parts"] == ["own", "global"]
    assert (out / "models" / "client0_own.safetensors").is_file()
    assert s["final"]["per_client"][0]["combined_acc"] is not None
    from silofl.experiments.evaluate import evaluate_run  # the saved combination gives the recorded figure

    again = {r["model"]: r for r in evaluate_run(out)}
    assert again["client1_combined"]["accuracy"] == pytest.approx(
        again["client1_combined"]["recorded"], abs=1e-6
    )


def _unseeded_digits(tmp_path, method="proxyfl"):
    return RunConfig.from_dict(
        dict(
            method=method,
            dataset="digits",
            clients=3,
            rounds=1,
            samples_per_client=60,
            batch_size=20,
            private_model="mlp",
            target_epsilon=8.0,
            delta=1e-3,
            out=str(tmp_path / "r"),
        )
    ).resolve()


def test_alone_trains_on_exactly_the_runs_rows_without_a_seed(tmp_path):
    """No --seed: the run draws its split; going alone reuses that draw (it used to draw its own)."""
    import torch

    from silofl.runner.data import prepare_run

    cfg = _unseeded_digits(tmp_path)
    assert cfg.data_seed is None
    plan, split = prepare_run(cfg, torch.device("cpu"))
    assert plan.split_seed is not None
    a_plan, a_split = prepare_run(alone_config(cfg, plan.split_seed).resolve(), torch.device("cpu"))
    assert a_plan.split_seed == plan.split_seed
    assert len(a_split.indices) == len(split.indices) == 3
    for mine, theirs, (x, y), (ax, ay) in zip(
        a_split.indices, split.indices, split.parts, a_split.parts, strict=True
    ):
        assert np.array_equal(mine, theirs)
        assert torch.equal(x, ax) and torch.equal(y, ay)
    other, _ = prepare_run(cfg, torch.device("cpu"))  # a second unseeded run draws afresh
    assert other.split_seed != plan.split_seed


@pytest.mark.slow
def test_unseeded_run_records_its_split_and_alone_reuses_it(tmp_path):
    from silofl.runner.alone import compare_with_alone
    from silofl.runner.loop import run

    cfg = _unseeded_digits(tmp_path)
    summary = run(cfg, progress=False)
    out = tmp_path / "r"
    drawn = json.loads((out / "plan.json").read_text())["split_seed"]
    assert drawn is not None and summary["data_split_seed"] == drawn
    compare_with_alone(cfg, summary)
    assert json.loads((out / "alone" / "plan.json").read_text())["split_seed"] == drawn
    assert json.loads((out / "alone" / "summary.json").read_text())["data_split_seed"] == drawn
    decision = json.loads((out / "decision.json").read_text())  # rewritten with going alone on the same rows
    for row in decision["rows"]:
        assert row["reference"]["internal"]["name"] == "silofl Regular, no DP"
        gain = row["models"]["private"]["gain"]["internal"]
        assert gain["estimate"] == pytest.approx(
            row["models"]["private"]["internal"]["estimate"]
            - row["reference"]["internal"]["figure"]["estimate"]
        )
        assert row["verdict"]


# ------------------------------------------------------------------ going alone tuned on validation rows
def _tables(folder, poison_test_rows: bool = False, seed: int = 7):
    """Two sites' tables; with ``poison_test_rows`` every label of the rows the split holds out for testing
    is flipped (the rows themselves, and so every training and validation row, stay the same)."""
    from silofl.data.sites import holdout
    from tests.data.test_tables import site_frame, write_csv, write_schema

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in range(2):
        df = site_frame(80, seed=k, shift=5.0 * k)
        p = folder / f"s{k}.csv"
        if poison_test_rows:
            _, test = holdout(len(df), 0.3, seed, k, str(p))
            df.loc[test, "outcome"] = df.loc[test, "outcome"].map({"yes": "no", "no": "yes"})
        paths.append(str(write_csv(folder, df, p.name)))
    return str(write_schema(folder)), paths


def _table_cfg(schema, paths, out, seed=7):
    return RunConfig.from_dict(
        dict(
            method="fedavg",
            dataset="table",
            schema=schema,
            site_data=paths,
            test_fraction=0.3,
            rounds=2,
            proxy_model="logreg",
            metric="auroc",
            lr=0.5,
            optimizer="sgd",
            target_epsilon=3.0,
            delta=1e-3,
            seed=0,
            out=str(out),
        )
    ).resolve()


@pytest.mark.slow  # whole runs (the fast tier stays ≤ 60 s)
def test_going_alone_is_tuned_on_validation_rows_and_never_reads_the_test_rows(tmp_path):
    from silofl.runner.alone import REGULAR, SKLEARN, best_index, tune_alone

    records = []
    for poison in (False, True):
        schema, paths = _tables(tmp_path / f"data{poison}", poison)
        cfg = _table_cfg(schema, paths, tmp_path / f"run{poison}")
        records.append(tune_alone(alone_config(cfg, 7), trials=2))
    clean, poisoned = records
    assert clean["grid"] == {"lr": pytest.approx([0.5 / 10**0.5, 0.5]), "C": [0.1, 1.0]}
    assert "test rows are not read" in clean["validation_split"]
    for a, b in zip(clean["sites"], poisoned["sites"], strict=True):
        assert a == b  # every validation figure and choice the same: the test rows' labels are not read
        assert a["regular"]["lr"] == clean["grid"]["lr"][best_index("auroc", a["regular"]["by_lr"])]
        stronger = SKLEARN if a["sklearn"]["validation"] > a["regular"]["validation"] else REGULAR
        assert a["chosen"] == stronger  # the stronger of the two on validation
    assert all(
        (tmp_path / "runFalse" / "alone" / "models" / f"client{k}_private.json").is_file() for k in (0, 1)
    )


def test_the_stronger_reference_is_picked_by_its_validation_figure():
    from silofl.runner.alone import best_index

    assert best_index("auroc", [0.7, 0.9, 0.8]) == 1
    assert best_index("auroc", [0.8, float("nan"), 0.8]) == 0  # ties: the first (Regular); NaN never wins
    assert best_index("ece", [0.2, 0.05, 0.1]) == 1  # lower is better
    assert best_index("auroc", [float("nan")]) is None


def test_the_sklearn_reference_is_a_direct_sklearn_fit_on_the_same_rows():
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    from silofl.runner.alone import SKLEARN, c_grid, logistic_search, reference_outputs

    g = torch.Generator().manual_seed(0)
    x = torch.randn(120, 4, generator=g)
    y = (x[:, 0] + 0.5 * torch.randn(120, generator=g) > 0).long()
    train, val = (x[:80], y[:80]), (x[80:], y[80:])
    found = logistic_search(train, val, "auroc", c_grid(3), 2)
    direct = [
        roc_auc_score(
            val[1], LogisticRegression(C=c, max_iter=1000).fit(train[0], train[1]).decision_function(val[0])
        )
        for c in c_grid(3)
    ]
    assert found is not None and found["by_C"] == pytest.approx(direct)
    assert found["C"] == c_grid(3)[int(np.argmax(direct))]
    held = {"internal": (val[0], val[1], None, "")}
    site = {"chosen": SKLEARN, "sklearn": found}
    outs = reference_outputs(site, None, 0, train, held, 2)[SKLEARN]["internal"]
    clf = LogisticRegression(C=found["C"], max_iter=1000).fit(train[0].numpy(), train[1].numpy())
    assert np.allclose(outs.numpy(), clf.predict_log_proba(val[0].numpy()))


# ------------------------------------------------------------------ going alone's trial budget
@pytest.mark.slow  # whole runs (the fast tier stays ≤ 60 s)
def test_a_run_from_a_tuned_recipe_tunes_going_alone_with_as_many_trials(tmp_path):
    """silofl tune's recipe records how many trials it ran; a run from it with --vs-alone tunes going alone
    with as many per site, and its decision says so."""
    import silofl
    from silofl.api import _write_tuned_recipe
    from silofl.runner.recipe import load_recipe

    schema, paths = _tables(tmp_path / "data")
    best = _table_cfg(schema, paths, tmp_path / "t" / "trials" / "best")
    (tmp_path / "t").mkdir()
    result = {  # what silofl tune's tune.json holds of a three-trial search (the fields the recipe reads)
        "trials": [{"settings": {"lr": lr}} for lr in (0.05, 0.5, 5.0)],
        "tuning_cost": {"max": 5.2},
        "best": {"settings": {"lr": 0.5}, "validation": 0.8},
    }
    _write_tuned_recipe(best, result, tmp_path / "t")
    recipe = load_recipe(tmp_path / "t" / "recipe.yaml")
    assert recipe.options["tuning_trials"] == 3 and recipe.config().tuning_trials == 3
    res = silofl.run(str(tmp_path / "t" / "recipe.yaml"), out=str(tmp_path / "run"), vs_alone=True)
    assert res.config.tuning_trials == 3
    record = json.loads((tmp_path / "run" / "alone" / "alone.json").read_text())
    assert (record["trials"], record["trials_source"], record["tuning_trials"]) == (3, "tuning", 3)
    assert len(record["grid"]["lr"]) == len(record["grid"]["C"]) == 3
    assert all(len(s["regular"]["by_lr"]) == 3 for s in record["sites"])
    said = "going alone tuned with 3 trials, as the federated run's tuning"
    decision = json.loads((tmp_path / "run" / "decision.json").read_text())
    assert decision["going_alone_budget"] == {
        "trials": 3,
        "source": "tuning",
        "tuning_trials": 3,
        "text": said,
    }
    assert any(said in n for n in decision["notes"]) and said in (tmp_path / "run" / "report.md").read_text()
    assert res.summary["vs_alone"]["tuned"]["trials"] == 3


def test_going_alone_without_a_recorded_tuning_takes_the_default_budget_and_says_so(tmp_path):
    from silofl.runner.alone import DEFAULT_TRIALS, MIN_TRIALS, budget, c_grid, lr_grid
    from silofl.runner.decision import _reference_note

    schema, paths = _tables(tmp_path / "data")
    cfg = _table_cfg(schema, paths, tmp_path / "r")
    assert cfg.tuning_trials is None
    spent = budget(cfg)
    assert (spent["trials"], spent["source"]) == (DEFAULT_TRIALS, "default") == (4, "default")
    assert spent["text"] == "default budget of 4: the run records no tuning"
    record = {"trials": 4, "trials_source": "default", "budget": spent["text"]}
    assert "default budget of 4: the run records no tuning" in _reference_note(record, None)
    one = budget(cfg.replace(tuning_trials=1))  # a one-trial search: at least two settings to choose among
    assert (one["trials"], one["source"], one["tuning_trials"]) == (MIN_TRIALS, "tuning", 1)
    assert one["text"].startswith("going alone tuned with 2 trials, as the federated run's tuning")
    assert budget(cfg.replace(tuning_trials=9))["trials"] == 9 == budget(cfg, trials=9)["trials"]
    wide = lr_grid(0.5, 9)  # more trials than the default grid: it widens geometrically, half a decade a step
    assert wide[4] == pytest.approx(0.5) and all(
        b / a == pytest.approx(10**0.5) for a, b in zip(wide, wide[1:], strict=False)
    )
    assert c_grid(6) == pytest.approx([10.0**i for i in range(-3, 3)])


def test_tuning_trials_is_a_common_option_every_method_takes_and_must_be_positive():
    from silofl.core.errors import ConfigError

    for method in ("fedavg", "proxyfl", "regular"):
        assert RunConfig.from_dict({"method": method, "tuning_trials": 5}).tuning_trials == 5
    with pytest.raises(ConfigError, match="^tuning_trials must be at least 1, got 0$"):
        RunConfig.from_dict({"method": "fedavg", "tuning_trials": 0}).resolve()


@pytest.mark.slow  # a pooled run and its going-alone baseline
def test_a_pooled_run_compares_with_going_alone_and_states_both_threats(tmp_path):
    """Going alone releases nothing, so the run's secure aggregation is not copied to it (Regular refuses
    it); the decision states the pooled ε against the server and against the server + 1 colluding site."""
    import silofl

    res = silofl.run(
        method="fedavg",
        dataset="digits",
        clients=3,
        rounds=2,
        samples_per_client=100,
        delta=1e-3,
        target_epsilon=3.0,
        proxy_model="mlp",
        secure_aggregation=True,
        noise_placement="pooled",
        optimizer="sgd",
        sample_rate=1.0,
        test_limit=200,
        vs_alone=True,
        out=str(tmp_path / "run"),
    )
    assert res.vs_alone is not None and (tmp_path / "run" / "alone").is_dir()
    plus = res.summary["privacy"]["epsilon_vs_server_plus_1_colluders"]
    assert plus > res.epsilon  # one colluder's share no longer protects: a weaker guarantee
    decision = json.loads((tmp_path / "run" / "decision.json").read_text())
    threats = {row["threat"] for row in decision["rows"] if row.get("threat")}
    assert threats and all(f"1 colluding site ε = {plus:.2f}" in t for t in threats), threats
