"""silofl.core.registry: names, lookups, one-line errors, plug-ins from entry points."""

from __future__ import annotations

import pytest

from silofl.core.errors import ConfigError
from silofl.core.registry import Registry, check_choice


def test_register_get_and_order():
    reg: Registry[object] = Registry("widget", "silofl.test-widgets")

    @reg.register("b", colour="blue")
    class B:
        pass

    reg.register("a", len)
    assert reg.names() == ("b", "a")
    assert reg.get("b") is B and reg.entry("b").meta == {"colour": "blue"}
    assert "a" in reg and "c" not in reg and len(reg) == 2
    reg.register("a", len)  # the same object again: harmless
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a", print)
    with pytest.raises(ConfigError, match=r"unknown widget 'c'; choose one of: b, a"):
        reg.get("c")
    with pytest.raises(ConfigError, match="unknown colour 'c'"):
        check_choice(reg, "c", "colour")
    for bad in ("", " a", "x:y"):
        with pytest.raises(ValueError):
            reg.register(bad, len)
    reg.unregister("a")
    assert reg.names() == ("b",)


def test_builtins_import_on_first_read_and_plugins_load(monkeypatch):
    import importlib.metadata as md

    import silofl.core.registry as registry_module

    reg: Registry[object] = Registry("widget", "silofl.test-widgets", builtins=("json",))

    class EP:
        name, value = "plug", "pkg.plug"

        def load(self):
            reg.register("plug", "from a plug-in")

    class Broken(EP):
        name, value = "broken", "pkg.broken"

        def load(self):
            raise ImportError("no such module")

    def fake_entry_points(group=None):
        return [EP(), Broken()] if group == "silofl.test-widgets" else md.entry_points(group=group)

    monkeypatch.setattr(registry_module, "entry_points", fake_entry_points)
    assert reg.names() == ("plug",)  # the broken plug-in is logged and skipped
    assert reg.get("plug") == "from a plug-in"


def _registries():
    from silofl.comm.engines import ENGINES
    from silofl.data.datasets import DATASETS
    from silofl.features.registry import FEATURES
    from silofl.fl.registry import METHODS
    from silofl.models import MODELS
    from silofl.privacy.analysis import ACCOUNTANTS

    return {
        "silofl.methods": METHODS,
        "silofl.features": FEATURES,
        "silofl.datasets": DATASETS,
        "silofl.models": MODELS,
        "silofl.accountants": ACCOUNTANTS,
        "silofl.engines": ENGINES,
    }


def test_every_extension_point_is_a_registry_with_its_group_and_one_line_errors():
    for group, reg in _registries().items():
        assert isinstance(reg, Registry) and reg.group == group and len(reg) >= 2
        with pytest.raises(ConfigError) as e:
            reg.get("no-such-thing")
        msg = str(e.value)
        assert "\n" not in msg
        assert msg == f"unknown {reg.kind} 'no-such-thing'; choose one of: {', '.join(reg.names())}"


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--accountant", "pld"], "unknown accountant 'pld'; choose one of: rdp, prv"),
        (["--method", "fedsgd"], "unknown method 'fedsgd'; choose one of: proxyfl, fedavg"),
    ],
)
def test_an_unknown_name_on_the_command_line_exits_2_in_one_line(flags, message, tmp_path):
    """(Data sets and models: tests/cli/test_cli.py.)"""
    from typer.testing import CliRunner

    from silofl.cli.main import app

    res = CliRunner().invoke(app, ["run", *flags, "--quiet", "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and message in res.output and "Traceback" not in res.output, res.output
    assert not (tmp_path / "r").exists()
