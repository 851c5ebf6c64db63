"""`silofl site ledger FOLDER [--recompute]`: every entry of a site's one ledger with its mechanism, the
composed ε per threat from the site's accountant and, with --recompute, dp-accounting's figures beside them,
naming what it cannot recompute on its own; a bad folder is one line, exit 2."""

from __future__ import annotations

from dp_accounting import GaussianDpEvent, PoissonSampledDpEvent, SelfComposedDpEvent
from dp_accounting.rdp import RdpAccountant
from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon
from typer.testing import CliRunner

from silofl.cli.main import app
from silofl.privacy import discrete as D
from silofl.privacy.site_accountant import ORDERS, planned_secure, planned_tuning
from silofl.site.folder import SiteFolder
from silofl.site.policy import SitePolicy, save_policy

runner = CliRunner()


def _append(folder: SiteFolder, entry: dict) -> None:
    folder.ledger.append(entry["kind"], **{k: v for k, v in entry.items() if k != "kind"})


def _site(tmp_path) -> SiteFolder:
    f = SiteFolder.open(tmp_path / "a", "a", (30.0, 1e-4))
    save_policy(f, SitePolicy(colluders=2, min_survivors=4))
    f.ledger.record_steps("run1", 1.1, 0.01, 500)
    mech = D.calibrate(dim=64, clip=1.0, bits=20, parties=5, min_survivors=4, noise_multiplier=1.5)
    _append(f, {**planned_secure([mech], rounds=2), "run": "run2"})
    _append(f, planned_tuning([(2.0, 0.05, 100)] * 2))
    return f


def test_site_ledger_lists_every_entry_and_the_composed_epsilon_per_threat(tmp_path):
    f = _site(tmp_path)
    r = runner.invoke(app, ["site", "ledger", str(f.path)])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert "its policy assumes 2 colluding sites" in lines[0]
    for seq, kind, unit in ((2, "dp-sgd", "row"), (3, "secagg-discrete", "hospital"), (4, "tuning", "row")):
        (row,) = [ln for ln in lines if ln.split()[:3] == [str(seq), kind, unit]]
        assert kind != "dp-sgd" or '"noise_multiplier":1.1,"sample_rate":0.01,"steps":500' in row
    books = f.accountant(2)
    for t, label in (
        ("outsiders", "outsiders"),
        ("server", "the server and"),
        ("colluders", "the server plus 2 colluding"),
    ):
        (ln,) = [x for x in lines if x.startswith(f"  against {label}")]
        assert ln.endswith(f"ε {books.epsilon(1e-4, t):.4f}")
    assert "recomputed" not in r.output


def test_site_ledger_recompute_sets_dp_accountings_figures_beside_the_sites(tmp_path):
    f = _site(tmp_path)
    r = runner.invoke(app, ["site", "ledger", str(f.path), "--recompute"])
    assert r.exit_code == 0, r.output
    # the part dp-accounting expresses on its own (DP-SGD and the composed tuning trials), computed here
    acc = RdpAccountant(list(ORDERS))
    acc.compose(SelfComposedDpEvent(PoissonSampledDpEvent(0.01, GaussianDpEvent(1.1)), 500))
    acc.compose(SelfComposedDpEvent(PoissonSampledDpEvent(0.05, GaussianDpEvent(2.0)), 200))
    want = compute_epsilon(list(ORDERS), list(acc._rdp), 1e-4)[0]
    part = [ln.split() for ln in r.output.splitlines() if ln.endswith("independent part")]
    assert [p[0] for p in part] == ["outsiders", "server", "colluders"]
    for p in part:
        assert float(p[2]) == float(f"{want:.4f}") and abs(float(p[1]) - float(p[2])) < 2e-4
    whole = [ln.split() for ln in r.output.splitlines() if ln.endswith("whole ledger")]
    for p in whole:  # the secure rounds count in both; colluders leave 2 of 4 shares, so it is the largest
        assert abs(float(p[1]) - float(p[2])) <= 1e-3 * float(p[1]) and float(p[1]) > want
    assert "independent part: dp-sgd, tuning" in r.output
    assert "not recomputed independently: secagg-discrete" in r.output


def test_site_ledger_refuses_a_bad_folder_in_one_line(tmp_path):
    for bad in (tmp_path / "nothing", tmp_path):
        r = runner.invoke(app, ["site", "ledger", str(bad)])
        assert r.exit_code == 2 and "site.json" in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output
