"""silofl.core.extras: a command whose extra is not installed stops with one line naming the extra, before it
writes anything. A missing package is simulated by ``sys.modules[name] = None`` (Python then refuses to import
it)."""

import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from silofl.core.errors import ConfigError
from silofl.core.extras import EXTRAS, MissingExtra, require

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def missing(monkeypatch, name):
    """``name`` and its submodules fail to import (submodules an earlier test imported included)."""
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")] or [name]:
        monkeypatch.setitem(sys.modules, mod, None)
    monkeypatch.setitem(sys.modules, name, None)


def says_install(err, extra):
    msg = str(err.value)
    assert isinstance(err.value, ConfigError) and "\n" not in msg
    assert f"'{extra}' extra" in msg and msg.endswith(f"pip install 'silofl[{extra}]'")


def test_require_returns_the_module_and_names_the_extra_when_it_is_missing(monkeypatch):
    assert require("json", "deploy") is sys.modules["json"]
    missing(monkeypatch, "flwr")
    with pytest.raises(MissingExtra) as err:
        require("flwr.app", "deploy", "silofl deploy local")
    says_install(err, "deploy")
    assert str(err.value).startswith("silofl deploy local needs") and "flwr is not installed" in str(
        err.value
    )
    with pytest.raises(ValueError, match="unknown extra"):
        require("flwr", "deployment")


def test_an_installed_package_that_fails_on_its_own_import_is_not_called_missing(tmp_path, monkeypatch):
    (tmp_path / "silofl_broken_pkg.py").write_text("import silofl_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as err:
        require("silofl_broken_pkg", "pubsub")
    assert not isinstance(err.value, MissingExtra) and err.value.name == "silofl_no_such_dependency"


IMPORT_NAME = {"mlflow_skinny": "mlflow"}  # a distribution whose import name differs


def test_the_table_of_extras_is_pyproject_s():
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    for extra, (_, modules) in EXTRAS.items():
        packages = {
            r.split(";")[0].split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip().replace("-", "_")
            for r in extras[extra]
            if not r.startswith("silofl[")
        }
        packages = {IMPORT_NAME.get(p, p) for p in packages}
        assert set(modules) == packages, extra
    wanted = set(extras["all"][0].removeprefix("silofl[").removesuffix("]").split(","))
    assert wanted == set(extras) - {"all", "dev"}


def test_deploy_without_flower(monkeypatch, tiny_cfg, tmp_path):
    from silofl.deploy import flower_shim, local, procs

    missing(monkeypatch, "flwr")
    with pytest.raises(MissingExtra) as err:
        local.deploy_local(tiny_cfg, tmp_path / "out")
    says_install(err, "deploy")
    assert not (tmp_path / "out").exists()
    for call in (
        lambda: procs.flower_bin("flower-superlink"),
        flower_shim.supported,
        lambda: local.run_deployment(tiny_cfg, tmp_path, "127.0.0.1:1"),
    ):
        with pytest.raises(MissingExtra):
            call()


@pytest.mark.parametrize("name", ["fastapi", "uvicorn"])
def test_the_broker_service_without_its_packages(monkeypatch, tmp_path, name):
    from silofl.pubsub import service

    missing(monkeypatch, name)
    with pytest.raises(MissingExtra) as err:
        service.serve(tmp_path / "state", "127.0.0.1", 1, None, None)
    says_install(err, "pubsub")
    assert not (tmp_path / "state").exists()


def test_the_broker_client_without_httpx(monkeypatch):
    from silofl.pubsub.client import RemoteBroker

    missing(monkeypatch, "httpx")
    with pytest.raises(MissingExtra) as err:
        RemoteBroker("https://broker.example", {"site": "a", "token": "t"})
    says_install(err, "pubsub")


def test_diffprivlib_models_without_diffprivlib(monkeypatch):
    from silofl.pubsub.dp_models import Bounds, train

    missing(monkeypatch, "diffprivlib")
    x, y = np.random.default_rng(0).random((40, 3)), np.arange(40) % 2
    kw = dict(
        publisher="a",
        features=["f0", "f1", "f2"],
        task="classification",
        bounds=Bounds(np.zeros(3), np.ones(3)),
        epsilon=1.0,
        delta=1e-5,
        classes=[0, 1],
    )
    with pytest.raises(MissingExtra) as err:
        train("dp-logreg", x, y, **kw)
    says_install(err, "pubsub")


def test_stream_scenarios_without_river(monkeypatch):
    from studies.pubsub_scenarios import _hyperplane

    missing(monkeypatch, "river")
    with pytest.raises(MissingExtra) as err:
        _hyperplane(10, seed=0)
    says_install(err, "pubsub")


@pytest.mark.parametrize("name", ["onnx", "onnxscript"])
def test_export_without_onnx_from_the_cli(monkeypatch, tmp_path, name):
    from silofl.cli.main import app

    missing(monkeypatch, name)
    r = CliRunner().invoke(
        app, ["export", str(tmp_path / "run"), "--client", "0", "--out", str(tmp_path / "onnx")]
    )
    assert r.exit_code == 2, r.output
    assert (
        r.output.strip().endswith("pip install 'silofl[export]'") and len(r.output.strip().splitlines()) == 1
    )
    assert not (tmp_path / "onnx").exists()


def test_the_tabular_study_without_its_data(monkeypatch, tmp_path):
    from studies.tabular import write_sites

    missing(monkeypatch, "palmerpenguins")
    with pytest.raises(MissingExtra) as err:
        write_sites(tmp_path / "sites")
    says_install(err, "studies")
    assert not (tmp_path / "sites").exists()
