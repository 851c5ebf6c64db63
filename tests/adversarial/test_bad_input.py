"""Bad input on the command line (issue 25, item 8): each case is one line on stderr, exit code 2, no
traceback, and nothing written or changed — the test folder is the same, file for file, before and after. The
first eleven are the cases the issue found; the rest were found scanning numeric flags at their extremes,
wrong types and unusable paths. Two runs started at once into one ``--out`` are refused by a lock (two real
processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from silofl.cli.main import app

RUN = ["run", "--method", "fedavg", "--dataset", "digits", "--clients", "2", "--rounds", "1"]
LAUNCH_AUDIT = ["launch", "--nproc-per-node", "2", "audit", *RUN[1:]]
RO = "/proc/silofl-bad-input/run"  # a read-only place even for root


def _files(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) if p.is_file() else (-1, 0)
        for p in sorted(root.rglob("*"))
    }


def _setup(t: Path) -> None:
    (t / "afile").write_text("a file, not a folder\n")
    (t / "binary.yaml").write_bytes(bytes(range(256)) * 4)
    site = t / "site"  # a site.json edited by hand: a number as a string, a model name as a number
    site.mkdir()
    (site / "site.json").write_text(
        json.dumps(
            {
                "format": 1,
                "name": "hospital-a",
                "data": "data.csv",
                "lifetime_epsilon": "eight",
                "lifetime_delta": 1e-5,
                "private_model": 5,
            }
        )
    )
    (t / "card.json").write_text(json.dumps({"name": "hospital-a", "seal": "00", "sign": "00", "node": "x"}))
    from silofl.pubsub.broker import Broker

    Broker(t / "broker")  # a broker the subscriber never opened a channel on
    (t / "s.csv").write_text("x1,x2,y\n" + "".join(f"{i % 7},{i % 5},{i % 2}\n" for i in range(40)))
    (t / "schema.yaml").write_text(
        "target: {name: y, levels: ['0', '1']}\nfeatures:\n"
        "  x1: {type: numeric, bounds: [0, 10]}\n  x2: {type: numeric, bounds: [0, 10]}\n"
    )


CASES = {  # name: (arguments, {t} = the test folder; what the one line says)
    # the cases
    "noise-multiplier-1e308": (
        [*RUN, "--noise-multiplier", "1e308", "--out", "{t}/o"],
        "--noise-multiplier must be a number of magnitude at most 3.4e+38",
    ),
    "lr-1e300": ([*RUN, "--lr", "1e300", "--out", "{t}/o"], "--lr must be a number of magnitude at most"),
    "binary-config": (["run", "--config", "{t}/binary.yaml", "--out", "{t}/o"], "is not a text file"),
    "out-under-a-file": ([*RUN, "--out", "{t}/afile/run"], "lies under {t}/afile, which is a file"),
    "out-read-only": ([*RUN, "--out", RO], f"cannot make --out {RO}"),
    "site-json-wrong-types": (
        ["site", "pin", "{t}/site", "{t}/card.json"],
        "lifetime_epsilon must be float, got 'eight'",
    ),
    "peer-timeout-negative": (
        [*RUN, "--peer-timeout", "-1", "--out", "{t}/o"],
        "--peer-timeout must be a finite positive number of seconds",
    ),
    "customize-without-channel": (
        [
            "pubsub",
            "customize",
            "--broker",
            "{t}/broker",
            "--site",
            "s",
            "--data",
            "{t}/s.csv",
            "--target",
            "y",
            "--out",
            "{t}/cust",
        ],
        "s has no channel on this broker",
    ),
    "out-empty": ([*RUN, "--out", ""], "--out is empty"),
    "list-mistyped-broker": (["pubsub", "list", "--broker", "{t}/brokr"], "no broker in {t}/brokr"),
    # found scanning
    "lr-1e300-in-set": ([*RUN, "--set", "lr=1e300", "--out", "{t}/o"], "option 'lr' must be a finite number"),
    "clip-beyond-float32": (
        [*RUN, "--clip", "1e39", "--out", "{t}/o"],
        "option 'clip' must be a finite number",
    ),
    "rounds-1e20": (
        [*RUN, "--rounds", "100000000000000000000", "--out", "{t}/o"],
        "option 'rounds' must be an integer of magnitude at most",
    ),
    "noise-multiplier-nan": (
        [*RUN, "--noise-multiplier", "nan", "--out", "{t}/o"],
        "--noise-multiplier must be a number",
    ),
    "deploy-timeout-negative": (
        [
            "deploy",
            "local",
            "--sites",
            "2",
            "--timeout",
            "-5",
            "--method",
            "fedavg",
            "--dataset",
            "digits",
            "--out",
            "{t}/o",
        ],
        "--timeout must be a finite positive number of seconds",
    ),
    "certs-days-negative": (
        ["deploy", "certs", "{t}/coord", "--host", "x", "--days", "-1"],
        "--days must lie in",
    ),
    "site-lifetime-infinite": (
        [
            "site",
            "init",
            "{t}/site-b",
            "--name",
            "hospital-b",
            "--data",
            "{t}/s.csv",
            "--schema",
            "{t}/schema.yaml",
            "--lifetime-epsilon",
            "inf",
        ],
        "the lifetime budget needs 0 < ε < ∞",
    ),
    "publish-delta-5": (
        [
            "pubsub",
            "publish",
            "--broker",
            "{t}/b2",
            "--site",
            "a",
            "--data",
            "{t}/s.csv",
            "--schema",
            "{t}/schema.yaml",
            "--epsilon",
            "1",
            "--delta",
            "5",
            "--lifetime-epsilon",
            "3",
            "--site-dir",
            "{t}/sa",
        ],
        "a DP model needs 0 < ε < ∞ and 0 < δ < 1",
    ),
    "customize-out-under-a-file": (
        [
            "pubsub",
            "customize",
            "--broker",
            "{t}/broker",
            "--site",
            "s",
            "--data",
            "{t}/s.csv",
            "--target",
            "y",
            "--out",
            "{t}/afile/c",
        ],
        "which is a file",
    ),
    # silofl launch checks the launched command's options before it starts any process (no torchrun report)
    "launch-more-processes-than-clients": (
        ["launch", "--nproc-per-node", "2", *RUN[1:-2], "--clients", "1", "--out", "{t}/o"],
        "2 processes for 1 clients: use at most one process per client",
    ),
    "launch-audit-input-canaries": (
        [*LAUNCH_AUDIT, "--canary-kind", "mislabelled", "--out", "{t}/o"],
        "over torch.distributed, silofl audit takes white-box gradient canaries",
    ),
    "launch-audit-site-off-process-0": (
        [*LAUNCH_AUDIT, "--canary-kind", "dirac", "--audited-site", "1", "--out", "{t}/o"],
        "--audited-site 1 runs on process 1 of 2",
    ),
    "audit-unknown-engine": (
        ["audit", *RUN[1:], "--canary-kind", "dirac", "--engine", "nope", "--out", "{t}/o"],
        "silofl audit runs on the engines simulator, flower-local",
    ),
}


@pytest.mark.slow  # ~10 s for the 23 cases (a fresh folder, broker and CLI call each)
@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(name, tmp_path, monkeypatch):
    monkeypatch.setenv("SILOFL_RUN_KEY", "00" * 32)  # silofl launch would put a fresh one in this process
    args, message = CASES[name]
    _setup(tmp_path)
    before = _files(tmp_path)
    t = str(tmp_path)
    res = CliRunner().invoke(app, [a.replace("{t}", t) for a in args])
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    assert "Traceback" not in res.output and (res.exception is None or isinstance(res.exception, SystemExit))
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert message.replace("{t}", t) in lines[0]
    assert _files(tmp_path) == before  # nothing written, nothing changed
    assert not Path(RO).parent.exists()


def _start_run(out: Path, rounds: int) -> subprocess.Popen:
    env = {**os.environ, "SILOFL_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "silofl.cli.main",
            *RUN[:-2],
            "--rounds",
            str(rounds),
            "--threads",
            "1",
            "--samples-per-client",
            "60",
            "--batch-size",
            "20",
            "--delta",
            "1e-3",
            "--test-limit",
            "50",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_runs_into_one_out_the_second_is_refused_by_the_lock_and_a_crash_releases_it(tmp_path):
    """Two real processes into one --out: the second, started while the first holds OUT/.lock, exits 2 in one
    line and writes nothing; the first finishes a complete run. A run killed (SIGKILL) mid-way leaves its lock
    file, which the kernel released: the next run takes the folder (here: refused only because a run's files
    are there)."""
    out = tmp_path / "o"
    first = _start_run(out, 40)
    try:
        deadline = time.monotonic() + 120
        while not (out / ".lock").exists():  # the first holds the lock
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.05)
        second = _start_run(out, 1)
        _, err = second.communicate(timeout=120)
        assert first.poll() is None, "the first run ended before the second was checked: lengthen it"
        assert second.returncode == 2 and "Traceback" not in err, err
        assert [ln for ln in err.splitlines() if ln.strip()] == [
            f"error: --out {out} is being written by another run (process {first.pid}); wait for it to "
            f"finish or "
            "choose another folder"
        ]
        o, e = first.communicate(timeout=300)
        assert first.returncode == 0, e[-2000:]
    finally:
        if first.poll() is None:
            first.kill()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds_run"] == 40 and not (out / ".lock").exists()
    crashed = tmp_path / "c"
    p = _start_run(crashed, 1000)
    deadline = time.monotonic() + 120
    while not (crashed / "metrics.jsonl").exists():
        assert p.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    p.kill()
    p.wait()
    assert (crashed / ".lock").exists()  # left behind by the killed run, but no longer locked
    again = _start_run(crashed, 1)
    _, err = again.communicate(timeout=120)
    assert again.returncode == 2 and "already holds a run" in err and "another run" not in err, err
