import pytest

from silofl.config import RunConfig
from silofl.errors import ConfigError


def test_yaml_roundtrip_and_resolve(tmp_path):
    cfg = RunConfig(clients=3, privacy="paper").resolve()
    assert cfg.dml_beta == 0.5
    p = tmp_path / "c.yaml"
    p.write_text(cfg.to_yaml())
    assert RunConfig.from_yaml(p) == cfg
    assert RunConfig().resolve().dml_beta == 0.0  # strict by default


def test_type_errors():
    with pytest.raises(ConfigError, match="clients"):
        RunConfig.from_dict({"clients": "many"}).resolve()
    with pytest.raises(ConfigError, match="private_models lists 2"):
        RunConfig(clients=3, private_models=["mlp", "mlp"]).resolve()
