"""An accountant is one registration (``silofl.accountants``): the built-ins are Opacus' RDP and PRV
accountants; here one wrapping dp-accounting's RDP accountant (an independent implementation) is added as a
plug-in, records a run, reports ε close to Opacus' and calibrates σ by the same search Opacus runs."""

from __future__ import annotations

import pytest

from silofl.core.errors import ConfigError
from silofl.privacy.accountant import ACCOUNTANT_NAMES, Accountant
from silofl.privacy.analysis import (
    ACCOUNTANTS,
    AccountantSpec,
    _bisect_sigma,
    epsilon_of,
    noise_multiplier_for,
)
from tests.core import plugins

DPA = '''
"""dp-accounting's RDP accountant in the Opacus interface (.history, .get_epsilon(delta))."""
from silofl.privacy.analysis import ACCOUNTANTS, AccountantSpec

ORDERS = list(range(2, 64)) + [128, 256, 512, 1024]


class DpaRdp:
    def __init__(self):
        self.history = []

    def get_epsilon(self, delta):
        import dp_accounting
        from dp_accounting.rdp import RdpAccountant

        acc = RdpAccountant(ORDERS)
        for sigma, q, steps in self.history:
            event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
            acc.compose(event, int(steps))
        return float(acc.get_epsilon(delta))


ACCOUNTANTS.register("dpa-rdp", AccountantSpec("dp_accounting.rdp", DpaRdp, description="dp-accounting RDP"))
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    plugins.install(
        tmp_path / "sp",
        monkeypatch,
        "silofl-dpa",
        {"silofl_dpa": DPA},
        {"silofl.accountants": {"dpa-rdp": "silofl_dpa"}},
    )
    ACCOUNTANTS.rescan()
    yield
    plugins.forget(["silofl_dpa"], [(ACCOUNTANTS, "dpa-rdp")])


def test_builtins_and_their_reported_names():
    assert ACCOUNTANTS.names() == ("rdp", "prv")
    assert dict(ACCOUNTANT_NAMES) == {"rdp": "opacus.rdp", "prv": "opacus.prv"}
    assert ACCOUNTANTS.get("rdp").opacus == "rdp" and ACCOUNTANTS.get("prv").epsilon is None


def test_a_plugin_accountant_records_and_calibrates(plugin):
    assert "dpa-rdp" in ACCOUNTANT_NAMES and ACCOUNTANT_NAMES["dpa-rdp"] == "dp_accounting.rdp"
    acc = Accountant("dpa-rdp")
    acc.step(1.0, 0.02, 300)
    eps, opacus = acc.epsilon(1e-5), epsilon_of("rdp", acc.history, 1e-5)
    assert 0.9 * opacus < eps < 1.05 * opacus  # two RDP accountants, two order grids: close, not equal
    assert acc.report(1e-5)["accountant"] == "dp_accounting.rdp"


@pytest.mark.slow
def test_a_plugin_accountant_calibrates_by_opacus_search(plugin):
    """Opacus knows no dpa-rdp: σ comes from silofl's copy of Opacus' get_noise_multiplier search over the
    plug-in's ε, which for an accountant Opacus knows returns exactly Opacus' σ."""
    opacus = noise_multiplier_for(3.0, 1e-5, 0.01, 400, "rdp")
    assert _bisect_sigma("rdp", 3.0, 1e-5, 0.01, 400, 0.01) == opacus
    sigma = noise_multiplier_for(2.0, 1e-5, 0.02, 300, "dpa-rdp")
    assert 2.0 - 0.01 <= epsilon_of("dpa-rdp", ((sigma, 0.02, 300),), 1e-5) <= 2.0


def test_unknown_accountant_is_one_line_naming_the_choices():
    for call in (lambda: Accountant("pld"), lambda: epsilon_of("pld", ((1.0, 0.1, 1),), 1e-5)):
        with pytest.raises(ConfigError) as e:
            call()
        assert str(e.value) == "unknown accountant 'pld'; choose one of: rdp, prv"
    assert isinstance(ACCOUNTANTS.get("rdp"), AccountantSpec)
