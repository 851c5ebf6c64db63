"""``silofl deploy local``: a real Flower deployment on loopback (a SuperLink and one SuperNode per site as
separate processes, TLS, SuperNode authentication, sealed payloads) gives the simulator's numbers.

The slow tests' deployments run side by side (the ``started`` fixture starts them all when the first is
needed; each test waits for its own): a Flower deployment spends most of its time waiting on its own
processes."""

import json
import os
import re
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

BASE = [
    "--dataset",
    "digits",
    "--rounds",
    "2",
    "--samples-per-client",
    "120",
    "--batch-size",
    "30",
    "--delta",
    "1e-3",
    "--test-limit",
    "200",
    "--threads",
    "1",
    "--seed",
    "0",
    "--eval-every",
    "2",
]
CASES = {
    "proxyfl": ["--private-model", "cnn1", "--proxy-model", "mlp"],
    "fedavg": ["--proxy-model", "mlp"],
    "cwt": ["--proxy-model", "mlp"],
    "dp-fedavg": ["--intermediaries", "adaptive", "--noise-multiplier", "1.0", "--clip", "1.0"],
}

# FedAvg deployed is checked with secure aggregation on (tests/secure/test_deploy.py, with these checks too):
# one deployment of FedAvg for both; plain server averaging deployed is dp-fedavg's case here
DEPLOYED = [m for m in CASES if m != "fedavg"]


ENV = {**os.environ, "SILOFL_NO_PROGRESS": "1", "COLUMNS": "200"}
PARALLEL = 2  # deployments run at once beside the rejoin test's (each ~10 processes, ~2 GB; CPU is the limit)


def silofl(*args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "silofl.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
    )


