"""The Python API (silofl.api, exported from silofl): results as objects, the same folders as the CLI."""

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

    for name in ("run", "audit", "tune", "compare"):
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
    with pytest.raises(ConfigError, match="--vs-alone trains the baseline with the simulator"):
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


@pytest.mark.slow  # one tiny comparison (about 3 s of CPU)
def test_compare_returns_its_rows(tmp_path):
    res = silofl.compare(
        methods=["regular"], seeds=[0], run={**TINY, "private_model": "mlp"}, out=tmp_path / "c"
    )
    assert res.folder == tmp_path / "c" and res.markdown.is_file() and not res.failed
    assert [r["method"] for r in res.rows] == ["regular"]
