"""Recipes as data (issue 42 item 1): silofl's recipes load and validate like any config, the README's main
job is the recipe ``proxyfl-scatter`` (the same config as the 22 flags it replaced, so the same figures on
the same seed), ``proxyfl-paper`` is the papers' settings, options given override a recipe, and a bad recipe
is one line, exit 2, nothing written."""

from __future__ import annotations

import dataclasses
import re

import pytest
from typer.testing import CliRunner

import silofl.cli.main as cli
from silofl.core.errors import ConfigError
from silofl.runner.config import RunConfig
from silofl.runner.recipe import load_recipe, recipe_names, recipe_of
from tests import readme
from tests.adversarial.test_bad_input import _files

# README line 4 before recipes: the main job as 22 flags
OLD_MAIN_JOB = (
    "run --method proxyfl --dataset fashion-mnist --clients 8 --rounds 50 --target-epsilon 8 "
    "--features scatter --private-model linear --proxy-model linear --graph complete --self-weight 0.125 "
    "--optimizer sgd "
    "--momentum 0.9 --optimizer-state keep --lr 10 --clip 0.1 --sample-rate 0.5 --local-steps 1 "
    "--private-lr 0.003 --dml-alpha 0.5 --eval-every 10 --vs-alone --out runs/demo"
)


def _asked(monkeypatch, args: list[str]) -> tuple[RunConfig, dict]:
    """The config and run options ``silofl run ARGS`` hands to the run (nothing runs)."""
    got: list = []
    monkeypatch.setattr(cli, "run_command", lambda cfg, **kw: got.append((cfg, kw)))
    res = CliRunner().invoke(cli.app, args)
    assert res.exit_code == 0, res.output
    return got[0]


def test_silofl_ships_its_recipes_and_each_validates():
    assert {"proxyfl-scatter", "proxyfl-paper", "proxyfl-table"} <= set(recipe_names())
    for name in recipe_names():
        r = load_recipe(name)
        assert r.name == name and r.version >= 1 and r.summary and r.source
        assert "out" not in r.options  # what to run, not where
    for name in ("proxyfl-scatter", "proxyfl-paper"):
        load_recipe(name).config().resolve()


def test_the_readme_main_job_is_the_recipe_with_the_22_flags_config(monkeypatch):
    """README line 4 (≤ 100 characters) asks exactly the config the 22-flag command asked: the same seeded
    run, the same figures; --vs-alone and --out still reach the run."""
    text = readme.README.read_text()
    line = re.search(r"```bash\n(.*?)\n", text).group(1)
    assert len(line) <= 100
    args = readme.argv(line.split(" && ", 1)[1].replace(".venv/bin/silofl", "silofl", 1))
    new_cfg, new_kw = _asked(monkeypatch, args)
    old_cfg, old_kw = _asked(monkeypatch, OLD_MAIN_JOB.split())
    assert new_cfg == old_cfg and new_cfg.to_dict() == old_cfg.to_dict()
    assert new_kw == old_kw and new_kw["vs_alone"] is True and new_cfg.out == "runs/demo"


def test_proxyfl_paper_is_the_papers_settings_the_bare_defaults():
    """σ given explicitly (no budget to calibrate it from): the bare defaults' run."""
    assert load_recipe("proxyfl-paper").config() == RunConfig(calibrate_noise=False)
    assert load_recipe("proxyfl-paper").config().resolve() == RunConfig().resolve().replace(
        calibrate_noise=False
    )


def test_options_given_override_the_recipe(monkeypatch, tmp_path):
    cfg, _ = _asked(
        monkeypatch,
        ["run", "proxyfl-scatter", "--rounds", "3", "--set", "lr=0.5", "--set", "seed=4", "--out", "x"],
    )
    assert (cfg.rounds, cfg.options.lr, cfg.seed, cfg.out) == (3, 0.5, 4, "x")
    assert cfg.features == "scatter" and cfg.options.graph == "complete"  # the rest is the recipe's
    own = tmp_path / "mine.yaml"  # a user's recipe, by path
    own.write_text(load_recipe("proxyfl-scatter").to_yaml().replace("rounds: 50", "rounds: 7"))
    cfg, _ = _asked(monkeypatch, ["run", str(own), "--out", "y"])
    assert cfg.rounds == 7 and cfg.options.private_model == "linear"


