"""One accountant per site (silofl.privacy.site_accountant): every mechanism a site's ledger records —
DP-SGD, secure sums, client-level rounds, publications, restores — composed in one representation, per
threat, checked against the one lifetime budget before a step whatever the protocol; tested against
dp-accounting and an independent transcription of the Skellam bound."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from dp_accounting import GaussianDpEvent, PoissonSampledDpEvent, SelfComposedDpEvent
from dp_accounting.rdp import RdpAccountant
from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from silofl.core.errors import BudgetExhausted, ConfigError
from silofl.privacy import discrete as D
from silofl.privacy.accountant import Accountant, Budget
from silofl.privacy.analysis import epsilon_of
from silofl.privacy.site_accountant import (
    ORDERS,
    THREATS,
    SiteAccountant,
    planned_dpsgd,
    planned_release,
    planned_tuning,
    recompute,
)
from silofl.privacy.tuning import geometric, poisson
from silofl.site.folder import SiteFolder

DELTA = 1e-5


def _mech(z: float = 1.0, m: int = 3, parties: int = 5) -> D.DiscreteMechanism:
    return D.calibrate(dim=64, clip=1.0, bits=20, parties=parties, min_survivors=m, noise_multiplier=z)


def _books(*entries: dict, lifetime=(14.0, 1e-4), colluders: int = 0) -> SiteAccountant:
    """An accountant over an in-memory ledger (the entries, a budget entry first)."""
    budget = {"kind": "budget", "epsilon": lifetime[0], "delta": lifetime[1]}
    seq = [{**e, "seq": i} for i, e in enumerate([budget, *entries])]
    return SiteAccountant(SimpleNamespace(entries=seq), colluders=colluders)  # type: ignore[arg-type]


def _dpsgd(sigma=1.1, q=0.01, steps=500, unit="row") -> dict:
    return {"kind": "dp-sgd", "run": "r", **planned_dpsgd(sigma, q, steps, unit)}


def _secure(mech, rounds=1) -> dict:
    return {
        "kind": "secagg-discrete",
        "run": "s",
        "round": 1,
        "mechanisms": [mech.to_dict()],
        "rounds": rounds,
    }


def _skellam_reference(mech: D.DiscreteMechanism, survivors: int, orders) -> np.ndarray:
    """Agarwal, Kairouz & Liu (2021), Theorem 3.5, as google-research/federated's ``_skellam_rdp`` writes it
    (written out here, not silofl's), at the integer order ⌈α⌉ ≥ 2 of each order α."""
    l2, l1, var = mech.l2_sensitivity(), mech.l1_sensitivity(), survivors * mech.local_mu
    out = []
    for a in orders:
        a = max(2, math.ceil(a))
        out.append(
            a * l2**2 / (2 * var) + min(((2 * a - 1) * l2**2 + 6 * l1) / (4 * var**2), 3 * l1 / (2 * var))
        )
    return np.array(out)


@pytest.mark.parametrize("threat,colluders", [("outsiders", 0), ("server", 0), ("colluders", 2)])
def test_a_mixed_ledger_composes_as_dp_accounting_does(threat, colluders):
    mech = _mech(z=1.5, m=3)
    release = {"kind": "release", "records": ["a", "b"], "epsilon": 0.5, "delta": 1e-7}
    restore = {"kind": "restore", "epsilon": 0.25, "delta": 1e-8, "epoch": 1}
    entries = [_dpsgd(1.1, 0.01, 500), _secure(mech, rounds=3), release, restore]
    got = _books(*entries, colluders=colluders).epsilon(DELTA, threat)
    # the reference: dp-accounting's subsampled Gaussian and conversion, the Skellam bound transcribed above
    ref = RdpAccountant(list(ORDERS))
    ref.compose(SelfComposedDpEvent(PoissonSampledDpEvent(0.01, GaussianDpEvent(1.1)), 500))
    honest = 3 if threat != "colluders" else 1  # two of the three survivors collude: one honest share left
    curve = np.asarray(ref._rdp) + 3 * _skellam_reference(mech, honest, ORDERS)
    want = compute_epsilon(list(ORDERS), list(curve), DELTA - 1e-7 - 1e-8)[0] + 0.5 + 0.25
    assert got == pytest.approx(want, rel=1e-9)
    assert recompute(entries, DELTA, threat, colluders) == pytest.approx(want, rel=1e-9)  # the auditor's path
    # every part counts: the DP-SGD block alone, the secure rounds alone are each strictly below
    assert _books(entries[0]).epsilon(DELTA, threat) < got
    assert _books(entries[1], colluders=colluders).epsilon(DELTA, threat) < got


def test_per_threat_figures_local_noise_is_the_same_for_all_and_colluders_see_fewer_shares():
    books = _books(_dpsgd(), {"kind": "release", "records": ["x"], "epsilon": 1.0, "delta": 1e-7})
    eps = books.epsilons(DELTA)
    assert eps["outsiders"] == eps["server"] == eps["colluders"]
    secure = _books(_secure(_mech(m=4)), colluders=2).epsilons(DELTA)
    assert secure["outsiders"] == secure["server"] < secure["colluders"]
    # as silofl.privacy.discrete computes a round with the honest survivors' shares only
    assert secure["colluders"] == pytest.approx(
        D.epsilon([_mech(m=4)], rounds=1, delta=DELTA, survivors=2, whole_party=True), rel=1e-3
    )
    # colluders as many as the survivors floor leave no honest share: no guarantee against them
    assert _books(_secure(_mech(m=2)), colluders=2).epsilon(DELTA, "colluders") == math.inf
    # a client-level round whose server adds the noise protects nothing against that server
    cl = _books({"kind": "client-level", "multipliers": {"hospital": 1.0}, "sample_rate": 1.0, "v": 1})
    assert math.isfinite(cl.epsilon(DELTA, "outsiders")) and cl.epsilon(DELTA, "server") == math.inf


def test_dpsgd_alone_matches_the_runs_own_accountant():
    hist = ((1.1, 0.01, 500), (0.9, 0.02, 200))
    books = _books(*(_dpsgd(*h) for h in hist))
    assert books.epsilon(DELTA) == pytest.approx(epsilon_of("rdp", hist, DELTA), rel=1e-3)


def test_units_are_reported_honestly():
    rep = _books(_dpsgd(unit="person (column pid)"), _dpsgd()).report(DELTA)
    assert rep["unit"] == "row" and "group-privacy" in rep["caveat"]
    assert set(rep["epsilon"]) == set(THREATS) and rep["against"]["server"]
    only_persons = _books(_dpsgd(unit="person (column pid)"), _secure(_mech())).report(DELTA)
    assert only_persons["unit"] == "person (column pid)" and only_persons["caveat"] is None


def test_a_kind_no_accountant_composes_is_refused_not_left_out():
    with pytest.raises(ConfigError, match="no accountant composes"):
        _books({"kind": "mystery", "epsilon": 1.0}).epsilon(DELTA)


@pytest.mark.parametrize("threat,colluders", [("server", 0), ("colluders", 2)])
def test_a_ledger_with_dpsgd_secure_sums_and_tuning_composes_as_dp_accounting_does(threat, colluders):
    from dp_accounting import dp_event as de

    mech = _mech(z=1.5, m=3)
    grid = planned_tuning(grid=[(1.2, 0.02, 300)], count=geometric(0.25), cap=80)
    entries = [_dpsgd(1.1, 0.01, 500), _secure(mech, rounds=2), planned_tuning([(2.0, 0.05, 100)] * 3), grid]
    got = _books(*entries, colluders=colluders).epsilon(DELTA, threat)
    ref = RdpAccountant(list(ORDERS))  # dp-accounting's own events, written out here
    ref.compose(SelfComposedDpEvent(PoissonSampledDpEvent(0.01, GaussianDpEvent(1.1)), 500))
    ref.compose(SelfComposedDpEvent(PoissonSampledDpEvent(0.05, GaussianDpEvent(2.0)), 300))
    trial = SelfComposedDpEvent(PoissonSampledDpEvent(0.02, GaussianDpEvent(1.2)), 300)
    ref.compose(de.RepeatAndSelectDpEvent(trial, geometric(0.25).mean, 1.0))
    honest = 3 if threat != "colluders" else 1
    curve = np.asarray(ref._rdp) + 2 * _skellam_reference(mech, honest, ORDERS)
    tail = 0.75**80  # P[K > 80] of the geometric: costs (1 + e^ε)·tail of δ
    want = compute_epsilon(list(ORDERS), list(curve), DELTA)[0]
    for _ in range(20):
        want = compute_epsilon(list(ORDERS), list(curve), DELTA - (1 + math.exp(want)) * tail)[0]
    # within 1e-5: the cap's δ is a fixed point (silofl.privacy.tuning), approached in different steps
    assert got == pytest.approx(want, rel=1e-5)
    assert recompute(entries, DELTA, threat, colluders) == pytest.approx(want, rel=1e-5)
    assert _books(*entries[:2], colluders=colluders).epsilon(DELTA, threat) < got


def test_a_repeat_and_select_over_a_grid_no_setting_dominates_is_labelled_not_independent():
    from silofl.privacy.site_accountant import ledger_events

    mixed = planned_tuning(grid=[(0.6, 0.5, 2), (3.0, 0.01, 2000)], count=poisson(4.0), cap=60)
    assert ledger_events([mixed]).not_independent == ["tuning"]
    assert recompute([mixed], DELTA) == pytest.approx(_books(mixed).epsilon(DELTA), rel=1e-9)
    one = planned_tuning(grid=[(1.0, 0.1, 10)], count=poisson(4.0), cap=60)
    assert ledger_events([one]).not_independent == []
    with pytest.raises(ConfigError, match="tuning"):
        _books({**one, "grid": [[1.0, 0.1, "ten"]]}).epsilon(DELTA)


# ------------------------------------------------------------------------------------------- properties
_sigma = st.sampled_from([0.8, 1.5, 3.0])  # few (σ, q): Opacus' curve of each is computed once
_rate = st.sampled_from([0.01, 0.2, 1.0])
_entry = st.one_of(
    st.builds(lambda s, q, n: _dpsgd(s, q, n), _sigma, _rate, st.integers(1, 2000)),
    st.builds(
        lambda z, m, r: _secure(_mech(z=z, m=m), rounds=r),
        st.floats(0.5, 3.0),
        st.integers(1, 5),
        st.integers(1, 4),
    ),
    st.builds(
        lambda e, d, recs: {"kind": "release", "records": recs, "epsilon": e, "delta": d},
        st.floats(0.0, 2.0),
        st.floats(0.0, 1e-7),
        st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3, unique=True),
    ),
    st.builds(
        lambda z, q: {"kind": "client-level", "multipliers": {"hospital": z}, "sample_rate": q, "v": 1},
        _sigma,
        _rate,
    ),
)
_tuning = st.one_of(
    st.builds(
        lambda s, q, n, k: planned_tuning([(s, q, n)] * k),
        _sigma,
        _rate,
        st.integers(1, 500),
        st.integers(1, 4),
    ),
    st.builds(
        lambda s, q, n, g: planned_tuning(grid=[(s, q, n)], count=geometric(g), cap=200),
        _sigma,
        _rate,
        st.integers(1, 500),
        st.sampled_from([0.1, 0.5]),
    ),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_entry, min_size=0, max_size=4), _tuning, st.integers(0, 3))
