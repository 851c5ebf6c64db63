"""Faults across processes: a killed or hung process is dropped and the others finish and report; a
torchrun restart resumes every process from its checkpoint with the privacy spend intact; the
PushSum mass sent to a lost node goes back to its sender."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from opacus.accountants import RDPAccountant

from silofl.privacy.ledger import Ledger
from silofl.runner.checkpoint import saved_rounds
from silofl.runner.config import RunConfig
from silofl.runner.loop import run as simulate
from tests.comm.test_torchdist import same  # equal, AUROC and ECE to floating point
from tests.helpers import build_run

ARGS = {
    "dataset": "digits",
    "clients": 4,
    "samples_per_client": 120,
    "batch_size": 30,
    "delta": 1e-3,
    "private_model": "cnn1",
    "proxy_model": "mlp",
    "test_limit": 200,
    "eval_every": 1,
    "threads": 1,
    "seed": 4,
}


def launch(method: str, out, rounds: int, fault: str | None, *extra: str) -> subprocess.CompletedProcess:
    from silofl.fl.registry import method_info

    own = set(method_info(method).options.field_names()) | set(RunConfig.common_fields())
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in ARGS.items() if k in own]
    cmd = [
        sys.executable,
        "-m",
        "silofl.cli.main",
        "launch",
        "--nproc-per-node",
        "4",
        *extra,
        "--method",
        method,
        *flags,
        "--rounds",
        str(rounds),
        "--out",
        str(out),
        "--quiet",
    ]
    env = {**os.environ, "SILOFL_INJECT_FAULT": fault} if fault else dict(os.environ)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def without_epsilon(r: dict) -> dict:
    return {k: v for k, v in r.items() if k != "epsilon"}


def records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_killed_process_is_dropped_and_the_other_three_finish(tmp_path):
    # process 2 is killed (SIGKILL) mid-round 3, after it trained and sent, when it starts receiving
    res = launch(
        "proxyfl",
        tmp_path / "run",
        5,
        "2:3:crash-receiving",
        "--survive-faults",
        "--grace-s",
        "5",
        "--peer-timeout",
        "60",
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    s = json.loads((tmp_path / "run/summary.json").read_text())
    assert s["rounds_run"] == 5 and s["processes"] == 4
    assert [r["client"] for r in s["final"]["per_client"]] == [0, 1, 3]
    assert all(r["round"] == 5 for r in s["final"]["per_client"])
    assert list(s["lost_processes"]) == ["2"] and "connection closed" in s["lost_processes"]["2"]
    (left,) = s["left"]
    # round 3's deliveries (and evaluation) ride with the site's round-4 message: it dies there, and is
    # dropped in round 4 or retired as round 5 starts
    assert left["client"] == 2 and left["round"] in (4, 5) and left["reason"].startswith("process lost")
    last = [r for r in records(tmp_path / "run") if r["round"] == 5]
    assert [r["client"] for r in last] == [0, 1, 3]
    assert all(r["pushsum_weight"] > 0 and r["epsilon"] == last[0]["epsilon"] for r in last)
    assert "process 2 was killed by SIGKILL" in res.stderr


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_hung_process_is_dropped_after_the_timeout_and_killed_at_the_end(tmp_path):
    # process 3 stops (SIGSTOP) at the start of round 2: it neither answers nor closes its connections
    res = launch(
        "fedavg", tmp_path / "run", 4, "3:2:hang", "--survive-faults", "--grace-s", "2", "--peer-timeout", "4"
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    s = json.loads((tmp_path / "run/summary.json").read_text())
    assert s["rounds_run"] == 4 and [r["client"] for r in s["final"]["per_client"]] == [0, 1, 2]
    # lost while the others trained round 2 (the server averaged without it), retired before round 3
    assert s["left"] == [
        {"client": 3, "round": 3, "reason": "process lost: waiting for process 3: no answer within 4 s"}
    ]
    assert s["final"]["global_acc"]["std"] == 0.0  # the three live clients hold the same averaged model
    assert "process 3 still ran" in res.stderr and "was killed" in res.stderr


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_torchrun_restart_resumes_every_process_from_its_checkpoint(tmp_path):
    """Process 2 crashes at the start of round 3; torchrun stops the group and starts it again, every process
    resumes from round 2, and the run ends with the models and figures of an uninterrupted one. The privacy
    spend is the one exception: DP-SGD steps a process ran in the round that was cut short still count (they
    ran, and their proxy may have left), so each ε is at least the uninterrupted run's and is exactly what the
    site's ledger holds."""
    sim = simulate(
        RunConfig.from_dict({**ARGS, "method": "proxyfl", "rounds": 4, "out": str(tmp_path / "sim")}),
        progress=False,
    )
    res = launch(
        "proxyfl",
        tmp_path / "run",
        4,
        "2:3:crash",
        "--max-restarts",
        "1",
        "--checkpoint-every",
        "1",
        "--peer-timeout",
        "60",
        "--report-nonprivate",
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "injected crash" in res.stderr
    s = json.loads((tmp_path / "run/summary.json").read_text())
    run_recs, sim_recs = records(tmp_path / "run"), records(tmp_path / "sim")
    assert same([without_epsilon(r) for r in run_recs], [without_epsilon(r) for r in sim_recs])
    assert all(a["epsilon"] >= b["epsilon"] for a, b in zip(run_recs, sim_recs, strict=True))
    assert same(
        [without_epsilon(r) for r in s["final"]["per_client"]],
        [without_epsilon(r) for r in sim["final"]["per_client"]],
    )  # AUROC/ECE to floating point (see same)
    assert s["left"] == []
    for k, (acc, acc_sim) in enumerate(zip(s["accounting"], sim["accounting"], strict=True)):
        hist = Ledger(tmp_path / "run" / "sites" / f"client{k}").history()
        assert acc["steps"] == sum(n for _, _, n in hist) >= acc_sim["steps"]
        reference = RDPAccountant()  # recomputed independently from the ledger
        reference.history = [tuple(h) for h in hist]
        assert reference.get_epsilon(acc["delta"]) == pytest.approx(acc["epsilon"], rel=1e-9)
    assert saved_rounds(tmp_path / "run/checkpoint") == [3, 4]  # every process keeps its last two


@pytest.mark.slow
def test_resuming_from_an_older_common_round_never_rolls_the_privacy_spend_back(tiny_cfg, tmp_path):
    cfg = tiny_cfg.replace(rounds=3, checkpoint_every=1, out=str(tmp_path / "c"))
    root = tmp_path / "c" / "checkpoint"
    simulate(cfg.replace(rounds=2), progress=False)
    shutil.copytree(root / "round2", tmp_path / "round2")
    simulate(cfg, progress=False, resume=True)  # the ledgers now hold round 3's steps too
    # the sites saved rounds 2 and 3, but the coordinator did not complete round 3 (no run.json)
    shutil.copytree(tmp_path / "round2", root / "round2")
    (root / "round3" / "run.json").unlink()
    assert saved_rounds(root) == [2]
    s = simulate(cfg.replace(rounds=4, out=str(tmp_path / "c")), progress=False, resume=True)
    assert s["rounds_run"] == 4
    # every site resumed from round 2 but kept the spend of round 3: rounds 3 and 4 are counted again
    assert [a["steps"] for a in s["accounting"]] == [5 * 4] * 4
    assert [r["round"] for r in s["final"]["per_client"]] == [4] * 4


def test_pushsum_mass_sent_to_a_lost_node_goes_back_to_its_sender(tiny_cfg):
    c = build_run(tiny_cfg.replace(method="proxyfl", clients=3)).sites[0]
    sent = c.shared_state()
    c.outgoing(1, [2])  # all of its weight (self weight 0) goes to node 2, which is then lost
    with torch.no_grad():
        for p in c.shared.parameters():
            p.add_(1.0)  # what it received from another node in that round
    c.pushsum_weight = 0.5
    now = c.shared_state()
    c.reclaim({1}, 2)  # node 1 is not where it sent: nothing to take back
    assert c.pushsum_weight == 0.5
    c.reclaim({2}, 2)
    assert c.pushsum_weight == pytest.approx(1.5)
    for k, v in c.shared_state().items():
        if v.is_floating_point():
            torch.testing.assert_close(
                v, ((0.5 * now[k].double() + 1.0 * sent[k].double()) / 1.5).to(v.dtype)
            )
    c.reclaim({2}, 3)  # taken back once only
    assert c.pushsum_weight == pytest.approx(1.5)