def test_the_table_recipe_runs_on_per_site_tables(tmp_path):
    """proxyfl-table (docs/tabular.md's ε ≤ 8 recipe) resolves once the sites' files and schema are given."""
    (tmp_path / "schema.yaml").write_text(
        "target: {name: y, levels: ['0', '1']}\nfeatures:\n  x1: {type: numeric, bounds: [0, 10]}\n"
    )
    for s in "ab":
        (tmp_path / f"{s}.csv").write_text("x1,y\n" + "".join(f"{i % 7},{i % 2}\n" for i in range(40)))
    recipe = load_recipe("proxyfl-table")
    with pytest.raises(ConfigError, match="needs --site-data"):
        recipe.config().resolve()
    cfg = recipe.config(
        {"site_data": f"{tmp_path}/a.csv,{tmp_path}/b.csv", "schema": str(tmp_path / "schema.yaml")}
    ).resolve()
    assert (cfg.clients, cfg.partition, cfg.options.private_model, cfg.options.proxy_model) == (
        2,
        "site",
        "tabmlp",
        "logreg",
    )


def test_a_config_written_as_a_recipe_reads_back_the_same():
    cfg = load_recipe("proxyfl-scatter").config({"rounds": 9, "out": "runs/z"})
    r = recipe_of(cfg, "mine", "nine rounds", "a test")
    assert "out" not in r.options
    assert dataclasses.replace(r.config(), out="runs/z") == cfg


TINY = [
    "run",
    "--method",
    "fedavg",
    "--dataset",
    "digits",
    "--clients",
    "2",
    "--rounds",
    "1",
    "--test-limit",
    "20",
]
BAD = {  # name: (recipe file text or None, arguments, what the one line says)
    "unknown-recipe": (None, ["run", "no-such-recipe"], "unknown recipe 'no-such-recipe'"),
    "key-twice": (
        "recipe: r\nversion: 1\nrun:\n  method: fedavg\n  rounds: 2\n  rounds: 3\n",
        ["run", "{t}/r.yaml"],
        "key 'rounds' is given twice",
    ),
    "option-of-another-method": (
        "recipe: r\nversion: 1\nrun: {method: fedavg, dml_alpha: 0.5}\n",
        ["run", "{t}/r.yaml"],
        "option dml_alpha does not apply to method 'fedavg'",
    ),
    "wrong-type": (
        "recipe: r\nversion: 1\nrun: {method: fedavg, rounds: many}\n",
        ["run", "{t}/r.yaml"],
        "option 'rounds' must be of type int",
    ),
    "no-version": ("recipe: r\nrun: {method: fedavg}\n", ["run", "{t}/r.yaml"], "lacks version"),
    "stray-key": (
        "recipe: r\nversion: 1\nengine: flower\nrun: {method: fedavg}\n",
        ["run", "{t}/r.yaml"],
        "unknown key(s) engine",
    ),
    "flag-of-another-method": (
        None,
        ["run", "--method", "fedavg", "--dataset", "digits", "--dml-alpha", "0.5", "--out", "{t}/o"],
        "option dml_alpha does not apply to method 'fedavg'",
    ),
    "track-into-a-run": (
        "",  # {t}/r.yaml: a run folder's config file stands for an existing run
        [*TINY, "--out", "{t}/o", "--track", "tensorboard", "{t}/run"],
        "holds a silofl run",
    ),
    "track-read-only": (
        None,
        [*TINY, "--out", "{t}/o", "--track", "tensorboard", "/proc/x/y"],
        "cannot make --track tensorboard DIR /proc/x/y",
    ),
}


@pytest.mark.parametrize("name", list(BAD))
def test_a_bad_recipe_or_option_is_one_line_exit_2_and_writes_nothing(name, tmp_path):
    text, args, message = BAD[name]
    t = str(tmp_path)
    if text:
        (tmp_path / "r.yaml").write_text(text)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("method: fedavg\n")
    before = _files(tmp_path)
    res = CliRunner().invoke(cli.app, [a.replace("{t}", t) for a in args])
    assert res.exit_code == 2, (res.exit_code, res.output)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert message in lines[0], lines[0]
    assert _files(tmp_path) == before