def test_adding_a_tuning_entry_never_lowers_the_composed_epsilon(entries, tuning, colluders):
    for threat in THREATS:
        eps = _books(*entries, colluders=colluders).epsilon(DELTA, threat)
        with_tuning = _books(*entries, tuning, colluders=colluders).epsilon(DELTA, threat)
        assert with_tuning >= eps * (1 - 1e-9)
        assert with_tuning >= _books(tuning).epsilon(DELTA, threat) * (1 - 1e-9)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_entry, min_size=1, max_size=5), _entry, st.integers(0, 3))
def test_composition_is_monotone_and_never_below_any_single_mechanism(entries, extra, colluders):
    books = _books(*entries, colluders=colluders)
    for threat in THREATS:
        eps = books.epsilon(DELTA, threat)
        for e in entries:  # never below any mechanism on its own
            assert eps >= _books(e, colluders=colluders).epsilon(DELTA, threat) * (1 - 1e-9)
        # adding any entry (recorded or planned) never lowers it
        assert _books(*entries, extra, colluders=colluders).epsilon(DELTA, threat) >= eps * (1 - 1e-9)
        assert books.epsilon(DELTA, threat, planned=[extra]) >= eps * (1 - 1e-9)


# ------------------------------------------------------------------------ one lifetime, every protocol
def _secure_to(folder: SiteFolder, target: float) -> None:
    """Secure rounds in the site's ledger worth ε ``target`` against the server at its lifetime δ."""
    life = folder.lifetime
    mech = D.calibrate_for_epsilon(
        target, delta=life[1], rounds=1, dim=64, clip=1.0, bits=20, parties=5, min_survivors=3
    )
    folder.ledger.append("secagg-discrete", run="secure", round=1, mechanisms=[mech.to_dict()])


