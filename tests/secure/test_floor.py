"""A deployed hospital's own floor on secure aggregation (site.json's secagg_min_noise / secagg_min_survivors
and its lifetime ε): it masks no round that gives less protection — one logged refusal, nothing released —
and its ledger records the discrete mechanisms it ran, from which it computes its own ε against the server."""

import logging

import pytest
import torch

from silofl.core.errors import ConfigError
from silofl.fl.exchange.client_level import LEDGER_KIND, SecureFloor
from silofl.site.folder import SiteConfig
from tests.helpers import build_run
from tests.secure.test_client_level import config, weights


def test_site_json_floor_fields_are_checked():
    base = {"name": "a", "data": None, "lifetime_epsilon": 1.0, "lifetime_delta": 1e-5}
    c = SiteConfig.from_dict({**base, "secagg_min_noise": 1.5, "secagg_min_survivors": 3}, "site.json")
    assert (c.secagg_min_noise, c.secagg_min_survivors) == (1.5, 3)
    for bad in ({"secagg_min_noise": -1.0}, {"secagg_min_survivors": 1}):
        with pytest.raises(ConfigError, match="secagg_min"):
            SiteConfig.from_dict({**base, **bad}, "site.json")


@pytest.mark.slow
def test_a_site_refuses_below_its_floor_and_its_ledger_records_its_own_spend(tmp_path, caplog):
    b = build_run(config(tmp_path, noise_multiplier=1.0))
    sites = b.engine.sites
    for k, site in sites.items():
        site.open_folder(tmp_path / f"site{k}")
        site.secure_floor = SecureFloor(min_noise=0.5, min_survivors=3, lifetime_epsilon=1e6, delta=1e-3)
    coord = b.coordinator
    coord.start()
    srv = coord.server
    coord.run_round(1)  # above the floor: released, and each site's ledger holds the round's mechanisms
    assert srv.history[-1]["survivors"] == 4
    for site in sites.values():
        entries = [e for e in site.ledger.entries if e["kind"] == LEDGER_KIND]
        assert len(entries) == 1 and entries[0]["round"] == 1
        from silofl.privacy.discrete import epsilon

        own = epsilon(site.secure_spent(), rounds=1, delta=1e-3)
        assert own == pytest.approx(srv.epsilon_vs_server(), rel=1e-12)
    # a floor above the requested noise (z = 1): every site refuses before training; nothing released
    for site in sites.values():
        site.secure_floor = SecureFloor(min_noise=1.5, min_survivors=None, lifetime_epsilon=1e6, delta=1e-3)
    before = weights(srv)
    with caplog.at_level(logging.WARNING, logger="silofl"):
        coord.run_round(2)
    assert srv.history[-1]["abandoned"] and torch.equal(weights(srv), before)
    assert sum("below this site's floor" in r.message for r in caplog.records) >= 4
    assert all(len([e for e in s.ledger.entries if e["kind"] == LEDGER_KIND]) == 1 for s in sites.values())
    # a lifetime ε that one more round would exceed: refused the same way
    lifetime = srv.epsilon_vs_server() * 1.5
    for site in sites.values():
        site.secure_floor = SecureFloor(
            min_noise=None, min_survivors=None, lifetime_epsilon=lifetime, delta=1e-3
        )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="silofl"):
        coord.run_round(3)
    assert srv.history[-1]["abandoned"] and len(srv.secure_released) == 1
    assert any("above its lifetime" in r.message for r in caplog.records)
