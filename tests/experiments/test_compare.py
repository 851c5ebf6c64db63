import json

import pytest
import yaml
from typer.testing import CliRunner

from silofl.cli.main import app
from silofl.core.errors import ConfigError
from silofl.experiments.compare import CompareConfig, communication_sweep, run_compare
from silofl.runner.config import RunConfig

TINY = {
    "dataset": "digits",
    "clients": 4,
    "rounds": 2,
    "samples_per_client": 120,
    "batch_size": 30,
    "delta": 1e-3,
    "private_model": "cnn1",
    "proxy_model": "mlp",
    "test_limit": 200,
}


@pytest.mark.slow
def test_tiny_compare_end_to_end_through_the_cli(tmp_path):
    out = tmp_path / "rep"
    res = CliRunner().invoke(
        app,
        [
            "compare",
            "--methods",
            "proxyfl,fedavg,fml,avgpush,cwt,regular,regular:nodp,joint",
            "--dataset",
            "digits",
            "--seeds",
            "0,1",
            "--rounds",
            "2",
            "--clients",
            "4",
            "--samples-per-client",
            "120",
            "--batch-size",
            "30",
            "--set",
            "delta=0.001",
            "--private-model",
            "cnn1",
            "--test-limit",
            "200",
            "--comm-clients",
            "2,4",
            "--out",
            str(out),
            "--quiet",
        ],
    )
    assert res.exit_code == 0, res.output
    for f in (
        "report.md",
        "results.csv",
        "results.json",
        "accuracy_vs_round.png",
        "accuracy_vs_epsilon.png",
        "communication_vs_clients.png",
        "compare.yaml",
    ):
        assert (out / f).is_file(), f
    rep = json.loads((out / "results.json").read_text())
    rows = {r["method"]: r for r in rep["rows"]}
    assert set(rows) == {"proxyfl", "fedavg", "fml", "avgpush", "cwt", "regular", "regular:nodp", "joint"}
    assert rows["regular:nodp"]["epsilon"]["mean"] is None and rows["regular"]["epsilon"]["mean"] > 0
    assert rows["proxyfl"]["private_acc"]["n"] == 8  # 4 clients x 2 seeds pooled
    assert rows["joint"]["global_acc"]["n"] == 2  # one model per seed
    assert (
        rows["regular"]["bytes_total"] == 0 and rows["fedavg"]["bytes_total"] > rows["proxyfl"]["bytes_total"]
    )
    # the table's figures are the runs' own summaries
    s = json.loads((out / "runs/base/proxyfl/seed0/summary.json").read_text())
    s1 = json.loads((out / "runs/base/proxyfl/seed1/summary.json").read_text())
    vals = [c["private_acc"] for c in s["final"]["per_client"] + s1["final"]["per_client"]]
    assert rows["proxyfl"]["private_acc"]["mean"] == pytest.approx(sum(vals) / len(vals))
    md = (out / "report.md").read_text()
    assert "| proxyfl | private |" in md and "Communication per round" in md
    comm = {(r["method"], r["clients"]): r for r in rep["communication"]}
    assert comm[("fedavg", 4)]["bytes_per_round"] > comm[("fedavg", 2)]["bytes_per_round"]


@pytest.mark.slow
def test_communication_sweep_counts_exact_message_sizes():
    base = RunConfig.from_dict(TINY)
    rows = {(r["method"], r["clients"]): r for r in communication_sweep(base, [2, 4], ["proxyfl", "fedavg"])}
    # ProxyFL: one proxy per client per round on the exponential graph; FedAvg: up + down per client
    p2, p4 = rows[("proxyfl", 2)]["bytes_per_round"], rows[("proxyfl", 4)]["bytes_per_round"]
    assert p4 == 2 * p2
    f4 = rows[("fedavg", 4)]
    assert f4["server_bytes_per_round"] == f4["bytes_per_round"] == pytest.approx(2 * p4, rel=0.01)


