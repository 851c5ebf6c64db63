"""silofl.report.comparison directly: rows pooled over seeds and clients, the table's ε column, failed
runs, files."""

import csv
import json
from types import SimpleNamespace

import pytest

from silofl.report.comparison import _bytes, markdown_table, summarize, write_report


def _summary(accs, eps=2.0, delta=1e-5, mode="strict", formal=True, units=None, total=3000.0):
    per = [{"client": k, "private_acc": a, "proxy_acc": a / 2, "epsilon": eps} for k, a in enumerate(accs)]
    privacy = {"delta": delta, "mode": mode, "formal_guarantee": formal, **(units or {})}
    return {
        "headline": "proxy_acc",
        "final": {"per_client": per},
        "rounds_run": 3,
        "wall_time_s": 2.0,
        "privacy": privacy,
        "randomness": {"seeded": True},
        "bytes": {"per_client_mean": 1500.0, "total_sent": total},
    }


def _run(rid, variant="base", label="proxyfl", seed=0):
    return SimpleNamespace(
        rid=rid, variant=variant, label=label, seed=seed, cfg=SimpleNamespace(metric="accuracy", out="unused")
    )


def test_rows_pool_every_client_of_every_seed_and_failures_are_listed():
    runs = [_run("a0", seed=0), _run("a1", seed=1), _run("b0", label="fedavg"), _run("c0", label="cwt")]
    results = {
        "a0": {"summary": _summary([0.6, 0.8])},
        "a1": {"summary": _summary([1.0, 0.6], total=5000.0)},
        "b0": {"error": "budget spent"},
        "stray": {"error": "killed"},
    }
    rows, failed = summarize(runs, results)
    assert failed == [
        {"run": "b0", "error": "budget spent"},
        {"run": "c0", "error": "not run"},
        {"run": "stray", "error": "killed"},
    ]
    (row,) = rows
    assert (row["method"], row["seeds"], row["runs"], row["headline"]) == (
        "proxyfl",
        [0, 1],
        ["a0", "a1"],
        "proxy_acc",
    )
    assert row["proxy_acc"]["mean"] == pytest.approx(0.375) and row["proxy_acc"]["n"] == 4
    assert row["headline_acc"] == row["proxy_acc"] and row["global_acc"]["mean"] is None
    assert (row["bytes_total"], row["privacy"], row["rounds"], row["formal_guarantee"]) == (
        4000.0,
        "strict",
        3,
        True,
    )


def test_the_table_says_no_dp_marks_a_non_formal_epsilon_and_gives_both_client_level_units():
    runs = [_run("p", "v1"), _run("o", "v1", "regular"), _run("c", "v2", "dp-fedavg")]
    results = {
        "p": {"summary": _summary([0.5], eps=8.0, mode="paper", formal=False)},
        "o": {"summary": _summary([0.9], eps=None, delta=None, mode="off")},
        "c": {"summary": _summary([0.7], units={"epsilon_hospital": 1.5, "epsilon_subclient": 0.25})},
    }
    rows, _ = summarize(runs, results)
    table = markdown_table(rows).splitlines()
    assert table[0].startswith(
        "| variant | method | judged by | private acc |"
    )  # two variants: a variant column
    cells = {line.split(" | ")[1]: line.split(" | ") for line in table[2:]}
    assert cells["proxyfl"][6] == "8.00 †" and cells["regular"][6] == "no DP"
    assert cells["dp-fedavg"][6] == "1.50 hospital / 0.25 sub-client"
    assert cells["proxyfl"][7:9] == ["1.50 kB", "3.00 kB"] and cells["proxyfl"][2] == "proxy"
    assert [r["privacy"] for r in rows] == ["paper", "off", "strict"]


def test_bytes_are_written_in_the_largest_unit_below_them():
    assert [_bytes(n) for n in (999, 1000, 1_500_000, 2.5e9)] == ["999 B", "1.00 kB", "1.50 MB", "2.50 GB"]


def test_a_comparison_whose_runs_all_failed_writes_its_files_without_plots(tmp_path):
    cc = SimpleNamespace(methods=["proxyfl"], seeds=[0], preset=None)
    report = write_report(tmp_path, [_run("a0")], {"a0": {"error": "out of memory"}}, [], cc)
    assert (
        report["rows"] == []
        and report["plots"] == []
        and report["failed"] == [{"run": "a0", "error": "out of memory"}]
    )
    assert json.loads((tmp_path / "results.json").read_text())["compare"] == {
        "methods": ["proxyfl"],
        "seeds": [0],
        "preset": None,
    }
    assert list(csv.reader((tmp_path / "results.csv").open()))[0][:3] == ["variant", "method", "headline"]
    assert len((tmp_path / "results.csv").read_text().splitlines()) == 1
    md = (tmp_path / "report.md").read_text()
    assert "## Failed runs" in md and "- `a0`: out of memory" in md and "|" not in md
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md", "results.csv", "results.json"]