def deploy_and_simulate(method, root):
    """``silofl deploy local`` and ``silofl run`` of ``method`` with the same arguments, side by side (the
    simulator works while the deployment's processes wait on each other); (the deployment's, the simulator's)
    completed processes."""
    args = ["--method", method, *BASE, *CASES[method]]
    cmd = [sys.executable, "-m", "silofl.cli.main"]
    dep = subprocess.Popen(
        [*cmd, "deploy", "local", "--sites", "3", *args, "--out", str(root / "d"), "--timeout", "600"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        sim = subprocess.run(
            [*cmd, "run", "--clients", "3", *args, "--out", str(root / "s")],
            capture_output=True,
            text=True,
            timeout=600,
            env=ENV,
        )
        out, err = dep.communicate(timeout=900)
    finally:
        if dep.poll() is None:  # a failed wait: on SIGINT deploy local stops its SuperLink and sites
            dep.send_signal(signal.SIGINT)
            try:
                dep.wait(60)
            except subprocess.TimeoutExpired:
                dep.kill()
    return subprocess.CompletedProcess(dep.args, dep.returncode, out, err), sim


def finals(path):
    s = json.loads((path / "summary.json").read_text())
    keys = [
        k for k in ("proxy_acc", "private_acc", "model_acc", "global_acc") if k in s["final"]["per_client"][0]
    ]
    return s, [(r["client"], *(r[k] for k in keys), r["epsilon"]) for r in s["final"]["per_client"]]


def site_dies_and_rejoins(tmp_path):
    """The job of test_a_site_that_dies_is_lost_and_rejoins_from_its_checkpoint_with_its_spend (its checks
    included)."""
    # The killed worker's SuperNode gets SIGTERM (it dies with its worker) and usually leaves the SuperLink,
    # so the restarted one connects at once. When its goodbye does not get through, the SuperLink holds the
    # dead node (up to two 30 s heartbeats) and the restarted one retries: --peer-timeout 60 then retires the
    # site by the time its node is free. Either way it is retired before round 4 and back once its restarted
    # process has loaded and connected (seconds); a round takes about half a second here, so 40 rounds leave
    # it 15-20 s to come back.
    rounds = 40
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "silofl.cli.main",
            "deploy",
            "local",
            "--sites",
            "3",
            "--method",
            "fedavg",
            *BASE,
            "--rounds",
            str(rounds),
            "--eval-every",
            str(rounds),
            *CASES["fedavg"],
            "--checkpoint-every",
            "2",
            "--peer-timeout",
            "60",
            "--restart-sites",
            "--out",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
        timeout=1500,
        env={**ENV, "SILOFL_INJECT_FAULT": "2:3:crash"},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert [x["client"] for x in s["left"]] == [2] and "lost" in s["left"][0]["reason"]  # the others went on
    assert [x["client"] for x in s["rejoined"]] == [2] and s["rejoined"][0]["round"] > s["left"][0]["round"]
    recs = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    site2 = {x["round"]: x["epsilon"] for x in recs if x["client"] == 2}
    lost_at, back_at = s["left"][0]["round"], s["rejoined"][0]["round"]
    assert (
        lost_at not in site2 and rounds in site2 and site2[rounds] > site2[min(site2)]
    )  # back to the end, spending on
    # it trained rounds 1–2 and back_at–10 (checkpoint of round 2): its accountant counts exactly those rounds
    acc = next(a for a in s["accounting"] if a["client"] == 2)
    assert acc["steps"] == 4 * (2 + rounds - back_at + 1)  # 120 examples, batch 30: 4 steps a round
    ledger = tmp_path / "r" / "deployment" / "sites" / "site2" / "ledger"
    assert ledger.is_dir()


@pytest.fixture(scope="module")
def started(request, tmp_path_factory):
    """The deployments of this module's selected slow tests, started together when the first is needed (each
    test then waits for its own and checks it): test name -> future. The rejoin test's long run goes first on
    its own, the others PARALLEL at a time in the order of the tests (a deployment's processes wait on each
    other between steps, so two share the machine's cores well). Each is its own: its SuperLink, fresh site
    folders (their ledgers start empty, so their ε is the simulator's)."""
    jobs = {
        f"test_deploy_local_gives_the_simulators_numbers[{m}]": (
            lambda t, m=m: (*deploy_and_simulate(m, t), t)
        )
        for m in DEPLOYED
    }
    names = [
        item.name for item in request.session.items if item.name in jobs and item.module is request.module
    ]
    futures = {}
    with ThreadPoolExecutor(1) as long_run, ThreadPoolExecutor(PARALLEL) as pool:
        rejoin = "test_a_site_that_dies_is_lost_and_rejoins_from_its_checkpoint_with_its_spend"
        if any(item.name == rejoin and item.module is request.module for item in request.session.items):
            futures[rejoin] = long_run.submit(site_dies_and_rejoins, tmp_path_factory.mktemp("rejoin"))
        for name in names:
            futures[name] = pool.submit(jobs[name], tmp_path_factory.mktemp(re.sub(r"\W+", "_", name)[-30:]))
        yield futures


@pytest.mark.slow
@pytest.mark.parametrize("method", DEPLOYED)
@pytest.mark.deploy
@pytest.mark.multiprocess
def test_deploy_local_gives_the_simulators_numbers(method, request, started):
    dep, sim, tmp_path = started[request.node.name].result()
    assert dep.returncode == 0, dep.stdout[-3000:] + dep.stderr[-3000:]
    assert sim.returncode == 0, sim.stderr[-2000:]
    deployed_as_simulated(tmp_path)


def deployed_as_simulated(tmp_path):
    """The checks of a deployment (``tmp_path / "d"``) against its simulator twin (``tmp_path / "s"``): the
    same finals; TLS, node authentication, sealed payloads; each site's ledger and seal key in its own
    folder."""
    d, got = finals(tmp_path / "d")
    _, want = finals(tmp_path / "s")
    assert got == want
    e = d["engine"]
    assert e["name"] == "flower" and e["tls"] and e["node_auth"] and e["sealed"] and not e["insecure_flag"]
    assert d["processes"] == 4 and d["data_source"].startswith("each site's own data")
    for k in range(3):  # each site kept its ledger, checkpoints and models in its own folder
        site = tmp_path / "d" / "deployment" / "sites" / f"site{k}"
        assert (site / "ledger").is_dir() and (site / "keys" / "seal.key").stat().st_mode & 0o077 == 0


@pytest.mark.slow  # whole runs (fast tier ≤ 60 s)
@pytest.mark.deploy
@pytest.mark.multiprocess
def test_deploy_local_refuses_a_method_that_pools_data_in_one_line(tmp_path):
    r = silofl(
        "deploy",
        "local",
        "--sites",
        "2",
        "--method",
        "joint",
        "--dataset",
        "digits",
        "--out",
        str(tmp_path / "j"),
    )
    assert r.returncode == 2 and "Joint pools" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "j").exists()


@pytest.mark.slow
@pytest.mark.deploy
@pytest.mark.multiprocess
def test_a_site_that_dies_is_lost_and_rejoins_from_its_checkpoint_with_its_spend(request, started):
    """Site 2 is killed (SIGKILL) as round 3 starts: the coordinator loses it and goes on with the others; its
    operator restarts it (--restart-sites) and it rejoins from its own checkpoint, its ledger's spend intact
    (site_dies_and_rejoins, started with the module's other deployments)."""
    started[request.node.name].result()