def test_a_config_the_data_cannot_serve_is_one_clear_error_before_anything_runs(tmp_path):
    cc = CompareConfig(
        methods=["regular", "avgpush"],
        seeds=[0],
        out=str(tmp_path / "c"),
        run=dict(TINY),
        variants=[{"name": "ok"}, {"name": "broken", "set": {"batch_size": 500}}],
    )
    with pytest.raises(ConfigError, match="run broken/regular/seed0: batch_size 500 exceeds"):
        run_compare(cc, progress=False)
    assert not (tmp_path / "c").exists()
    res = CliRunner().invoke(
        app,
        [
            "compare",
            "--dataset",
            "digits",
            "--methods",
            "proxyfl,fedavg",
            "--seeds",
            "0",
            "--rounds",
            "1",
            "--out",
            str(tmp_path / "d"),
            "--quiet",
            "--set",
            "samples_per_client=2000",
        ],
    )
    assert res.exit_code == 2 and res.output.count("error") == 1 and "Traceback" not in res.output


@pytest.mark.slow
def test_a_crashed_run_is_reported_and_the_others_finish_then_resume_skips_done_runs(tmp_path, monkeypatch):
    import silofl.runner.loop as loop

    real = loop.run

    def crash_in_broken(cfg, *a, **k):
        if "/broken/" in cfg.out:
            raise RuntimeError("disk on fire")
        return real(cfg, *a, **k)

    monkeypatch.setattr(loop, "run", crash_in_broken)
    cc = CompareConfig(
        methods=["regular", "avgpush"],
        seeds=[0],
        out=str(tmp_path / "c"),
        run=dict(TINY),
        variants=[{"name": "ok"}, {"name": "broken", "set": {"batch_size": 20}}],
    )
    rep = run_compare(cc, progress=False)
    assert [f["run"] for f in rep["failed"]] == ["broken/regular/seed0", "broken/avgpush/seed0"]
    assert "disk on fire" in rep["failed"][0]["error"]
    assert {r["variant"] for r in rep["rows"]} == {"ok"} and len(rep["rows"]) == 2
    assert "## Failed runs" in (tmp_path / "c" / "report.md").read_text()
    done = tmp_path / "c/runs/ok/regular/seed0/summary.json"
    stamp = done.stat().st_mtime_ns
    cc.resume = True
    rep2 = run_compare(cc, progress=False)
    assert done.stat().st_mtime_ns == stamp
    assert sorted(rep2["resumed"]) == ["ok/avgpush/seed0", "ok/regular/seed0"]
    assert rep2["rows"] == rep["rows"]
    stored = tmp_path / "c/runs/ok/regular/seed0/config.yaml"
    old = yaml.safe_load(stored.read_text())
    del old["regular"]["dp_backend"]  # a run written before an option existed: the option's default applies
    stored.write_text(yaml.safe_dump(old))
    assert all(r.done() for r in cc.plan() if r.variant == "ok")
    cc.run = {**TINY, "threads": 1}  # another thread count is the same experiment
    assert len(run_compare(cc, progress=False)["resumed"]) == 2
    import os  # the same folder spelled another way (relative vs absolute) holds the same runs

    rel = CompareConfig(**{**cc.__dict__, "out": os.path.relpath(tmp_path / "c")})
    assert all(r.done() for r in rel.plan() if r.variant == "ok")
    only = run_compare(CompareConfig(**{**cc.__dict__, "report_only": True, "seeds": [0, 1]}), progress=False)
    assert (
        "ok/regular/seed1" in {f["run"] for f in only["failed"]}
        and not (tmp_path / "c/runs/ok/regular/seed1").exists()
    )
    # a changed config is not "done": it runs again
    cc.run = {**TINY, "rounds": 3}
    rep3 = run_compare(cc, progress=False)
    assert rep3["resumed"] == [] and rep3["rows"][0]["rounds"] == 3