def test_a_site_near_its_lifetime_from_secure_rounds_refuses_more_dpsgd(tmp_path):
    folder = SiteFolder.open(tmp_path / "a", "a", (14.0, 1e-4))
    _secure_to(folder, 13.8)
    books = folder.accountant()
    assert 13.0 < books.epsilon(1e-4) <= 13.8
    plan = [planned_dpsgd(1.0, 0.05, 400)]
    assert _books(plan[0]).epsilon(1e-4) < 14.0  # the DP-SGD run alone would fit the lifetime
    with pytest.raises(BudgetExhausted, match="above its lifetime budget ε 14") as e:
        books.require(plan, what="this run")
    assert "secagg-discrete ×1" in str(e.value) and "\n" not in str(e.value)
    # and step by step: the budget a site's DP-SGD run trains under refuses the next step
    budget = Budget(Accountant("rdp"), None, 1e-5)
    budget.lifetime = books.dpsgd_guard()
    assert not budget.allows(1.0, 0.05, 400)
    with pytest.raises(BudgetExhausted, match="lifetime"):
        budget.require(1.0, 0.05, 400)


def test_a_secure_round_is_refused_after_dpsgd_spend(tmp_path):
    from silofl.fl.exchange.client_level import ClientLevelSite, SecureFloor
    from silofl.secure import SecAggRefused

    folder = SiteFolder.open(tmp_path / "a", "a", (7.0, 1e-4))
    mech = _mech(z=1.0, m=3)
    site = object.__new__(ClientLevelSite)  # the real floor check of a deployed site's secure round
    site.settings, site.ledger = SimpleNamespace(private=True), folder.ledger
    site.secure_floor = SecureFloor(None, None, *folder.lifetime)
    site._check_floor([mech], 1.0, 3)  # the round alone fits
    folder.ledger.record_steps("run1", 1.0, 0.05, 400)  # a DP-SGD run spent most of the lifetime
    assert folder.accountant().epsilon(1e-4) < 7.0
    with pytest.raises(SecAggRefused, match="above its lifetime budget ε 7"):
        site._check_floor([mech], 1.0, 3)


