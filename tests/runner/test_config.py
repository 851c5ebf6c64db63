import math

import pytest
import yaml

from silofl.core.errors import ConfigError
from silofl.fl.registry import methods
from silofl.privacy.guarantee import PRIVACY_MODES
from silofl.runner.config import RunConfig
from tests.helpers import NEEDS


def test_yaml_roundtrip_holds_only_the_methods_own_section(tmp_path):
    cfg = RunConfig.from_dict({"clients": 3, "privacy": "paper"}).resolve()
    assert cfg.options.dml_beta == 0.5
    p = tmp_path / "c.yaml"
    p.write_text(cfg.to_yaml())
    assert RunConfig.from_yaml(p) == cfg
    data = yaml.safe_load(p.read_text())
    assert data["proxyfl"]["dml_alpha"] == 0.5 and "server_lr" not in str(data) and "dml_alpha" not in data
    fed = yaml.safe_load(RunConfig(method="dp-fedavg").resolve().to_yaml())
    assert "dml_alpha" not in str(fed) and fed["dp-fedavg"]["server_lr"] == 1.0
    assert RunConfig().resolve().options.dml_beta == 0.0  # strict by default


@pytest.mark.parametrize("method", list(methods()))
@pytest.mark.parametrize("mode", PRIVACY_MODES)
def test_resolve_is_idempotent_and_decides_the_mode_in_one_place(method, mode):
    if method == "dp-ssp" and mode == "off":
        with pytest.raises(ConfigError, match="needs privacy on"):  # a DP release or nothing
            RunConfig.from_dict({"method": method, "privacy": mode, **NEEDS[method]}).resolve()
        return
    cfg = RunConfig.from_dict({"method": method, "privacy": mode, **NEEDS.get(method, {})}).resolve()
    assert cfg.resolve() == cfg
    info = methods()[method]
    if mode == "off" or info.traits.nonprivate:
        assert cfg.privacy == "off" and not cfg.guarantee().formal
    elif mode == "paper" and not info.mutual_learning:
        assert cfg.privacy == "strict" and cfg.guarantee().formal  # no β without mutual learning
    else:
        assert cfg.privacy == mode and cfg.guarantee().formal == (mode == "strict")


def test_flat_options_are_routed_to_the_method_and_foreign_ones_refused():
    cfg = RunConfig.from_dict({"method": "proxyfl", "self_weight": 0.5, "dml-alpha": 0.3})
    assert cfg.options.self_weight == 0.5 and cfg.options.dml_alpha == 0.3
    with pytest.raises(ConfigError, match="self_weight does not apply to method 'fedavg'"):
        RunConfig.from_dict({"method": "fedavg", "self_weight": 0.5})
    assert (
        RunConfig.from_dict({"method": "fedavg", "self_weight": 0.5}, strict=False).options.aggregation
        == "size"
    )
    with pytest.raises(ConfigError, match="self_weight does not apply"):  # even at another method's default
        RunConfig.from_dict({"method": "fedavg", "self_weight": 0.0})
    with pytest.raises(ConfigError, match="unknown config option.*bogus"):
        RunConfig.from_dict({"bogus": 1})
    with pytest.raises(ConfigError, match="section for method 'fml'"):
        RunConfig.from_dict({"method": "proxyfl", "fml": {"aggregation": "size"}})
    with pytest.raises(ConfigError, match="unknown method 'nope'"):
        RunConfig.from_dict({"method": "nope"})
    moved = RunConfig.from_dict({"method": "proxyfl", "private_model": "mlp"}).replace(method="fml")
    assert moved.options.private_model == "mlp"  # a new method keeps the options it shares


def test_type_errors():
    with pytest.raises(ConfigError, match="clients"):
        RunConfig.from_dict({"clients": "many"}).resolve()
    with pytest.raises(ConfigError, match="private_models lists 2"):
        RunConfig.from_dict({"clients": 3, "private_models": ["mlp", "mlp"]}).resolve()


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"noise_multiplier": math.inf}, "noise_multiplier must be positive and finite"),
        ({"noise_multiplier": math.nan}, "must be a number, got nan"),
        ({"target_epsilon": math.nan}, "must be a number, got nan"),
        ({"target_epsilon": math.inf}, "target_epsilon must be positive and finite"),
        ({"lr": math.inf}, "lr must be a finite positive number"),
        ({"clip": -1.0}, "clip must be positive"),
        ({"method": "dp-fedavg", "local_lr": math.inf}, "local_lr must be a finite positive number"),
        ({"target_epsilons": [1.0, math.inf, 2.0], "clients": 3}, "every target_epsilons entry"),
    ],
)
def test_non_finite_and_out_of_range_numbers_are_refused(changes, match):
    with pytest.raises(ConfigError, match=match):
        RunConfig.from_dict(changes).resolve()


def test_data_dependent_defaults_fit_the_data_set():
    small = RunConfig(dataset="digits").with_data(1348)
    assert (small.samples_per_client, small.batch_size) == (168, 42)  # 8 clients share 1348 images; q = 1/4
    big = RunConfig().with_data(60000)
    assert (big.samples_per_client, big.batch_size) == (1000, 250)  # the papers' settings
    given = RunConfig.from_dict({"samples_per_client": 100, "batch_size": 10}).with_data(60000)
    assert (given.samples_per_client, given.batch_size) == (100, 10)


def test_a_deployed_run_takes_dataset_table_without_the_sites_files():
    """`silofl deploy start … --dataset table` (the README's): each site reads its own table and schema
    (site.json); the coordinator names none, and is refused one it could not use. A run that reads data here
    still needs them."""
    import torch

    from silofl.runner.data import prepare_data

    cfg = RunConfig.from_dict(dict(method="proxyfl", dataset="table", data_at_sites=True)).resolve()
    assert cfg.dataset == "table" and cfg.site_data is None and cfg.data_at_sites
    for given in (dict(site_data=["a.csv"], clients=1), dict(schema="s.yaml"), dict(test_data="t.csv")):
        with pytest.raises(ConfigError, match="site.json"):
            RunConfig.from_dict(
                dict(method="proxyfl", dataset="table", data_at_sites=True, **given)
            ).resolve()
    with pytest.raises(ConfigError, match="needs --site-data"):
        RunConfig.from_dict(dict(method="proxyfl", dataset="table")).resolve()
    with pytest.raises(ConfigError, match="the sites hold this run's data"):
        prepare_data(cfg, torch.device("cpu"))


def test_a_client_level_guarantee_says_where_the_noise_is_added():
    from silofl.privacy.guarantee import MethodTraits, guarantee

    client = MethodTraits(level="client")
    central = guarantee("strict", client)
    secure = guarantee("strict", client, secure_aggregation=True)
    assert central.formal and secure.formal
    assert "server is trusted to add the noise" in central.note
    assert "trusted" not in secure.note and "epsilon_vs_server" in secure.note
    assert guarantee("strict", MethodTraits(), secure_aggregation=True) == guarantee("strict", MethodTraits())
    cfg = RunConfig.from_dict(dict(method="dp-fedavg", dataset="digits", secure_aggregation=True))
    assert cfg.guarantee() == secure