def test_presets_expand_into_variants_and_bad_input_is_a_clear_error(tmp_path):
    cc = CompareConfig(
        methods=["proxyfl", "fedavg"], seeds=[0, 1], preset="hetero", run={**TINY, "clients": 8}
    )
    runs = cc.plan()
    assert len(runs) == 2 * 2 * 2
    mixed = [r for r in runs if r.variant == "mixed" and r.label == "proxyfl"][0]
    assert mixed.cfg.options.private_models == [
        "mlp",
        "mlp",
        "lenet5",
        "lenet5",
        "cnn1",
        "cnn1",
        "cnn2",
        "cnn2",
    ]
    pm = CompareConfig(methods=["proxyfl", "fedavg"], seeds=[0], preset="privacy-mode", run=dict(TINY)).plan()
    assert {(r.label, r.variant, r.cfg.privacy) for r in pm} >= {
        ("proxyfl", "paper", "paper"),
        ("fedavg", "paper", "strict"),
    }
    with pytest.raises(ConfigError, match="unknown preset"):
        CompareConfig(preset="nope", run=dict(TINY)).plan()
    with pytest.raises(ConfigError, match="unknown method 'fedsgd'"):
        CompareConfig(methods=["fedsgd"], run=dict(TINY)).plan()
    with pytest.raises(ConfigError, match="unknown config option"):
        CompareConfig(run={"roundz": 3}).plan()
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({"methods": ["regular"], "seeds": [3], "run": TINY, "jobs": 2}))
    cc = CompareConfig.from_yaml(p)
    (r,) = cc.plan()
    assert r.seed == 3 and r.cfg.threads == 1 and r.cfg.seed == 3
    p.write_text(yaml.safe_dump({"methods": ["regular"], "rounds": 3}))
    with pytest.raises(ConfigError, match="under 'run:'"):
        CompareConfig.from_yaml(p)


@pytest.mark.slow
def test_parallel_jobs_give_the_same_numbers_as_sequential(tmp_path):
    kw = dict(methods=["avgpush"], seeds=[0, 1], run={**TINY, "threads": 1})
    a = run_compare(CompareConfig(out=str(tmp_path / "a"), jobs=1, **kw), progress=False)
    b = run_compare(CompareConfig(out=str(tmp_path / "b"), jobs=2, **kw), progress=False)
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("wall_time_s", "runs")} for r in rows]  # noqa: E731
    assert strip(a["rows"]) == strip(b["rows"])


@pytest.mark.slow
def test_client_dp_preset_plans_the_study_grid():
    cc = CompareConfig.from_yaml("bench/client_dp_study.yaml")
    runs = cc.plan()
    assert len(runs) == 2 * (1 + 3 * 3) * 4 * 3  # N × (no DP + z × conditions) × optimizers × seeds
    by = {(r.variant, r.label, r.seed): r.cfg for r in runs}
    c = by[("N=20 z=1.5 adaptive hospital", "dp2-rmsprop", 2)]
    assert (
        c.clients,
        c.samples_per_client,
        c.noise_multiplier,
        c.options.intermediaries,
        c.options.privacy_unit,
    ) == (20, 600, 1.5, "adaptive", "hospital")
    assert by[("N=6 no DP", "dp-fedavg", 0)].privacy == "off"
    assert by[("N=6 z=0.5 none", "dp-fedadam", 1)].options.intermediaries == "none"


@pytest.mark.slow
def test_compare_report_shows_both_units_for_client_level_methods(tmp_path):
    cc = CompareConfig(
        methods=["dp-fedavg"],
        seeds=[0],
        out=str(tmp_path / "rep"),
        variants=[{"name": "sub", "set": {"intermediaries": "2", "privacy_unit": "subclient"}}],
        run={**TINY, "partition": "iid", "proxy_model": "mlp256", "batch_size": 16},
    )
    rep = run_compare(cc, progress=False)
    row = rep["rows"][0]
    assert row["epsilon_subclient"]["mean"] < row["epsilon_hospital"]["mean"]
    s = json.loads((tmp_path / "rep/runs/sub/dp-fedavg/seed0/summary.json").read_text())
    assert row["epsilon_hospital"]["mean"] == pytest.approx(s["privacy"]["epsilon_hospital"])
    assert "hospital /" in (tmp_path / "rep/report.md").read_text()
