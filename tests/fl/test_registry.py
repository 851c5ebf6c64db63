"""A method is one module and one registration: here one is added from outside the package, through the
``silofl.methods`` entry-point group, and runs end to end on both the simulator and its checks."""

import json
import sys
import textwrap

import pytest

from silofl.fl import registry

PLUGIN = '''
"""A third-party method: FedAvg's sites, but the server keeps the median of the uploads' weights."""
from dataclasses import dataclass

import torch

from silofl.fl.coordinator import Method
from silofl.fl.exchange.centralized import AveragingServer, Centralized, CentralSite
from silofl.fl.methods.common import dpsgd_settings, spec
from silofl.fl.options import SharedModelOptions
from silofl.fl.registry import register


@dataclass
class MedianOptions(SharedModelOptions):
    trim: int = 0


class MedianServer(AveragingServer):
    def aggregate(self, rnd, packets, weights=None):
        from silofl.comm.wire import read_model
        from silofl.fl.exchange.centralized import WEIGHT_KEY

        ups = [read_model(p.data, self.state(), (WEIGHT_KEY,), positive=True)[0] for p in packets]
        self.model.load_state_dict({k: torch.stack([u[k] for u in ups]).median(0).values for k in ups[0]})
        self.version = rnd
        return []


@register("fedmedian", options=MedianOptions, headline="global_acc", exchange="server",
          metrics=("global_acc",), description="FedAvg's sites with a coordinate-wise median at the server")
class FedMedian(Method):
    def make_site(self, k, x, y, data):
        return CentralSite(k, x, y, spec(self.opts.proxy_model, data), dpsgd_settings(self.plan, k),
                           shared_field="global")

    def make_coordinator(self, n_sites, data, device):
        c = Centralized(self.plan, n_sites, spec(self.opts.proxy_model, data), device)
        c.server.__class__ = MedianServer
        return c
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """An installed third-party package: its module and a dist-info declaring the entry point."""
    (tmp_path / "silofl_fedmedian.py").write_text(textwrap.dedent(PLUGIN))
    dist = tmp_path / "silofl_fedmedian-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: silofl-fedmedian\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[silofl.methods]\nfedmedian = silofl_fedmedian\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.METHODS.rescan()
    yield
    registry.METHODS.unregister("fedmedian")
    sys.modules.pop("silofl_fedmedian", None)
    registry.METHODS.rescan()


@pytest.mark.slow
def test_a_method_from_another_package_registers_and_runs(plugin, tiny_cfg, tmp_path):
    from typer.testing import CliRunner

    from silofl.cli.main import app
    from silofl.runner.loop import run

    info = registry.methods()["fedmedian"]
    assert info.exchange == "server" and info.options.__name__ == "MedianOptions"
    s = run(tiny_cfg.replace(method="fedmedian", rounds=2, trim=1, out=str(tmp_path / "m")), progress=False)
    assert (
        s["method"] == "fedmedian"
        and s["privacy"]["formal_guarantee"]
        and s["final"]["global_acc"]["mean"] > 0
    )
    cfg = (tmp_path / "m" / "config.yaml").read_text()
    assert "fedmedian:\n" in cfg and "trim: 1" in cfg and "dml_alpha" not in cfg  # its own section only
    out = tmp_path / "cli"
    res = CliRunner().invoke(
        app,
        [
            "run",
            "--method",
            "fedmedian",
            "--dataset",
            "digits",
            "--clients",
            "3",
            "--rounds",
            "1",
            "--samples-per-client",
            "100",
            "--batch-size",
            "25",
            "--delta",
            "1e-3",
            "--test-limit",
            "100",
            "--quiet",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    assert json.loads((out / "summary.json").read_text())["method"] == "fedmedian"


def test_built_in_methods_come_in_their_documented_order_with_their_traits():
    m = registry.methods()
    assert list(m)[:7] == ["proxyfl", "fedavg", "fml", "avgpush", "cwt", "regular", "joint"]
    assert {k for k, i in m.items() if i.mutual_learning} == {"proxyfl", "fml"}
    assert {k for k, i in m.items() if i.traits.nonprivate} == {"fedadam", "fednova", "rmsprop"}
    assert m["joint"].traits.pooled and all(i.headline in i.metrics for i in m.values())
    with pytest.raises(ValueError, match="already registered"):
        registry.register(
            "proxyfl",
            options=m["fedavg"].options,
            headline="global_acc",
            exchange="server",
            description="",
            metrics=("global_acc",),
        )(type("Other", (), {}))