def test_a_release_is_refused_after_dpsgd_and_secure_spend(tmp_path):
    folder = SiteFolder.open(tmp_path / "a", "a", (8.0, 1e-4))
    _, before = folder.require_release(["r1"], 5.0, 1e-6)
    assert before == (0.0, 0.0)
    _secure_to(folder, 4.0)  # the secure rounds count for a publication (they did not before)
    with pytest.raises(BudgetExhausted, match="lifetime budget ε=8"):
        folder.require_release(["r1"], 5.0, 1e-6)
    folder.require_release(["r1"], 3.0, 1e-6)
    folder.ledger.record_steps("run1", 1.5, 0.05, 400)  # then DP-SGD: ε 3.2 alone, 5.4 with the rounds
    with pytest.raises(BudgetExhausted, match="lifetime budget ε=8"):
        folder.require_release(["r1"], 3.0, 1e-6)
    # and what the records spent is the accountant's, at the δ the release leaves
    digests, before = folder.require_release(["r1"], 0.1, 1e-6)
    assert before[0] == pytest.approx(folder.accountant().epsilon(1e-4 - 1e-6, "colluders"))


def test_planned_releases_count_per_record():
    books = _books({"kind": "release", "records": ["a"], "epsilon": 3.0, "delta": 0.0}, lifetime=(5.0, 1e-4))
    assert not books.allows([planned_release({"a"}, 2.5, 0.0)], records={"a"})
    assert books.allows([planned_release({"b"}, 2.5, 0.0)], records={"b"})  # another record: parallel


