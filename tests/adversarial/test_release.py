"""Figures computed from non-private data leave a site only if it chooses to release them (finding 3: across
processes every record went to process 0, including the non-DP private model's accuracy and un-noised
per-example gradient norms)."""

import json

import pytest

from silofl.runner.config import RunConfig
from silofl.runner.loop import run

NONPRIVATE = {
    "private_acc",
    "mean_grad_norm",
    "clipped_fraction",
    "update_norm_mean",
    "xi",
    "phi",
    "lambda",
    "cos_std",
}


def keys(path):
    return set().union(*(json.loads(line) for line in path.read_text().splitlines()))


@pytest.mark.slow
def test_a_site_that_keeps_its_nonprivate_figures_reports_only_dp_and_public_ones(tiny_cfg, tmp_path):
    s = run(tiny_cfg.replace(rounds=1, report_nonprivate=False, out=str(tmp_path / "p")), progress=False)
    sent = keys(tmp_path / "p/metrics.jsonl")
    assert "proxy_acc" in sent and "epsilon" in sent and not sent & NONPRIVATE
    kept = keys(tmp_path / "p/sites/client0/metrics.jsonl")
    assert {"private_acc", "mean_grad_norm", "clipped_fraction"} <= kept
    assert s["reporting"]["nonprivate_released"] is False and "private_acc" not in s["final"]
    cl = RunConfig.from_dict(
        dict(
            method="dp-fedavg",
            dataset="digits",
            partition="iid",
            clients=4,
            rounds=1,
            samples_per_client=160,
            batch_size=16,
            delta=1e-3,
            proxy_model="mlp256",
            test_limit=100,
            intermediaries="adaptive",
            report_nonprivate=False,
            out=str(tmp_path / "c"),
        )
    )
    s = run(cl, progress=False)
    sent = keys(tmp_path / "c/metrics.jsonl")
    assert "global_acc" in sent and "v" in sent and not sent & NONPRIVATE
    assert not set(s["server_rounds"][0]) & NONPRIVATE


def test_a_simulation_reports_everything_and_says_so(tiny_cfg, tmp_path):
    s = run(tiny_cfg.replace(rounds=1, out=str(tmp_path / "s")), progress=False)
    assert {"private_acc", "mean_grad_norm"} <= keys(tmp_path / "s/metrics.jsonl")
    assert s["reporting"]["nonprivate_released"] is True and "chose to" in s["reporting"]["note"]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_across_processes_sites_keep_nonprivate_figures_by_default(tmp_path):
    out = tmp_path / "d"
    from tests.helpers import launch_tiny

    res = launch_tiny(out)
    assert res.returncode == 0, res.stderr[-3000:]
    sent = keys(out / "metrics.jsonl")
    assert "proxy_acc" in sent and not sent & NONPRIVATE
    assert "private_acc" in keys(
        out / "sites/client1/metrics.jsonl"
    )  # written by process 1, for site 1 alone
