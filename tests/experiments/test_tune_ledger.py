"""`silofl tune --site-folder …`: the tuning trials are charged to each site's one ledger (a ``tuning``
entry, silofl.privacy.site_accountant) — checked against its policy and its lifetime budget before the first
trial; a refusal is one line, exit 2, nothing charged, nothing written."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from silofl.cli.main import app
from silofl.privacy.analysis import epsilon_of
from silofl.privacy.site_accountant import SiteAccountant
from silofl.site.folder import SiteFolder
from silofl.site.policy import SitePolicy, save_policy
from tests.helpers import write_survival_sites

runner = CliRunner()


def _sites(tmp_path, lifetime: float, seeded_ok: bool = False):
    schema, tables, _ = write_survival_sites(tmp_path / "data", sites=2, rows=80)
    folders = []
    for k in range(2):
        f = SiteFolder.open(tmp_path / f"site{k}", f"site{k}", (lifetime, 1e-3))
        if seeded_ok:
            save_policy(f, SitePolicy(allow_research_seed=True))
        folders.append(f)
    return schema, tables, folders


def _args(schema, tables, folders, out, *extra):
    sets = {
        "dataset": "table",
        "schema": schema,
        "site_data": ",".join(tables),
        "proxy_model": "logreg",
        "rounds": 2,
        "batch_size": 16,
        "delta": 1e-4,
    }
    return [
        "tune",
        "--method",
        "fedavg",
        "--target-epsilon",
        "2",
        *[x for k, v in sets.items() for x in ("--set", f"{k}={v}")],
        *[x for f in folders for x in ("--site-folder", str(f.path))],
        "--out",
        str(out),
        *extra,
    ]


def _fake_trials(monkeypatch, record=(1.0, 0.2, 10)):
    """Trials that train nothing: each records one block (σ, q, steps) per site."""
    import silofl.experiments.tune as tune_mod

    ran = []

    def fake(cfg, i, combo, score_field, progress, console):
        ran.append(i)
        acc = [{"client": k, "history": [list(record)], "delta": cfg.delta} for k in (0, 1)]
        row = {
            "trial": i,
            "settings": combo,
            "validation": 0.5 + 0.01 * i,
            "epsilon": 1.0,
            "noise_multiplier": record[0],
            "seconds": 0.0,
            "test_set": "validation: fake",
        }
        return row, {"accounting": acc}

    monkeypatch.setattr(tune_mod, "_run_trial", fake)
    return ran


def _kinds(folder) -> list[str]:
    return [e["kind"] for e in SiteFolder.load(folder.path).ledger.entries]


def test_every_trial_is_charged_to_each_sites_ledger_before_the_first(tmp_path, monkeypatch):
    schema, tables, folders = _sites(tmp_path, lifetime=10.0)
    ran = _fake_trials(monkeypatch, record=(20.0, 0.01, 1))  # recorded less than planned: no top-up
    r = runner.invoke(app, _args(schema, tables, folders, tmp_path / "t", "--grid", "lr=0.01,0.1"))
    assert r.exit_code == 0, r.output
    assert ran == [0, 1]
    assert "site site0: tuning charged to its ledger (entry 2)" in " ".join(r.output.split())
    for f in folders:
        led = SiteFolder.load(f.path).ledger
        (entry,) = [e for e in led.entries if e["kind"] == "tuning"]
        assert entry["selection"] == "composition" and len(entry["trials"]) == 2 and entry["unit"] == "row"
        hist = tuple(tuple(t) for t in entry["trials"])
        # each trial a budget-first run at ε ≤ 2: composed, their ε lies above one trial's, within two
        books = SiteAccountant(led, colluders=1)
        eps = books.epsilon(1e-3, "colluders")
        assert eps == pytest.approx(epsilon_of("rdp", hist, 1e-3), rel=1e-3)
        assert epsilon_of("rdp", hist[:1], 1e-4) <= 2.0 + 1e-6 < eps
        assert books.report(1e-3)["mechanisms"] == {"tuning": 1}


def test_a_tuning_that_would_cross_the_lifetime_is_refused_before_the_first_trial(tmp_path, monkeypatch):
    schema, tables, folders = _sites(
        tmp_path, lifetime=2.0
    )  # two trials (ε 2.2 at δ 1e-3) do not fit in 2, one (1.6) does
    ran = _fake_trials(monkeypatch)
    before = [_kinds(f) for f in folders]
    out = tmp_path / "t"
    r = runner.invoke(app, _args(schema, tables, folders, out, "--grid", "lr=0.01,0.1"))
    assert r.exit_code == 2 and "lifetime budget ε 2:" in r.output and "tuning (2 trials)" in r.output
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output
    assert ran == [] and not out.exists()
    assert [_kinds(f) for f in folders] == before  # nothing charged to any site
    # one trial fits
    r = runner.invoke(app, _args(schema, tables, folders, out, "--grid", "lr=0.01"))
    assert r.exit_code == 0, r.output
    assert all(_kinds(f)[-1] == "tuning" for f in folders)


def test_random_trials_charge_the_repeat_and_select_bound_and_top_up_what_ran_beyond_it(
    tmp_path, monkeypatch
):
    schema, tables, folders = _sites(tmp_path, lifetime=30.0, seeded_ok=True)
    ran = _fake_trials(monkeypatch, record=(1.5, 0.5, 6))  # each trial spends more than planned
    extra = ("--grid", "lr=0.01,0.1", "--random-trials", "geometric:0.5", "--set", "seed=3")
    r = runner.invoke(app, _args(schema, tables, folders, tmp_path / "t", *extra))
    assert r.exit_code == 0, r.output
    for f in folders:
        tuning = [e for e in SiteFolder.load(f.path).ledger.entries if e["kind"] == "tuning"]
        first = tuning[0]
        assert first["selection"] == "repeat-and-select" and first["distribution"] == "negbin"
        assert first["eta"] == 1.0 and first["gamma"] == 0.5 and len(first["grid"]) == 2
        assert first["cap"] >= 40  # the cap's cost (1 + e^ε)·2^-cap stays small up to the lifetime ε 30
        if ran:  # what the trials recorded above the plan is charged on top, as a composition
            assert len(tuning) == 2 and tuning[1]["trials"] == [[1.5, 0.5, 6]] * len(ran)


def test_a_sites_policy_refuses_a_seeded_tuning_before_anything_runs(tmp_path, monkeypatch):
    schema, tables, folders = _sites(tmp_path, lifetime=10.0)
    ran = _fake_trials(monkeypatch)
    r = runner.invoke(app, _args(schema, tables, folders, tmp_path / "t", "--set", "seed=1"))
    assert r.exit_code == 2 and "site site0 refuses the tuning" in r.output, r.output
    assert ran == [] and all("tuning" not in _kinds(f) for f in folders)
    # one folder for two sites: refused
    r = runner.invoke(app, _args(schema, tables, folders[:1], tmp_path / "t"))
    assert r.exit_code == 2 and "1 site folders given for 2 sites" in r.output, r.output
