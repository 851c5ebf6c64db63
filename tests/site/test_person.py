"""A DP-SGD site with persons as its privacy unit (--id-column): q and the steps are over persons, the ε is
Opacus' RDP ε of exactly that mechanism, and the ledger records the unit with the spend."""

import pytest
import torch
from opacus.accountants import RDPAccountant

from silofl.core.errors import ConfigError
from silofl.models import ModelSpec
from silofl.privacy.ledger import Ledger
from silofl.site.dpsgd import DPSGDSettings, DPSGDSite


def settings(**kw):
    base = dict(
        seed=5,
        batch_size=3,
        lr=0.05,
        weight_decay=0.0,
        private=True,
        noise_multiplier=1.1,
        clip=1.0,
        delta=1e-3,
        accountant="rdp",
        target_epsilon=None,
        dp_backend="auto",
    )
    base.update(kw)
    return DPSGDSettings(**base)


@pytest.mark.slow
def test_the_accountant_sees_q_over_persons_and_its_epsilon_is_opacus_rdp(tmp_path):
    torch.manual_seed(0)
    persons = torch.arange(15).repeat_interleave(4)  # 15 persons, 4 rows each
    x, y = torch.randn(60, 5), torch.randint(0, 2, (60,))
    site = DPSGDSite(0, x, y, ModelSpec("mlp", (5,), 2), settings(), shared_field="global")
    assert site.sample_rate == pytest.approx(3 / 60)  # rows, before the unit is set
    site.open_folder(tmp_path / "client0", run_label="run")
    site.use_persons(persons, "pid")
    assert site.sample_rate == pytest.approx(3 / 15) and site.steps_per_round == 5  # over the 15 persons
    site.train(1)
    site.train(2)
    rep = site.privacy_report()
    assert rep["privacy_unit"] == "person (column pid)" and rep["persons"] == 15
    assert rep["sample_rate"] == pytest.approx(0.2) and rep["steps"] == 10
    opacus = RDPAccountant()
    opacus.history = [(1.1, 0.2, 10)]
    assert rep["epsilon"] == pytest.approx(opacus.get_epsilon(1e-3), rel=1e-9)
    led = Ledger(tmp_path / "client0")  # read back from disk
    assert led.units() == ["person (column pid)"] and rep["ledger_units"] == ["person (column pid)"]
    assert [e["unit"] for e in led.entries if e["kind"] == "dp-sgd"] == ["person (column pid)"] * 2


def test_person_ids_must_match_the_rows_and_come_before_training():
    x, y = torch.randn(8, 5), torch.randint(0, 2, (8,))
    site = DPSGDSite(0, x, y, ModelSpec("mlp", (5,), 2), settings(batch_size=2), shared_field="global")
    with pytest.raises(ConfigError, match="7 person ids for 8 training rows"):
        site.use_persons(torch.zeros(7, dtype=torch.long), "pid")
    site.train(1)
    with pytest.raises(ConfigError, match="before the first round"):
        site.use_persons(torch.arange(8), "pid")
