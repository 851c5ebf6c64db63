"""silofl.runner.plots directly: the series it draws and what each panel shows (read from the figure
itself)."""

import numpy as np
import pytest

import silofl.runner.plots as plots

RECORDS = [
    {"round": 1, "client": 0, "proxy_acc": 0.5, "private_acc": 0.7, "epsilon": 1.0},
    {"round": 1, "client": 1, "proxy_acc": 0.3, "private_acc": None, "epsilon": 1.2},
    {"round": 2, "client": 1, "proxy_acc": 0.6, "epsilon": 2.0},
    {"round": 2, "client": 0, "proxy_acc": 0.8, "epsilon": 1.9},
]


@pytest.fixture
def figures(monkeypatch):
    """The figures the plots close (they are inspected instead of the PNG's pixels)."""
    shown = []
    real = plots.plt.close
    monkeypatch.setattr(plots.plt, "close", lambda fig: (shown.append(fig), real(fig)))
    return shown


saved: list = []


@pytest.fixture
def unrendered(figures, monkeypatch):
    """As ``figures``, without rendering the PNG (the slow part; whole runs write theirs) or laying the
    panels out; the savefig calls go to ``saved``."""
    from matplotlib.figure import Figure

    monkeypatch.setattr(Figure, "savefig", lambda self, path, **kw: saved.append((path, kw)))
    monkeypatch.setattr(Figure, "tight_layout", lambda self, **kw: None)
    return figures


def test_series_is_mean_and_population_std_over_clients_per_round_skipping_missing_values():
    rounds, mean, std = plots.series(RECORDS, "proxy_acc")
    assert (
        rounds.tolist() == [1, 2] and mean == pytest.approx([0.4, 0.7]) and std == pytest.approx([0.1, 0.1])
    )
    rounds, mean, std = plots.series(RECORDS, "private_acc")
    assert rounds.tolist() == [1] and mean.tolist() == [0.7] and std.tolist() == [0.0]
    assert plots.series(RECORDS, "global_acc")[0].size == 0


def test_plot_run_draws_each_models_mean_and_each_clients_epsilon(tmp_path, unrendered):
    saved.clear()
    path = plots.plot_run(RECORDS, tmp_path / "a.png", title="t", delta=1e-5)
    assert saved == [(path, {"dpi": 110})] and path == tmp_path / "a.png"
    acc, eps = unrendered[0].axes
    lines = {ln.get_label(): ln for ln in acc.get_lines()}
    assert sorted(lines) == ["private", "proxy"]
    assert np.asarray(lines["proxy"].get_ydata()) == pytest.approx([0.4, 0.7])
    by_client = {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in eps.get_lines()}
    assert by_client == {"client 0": ([1, 2], [1.0, 1.9]), "client 1": ([1, 2], [1.2, 2.0])}
    assert eps.get_ylabel() == "ε at δ = 1e-05" and eps.get_title() == ""


def test_without_dp_the_epsilon_panel_says_so(tmp_path, unrendered):
    plots.plot_run([{**r, "epsilon": None} for r in RECORDS], tmp_path / "b.png")
    eps = unrendered[0].axes[1]
    assert eps.get_lines() == [] and eps.get_title() == "no DP: ε not defined" and eps.get_ylabel() == "ε"


def test_sites_without_a_shared_test_set_plot_their_own_held_out_figures(tmp_path, unrendered):
    # a deployed survival run: each site scores only its own held-out rows, by the C-index
    recs = [
        {"round": t, "client": c, "global_acc_internal": None, "global_c_index_internal": v, "epsilon": 1.0}
        for t, c, v in ((1, 0, 0.6), (1, 1, 0.8), (2, 0, 0.7), (2, 1, 0.9))
    ]
    plots.plot_run(recs, tmp_path / "c.png")
    acc = unrendered[0].axes[0]
    (line,) = acc.get_lines()
    assert line.get_label() == "global" and np.asarray(line.get_ydata()) == pytest.approx([0.7, 0.8])
    assert acc.get_ylabel() == "C-index on each site's own held-out rows (mean ± std over clients)"


def test_server_rounds_panels_and_log_scale_only_for_positive_diagnostics(tmp_path, unrendered):
    history = [
        {"round": 1, "xi": 0.5, "phi": 0.0, "v": 2, "clip": 1.0},
        {"round": 2, "xi": 0.25, "phi": 0.5, "v": 3},
    ]
    plots.plot_server_rounds(history, tmp_path / "s.png", title="x")
    xi, phi, v, clip = unrendered[0].axes
    assert (xi.get_yscale(), phi.get_yscale(), v.get_yscale()) == ("log", "linear", "linear")
    assert list(v.get_lines()[0].get_ydata()) == [2, 3] and list(clip.get_lines()[0].get_xdata()) == [1]
    assert "not privatised" in unrendered[0]._suptitle.get_text()