@pytest.mark.slow  # a deployment on loopback (a site worker per folder, the coordinator's join)
@pytest.mark.deploy
def test_a_deployed_site_at_13_8_of_14_from_secure_rounds_refuses_a_dpsgd_run(tiny_cfg, tmp_path):
    from silofl.core.errors import SiloflError
    from silofl.deploy.coordinator import join
    from silofl.deploy.site import SiteWorker
    from tests.deploy.test_worker import Loopback, deployment

    cfg = tiny_cfg.replace(method="proxyfl", clients=2, rounds=2, noise_multiplier=1.0)
    _, workers, spec, folders = deployment(cfg, tmp_path)
    spec = {**spec, "config": {**spec["config"], "seed": None}}
    for f in folders:
        folder = SiteFolder.load(f)
        folder.set_lifetime(14.0, 1e-3, "the board's budget")
        _secure_to(folder, 13.8)  # earlier secure rounds: ε 13.8 of 14 against the server
    with pytest.raises(SiloflError) as e:  # the DP-SGD budget check now counts them
        join(Loopback([SiteWorker(f) for f in folders]), spec)
    said = str(e.value)
    assert "above its lifetime budget ε 14" in said and "secagg-discrete ×1" in said and "\n" not in said
    for f in folders:  # nothing trained, nothing spent
        assert not SiteFolder.load(f).ledger.history()


def test_a_sites_final_report_carries_its_whole_ledger_per_threat():
    from silofl.site.base import Site

    led = _books(_dpsgd(), _secure(_mech())).ledger
    rep = Site.ledger_privacy(SimpleNamespace(ledger=led, settings=SimpleNamespace(delta=DELTA)))[
        "site_ledger"
    ]
    assert rep["epsilon"]["server"] == pytest.approx(_books(_dpsgd(), _secure(_mech())).epsilon(DELTA))
    assert rep["against"]["server"] and rep["delta"] == DELTA and rep["no_guarantee_against"] == []
    assert Site.ledger_privacy(SimpleNamespace(ledger=None, settings=SimpleNamespace(delta=DELTA))) == {}
    cl = _books({"kind": "client-level", "multipliers": {"hospital": 1.0}, "sample_rate": 1.0, "v": 1})
    rep = cl.report(DELTA)
    assert rep["epsilon"]["server"] is None and rep["no_guarantee_against"] == ["server", "colluders"]


def test_the_console_names_the_threat_of_each_sites_whole_ledger():
    from silofl.cli import main

    books = _books(_dpsgd(), _secure(_mech(m=4)), colluders=2)
    summary = {"accounting": [{"client": 0, **{"site_ledger": books.report(DELTA)}}, {"client": 1}]}
    with main.console.capture() as cap:
        main._print_site_ledgers(summary)
    said = " ".join(cap.get().split())
    want = books.epsilons(DELTA)
    assert "client 0's whole ledger" in said and "client 1" not in said
    assert f"ε {want['server']:.3f} against the server and outsiders" in said
    assert f"ε {want['colluders']:.3f} against the server plus 2 colluding sites" in said
