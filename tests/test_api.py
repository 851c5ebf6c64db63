"""The Python API (silofl.api, exported from silofl): results as objects, the same folders as the CLI."""

import dataclasses
import json

import pytest
import yaml

import silofl
from silofl.core.errors import ConfigError

TINY = {
    "dataset": "digits",
    "clients": 2,
    "rounds": 1,
    "samples_per_client": 60,
    "batch_size": 20,
    "delta": 1e-3,
    "test_limit": 60,
    "proxy_model": "mlp",
    "seed": 3,
}


def test_the_api_is_exported_as_plain_functions():
    import inspect

    import silofl.auditing.one_run  # noqa: F401 - importing the subpackages changes nothing of the API
    import silofl.runner.loop  # noqa: F401
    from silofl import api

    for name in ("run", "audit", "tune", "compare", "deploy_local", "predict", "export"):
        assert inspect.isfunction(getattr(silofl, name)) and getattr(silofl, name) is getattr(api, name)
    assert silofl.RunConfig().method == "proxyfl" and silofl.RunResult.__name__ == "RunResult"
    with pytest.raises(AttributeError):
        silofl.nothing_here  # noqa: B018


def test_bad_input_is_a_one_line_error_before_anything_is_written(tmp_path):
    out = tmp_path / "x"
    with pytest.raises(
        ConfigError, match="unknown engine 'warp'; choose one of: simulator, flower-local, flower"
    ):
        silofl.run({**TINY, "method": "fedavg", "out": str(out)}, engine="warp")
    with pytest.raises(ConfigError, match="tuning needs a budget"):
        silofl.tune({**TINY, "method": "fedavg"}, {"lr": [0.001]}, out=tmp_path / "t")
    with pytest.raises(ConfigError, match="^vs_alone trains the baseline with the simulator"):
        silofl.run({**TINY, "out": str(out)}, engine="flower-local", vs_alone=True)
    with pytest.raises(ConfigError, match="unknown method"):
        silofl.run({**TINY, "method": "nope", "out": str(out)})
    assert not out.exists() and not (tmp_path / "t").exists()


@pytest.mark.slow  # a tiny run and a one-trial search (about 5 s of CPU)
def test_run_and_tune_return_objects_matching_their_folders(tmp_path):
    cfg = silofl.RunConfig.from_dict({**TINY, "method": "fedavg", "out": str(tmp_path / "r")})
    res = silofl.run(cfg)
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert res.folder == tmp_path / "r" and res.summary == summary and res.config.method == "fedavg"
    assert len(res.per_client) == 2 and res.epsilon == max(
        r["epsilon"] for r in summary["final"]["per_client"]
    )
    assert res.headline == summary["final"]["global_acc"]["mean"] and res.privacy["mode"] == "strict"
    chosen = summary["threads_chosen"]  # silofl.core.threads: the run states how many threads and why
    assert summary["threads"] == chosen["threads"] and chosen["reason"]
    with pytest.raises(ConfigError, match="already holds a run"):
        silofl.run(cfg)
    t = silofl.tune({**TINY, "method": "fedavg", "target_epsilon": 5.0}, {"lr": [0.003]}, out=tmp_path / "t")
    assert t.settings == {"lr": 0.003} and t.folder == tmp_path / "t" and len(t.trials) == 1
    assert (
        t.best_config is not None and t.best_config.options.lr == 0.003 and t.best_config.eval_split == "test"
    )
    assert t.epsilon == json.loads((tmp_path / "t" / "tune.json").read_text())["tuning_cost"]["max"]
    assert yaml.safe_load((tmp_path / "t" / "best.yaml").read_text())["fedavg"]["lr"] == 0.003
    from silofl.runner.recipe import load_recipe  # the choice as a recipe: `silofl run OUT/recipe.yaml`

    tuned = load_recipe(tmp_path / "t" / "recipe.yaml")
    assert tuned.name == "tuned-t" and "out" not in tuned.options and "validation split" in tuned.source
    assert tuned.options["tuning_trials"] == len(t.trials) == 1  # what the search ran: --vs-alone matches it
    assert dataclasses.replace(tuned.config(), out=t.best_config.out) == dataclasses.replace(
        t.best_config, tuning_trials=1
    )


@pytest.mark.slow  # one tiny comparison (about 3 s of CPU)
def test_compare_returns_its_rows(tmp_path):
    res = silofl.compare(
        methods=["regular"], seeds=[0], run={**TINY, "private_model": "mlp"}, out=tmp_path / "c"
    )
    assert res.folder == tmp_path / "c" and res.markdown.is_file() and not res.failed
    assert [r["method"] for r in res.rows] == ["regular"]


def test_every_option_of_silofl_run_is_a_parameter_by_the_same_name():
    """Each option of `silofl run` is a key of the recipe / RunConfig (a common setting or a method's
    option) or a parameter of :func:`silofl.run`, by the same name."""
    import inspect

    import click
    import typer.main

    from silofl.api import ENGINE_OPTIONS
    from silofl.cli.main import app
    from silofl.runner.config import RunConfig, _all_option_fields

    command = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    params = command.get_params(click.Context(command))
    keys = set(RunConfig.common_fields()) | set(_all_option_fields())
    api = set(inspect.signature(silofl.run).parameters) | set(ENGINE_OPTIONS)
    not_parameters = {
        "set_": "--set KEY=VALUE: in Python, the keywords themselves",
        "recipe": "the recipe: silofl.run's first parameter (config) takes its name or file",
        "_click_default_help": "click's own --help",
        "distributed": "a launched rank's hidden flag (silofl launch starts it)",
        "check_processes": "a launched group's hidden check (silofl launch)",
    }
    names = [p.name for p in params if p.name]
    assert len(names) > 100
    for name in names:
        assert name in keys or name in api or name in not_parameters, name
    assert "recipe" in names and "config" in api


def test_a_config_takes_method_options_by_name_and_refuses_wrong_types():
    cfg = silofl.RunConfig(method="fedavg", dataset="table", proxy_model="tabmlp", lr=0.03)
    assert (cfg.options.proxy_model, cfg.options.lr) == ("tabmlp", 0.03)
    assert silofl.RunConfig(private_model="tabmlp").options.private_model == "tabmlp"
    with pytest.raises(TypeError, match="^delta must be of type float, got str '1e-5'$"):
        silofl.RunConfig(delta="1e-5")
    with pytest.raises(ConfigError, match="dml_alpha do not apply to method 'fedavg'"):
        silofl.RunConfig(method="fedavg", dml_alpha=0.5)
    with pytest.raises(ConfigError, match="no option.*warp_speed"):
        silofl.RunConfig(warp_speed=9)
    cfg = silofl.api.as_config("proxyfl-scatter", rounds=3, out="runs/r")  # a recipe, by name, with options
    assert (cfg.rounds, cfg.features, cfg.out, cfg.options.graph) == (3, "scatter", "runs/r", "complete")


def test_a_second_run_into_the_same_out_names_parameters_not_flags(tmp_path):
    """The README snippet run twice: the refusal names ``out`` / ``overwrite``, not --out / --overwrite."""
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "summary.json").write_text("{}")  # a finished run's file
    with pytest.raises(ConfigError) as e:
        silofl.run(silofl.RunConfig(method="fedavg", **TINY), out=str(tmp_path / "r"))
    assert "already holds a run" in str(e.value) and "overwrite" in str(e.value) and "--" not in str(e.value)
    with pytest.raises(ConfigError, match="^peer_timeout must be a finite positive number of seconds"):
        silofl.run({**TINY, "method": "fedavg"}, out=str(tmp_path / "q"), peer_timeout=-1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]