# ------------------------------------------------------------------ defaults per kind of data
def _table_options(tmp_path, **extra):
    from tests.data.test_tables import site_frame, write_csv, write_schema

    sites = [str(write_csv(tmp_path, site_frame(40, seed=k), f"s{k}.csv")) for k in range(2)]
    return {"dataset": "table", "schema": str(write_schema(tmp_path)), "site_data": sites, **extra}


def test_a_table_without_a_recipe_takes_the_table_recipes_settings(tmp_path):
    from silofl.runner.recipe import data_family, with_family_defaults

    opts = _table_options(tmp_path)
    assert data_family(opts) == "table" and data_family({"dataset": "digits"}) is None
    cfg = RunConfig.from_dict(with_family_defaults(opts)).resolve()
    recipe = load_recipe("proxyfl-table").config(opts).resolve()
    assert cfg.defaults == "proxyfl-table" and cfg.replace(defaults="x") == recipe.replace(defaults="x")
    assert (cfg.options.optimizer, cfg.options.lr, cfg.rounds, cfg.options.private_model) == (
        "sgd",
        0.5,
        60,
        "tabmlp",
    )


def test_what_is_given_wins_group_by_group_and_another_method_takes_what_it_has(tmp_path):
    from silofl.runner.recipe import with_family_defaults

    given = with_family_defaults(_table_options(tmp_path, method="fedavg", lr=0.01, noise_multiplier=1.2))
    cfg = RunConfig.from_dict(given).resolve()
    # the optimiser group and the privacy group are the run's own: Adam (the bare default) at its lr, its σ
    assert (cfg.options.optimizer, cfg.options.lr, cfg.noise_multiplier, cfg.target_epsilon) == (
        "adam",
        0.01,
        1.2,
        None,
    )
    assert (cfg.options.sample_rate, cfg.rounds, cfg.options.proxy_model) == (0.5, 60, "logreg")  # the rest
    assert "graph" not in given  # a ProxyFL option FedAvg does not have
    assert cfg.defaults == "proxyfl-table"


def test_defaults_none_keeps_the_bare_defaults_and_a_family_without_a_recipe_says_so(tmp_path):
    from silofl.runner.recipe import data_family, defaults_line, with_family_defaults

    opts = _table_options(tmp_path, defaults="none")
    assert with_family_defaults(opts) == opts
    assert RunConfig.from_dict(with_family_defaults(opts)) == RunConfig.from_dict(opts)
    from tests.helpers import write_survival_sites

    schema, sites, _ = write_survival_sites(tmp_path / "surv", sites=2, rows=30)
    sopts = {"dataset": "table", "schema": str(schema), "site_data": [str(p) for p in sites]}
    assert data_family(sopts) == "table-survival"
    assert with_family_defaults(sopts) == {**sopts, "defaults": "none"}
    line = defaults_line(RunConfig.from_dict({**sopts, "defaults": "none"}))
    assert line.startswith("defaults: silofl's bare defaults")


def test_the_command_line_states_the_recipe_chosen_from_the_data(monkeypatch, tmp_path):
    from silofl.runner.recipe import defaults_line

    opts = _table_options(tmp_path)
    args = [
        "run",
        "--dataset",
        "table",
        "--schema",
        opts["schema"],
        "--site-data",
        ",".join(opts["site_data"]),
    ]
    cfg, _ = _asked(monkeypatch, [*args, "--out", str(tmp_path / "r")])
    assert cfg.defaults == "proxyfl-table" and cfg.options.lr == 0.5
    assert defaults_line(cfg).startswith("defaults: recipe proxyfl-table, chosen from the data (a table)")
    named, _ = _asked(monkeypatch, ["run", "proxyfl-table", *args[1:], "--out", str(tmp_path / "r")])
    assert named.defaults is None and named.replace(defaults="x") == cfg.replace(defaults="x")
