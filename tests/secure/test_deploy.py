"""``silofl deploy local --secure-aggregation`` (client-level DP-FedAvg, and FedAvg with its noise pooled): a
real Flower deployment (SuperLink, one SuperNode per site, sealed payloads, each site's relayed
key-agreement key signed with its pinned identity and checked by the others) runs the secure aggregation
steps and gives the simulator's figures exactly (the masks cancel exactly; the sites' noise, rounding and
the rotation seeds are seeded in both)."""

import json

import pytest

from tests.deploy import test_deploy_local as deploy

CASES = {
    "dp-fedavg": ["--secure-aggregation", "--noise-multiplier", "1.0"],
    # pooled noise (issue 44): each site adds a share, the decoded sum carries one pooled DP-GD step's noise
    "fedavg": [
        "--proxy-model",
        "mlp",
        "--secure-aggregation",
        "--noise-placement",
        "pooled",
        "--optimizer",
        "sgd",
        "--sample-rate",
        "1",
    ],
}


@pytest.mark.slow
@pytest.mark.deploy
@pytest.mark.parametrize("method", sorted(CASES))
def test_deploy_local_with_secure_aggregation_equals_the_simulator(tmp_path, monkeypatch, method):
    monkeypatch.setitem(deploy.CASES, method, CASES[method])
    dep, sim = deploy.deploy_and_simulate(method, tmp_path)
    assert sim.returncode == 0, sim.stderr[-3000:]
    assert dep.returncode == 0, dep.stderr[-3000:]
    runs = {k: json.loads((tmp_path / k / "summary.json").read_text()) for k in ("d", "s")}
    assert runs["d"]["engine"]["name"] == "flower"
    for s in runs.values():
        assert s["privacy"]["secure_aggregation"] is True and s["privacy"]["rounds_released"] == 2
    rows = {
        k: [(r["client"], r["global_acc"], r["epsilon"]) for r in s["final"]["per_client"]]
        for k, s in runs.items()
    }
    assert rows["d"] == rows["s"]
    assert runs["d"]["privacy"]["epsilon_vs_server"] == runs["s"]["privacy"]["epsilon_vs_server"]
    assert "secure aggregation: on" in dep.stdout
    deploy.deployed_as_simulated(tmp_path)  # the checks of every deployment (test_deploy_local: FedAvg's)
    assert "ε against the server" in dep.stdout  # client-level, and pooled: the server sees one noised sum
    if method == "fedavg":
        assert runs["d"]["privacy"]["noise_placement"].startswith("pooled")


SAMPLED = [
    "--secure-aggregation",
    "--noise-multiplier",
    "1.0",
    "--client-rate",
    "0.6",
    "--privacy-unit",
    "subclient",
    "--intermediaries",
    "2",
]


@pytest.mark.slow
@pytest.mark.deploy
def test_deploy_local_with_sampling_and_the_subclient_unit_equals_the_simulator(tmp_path, monkeypatch):
    """Client sampling (3 hospitals, rate 0.6, min_survivors 2) and the sub-client unit (2 sub-clients) with
    secure aggregation on a real Flower deployment: the simulator's figures, each hospital's ε against the
    server included (with the run's seed: round 1 samples one hospital and is skipped, round 2 two)."""
    monkeypatch.setitem(deploy.CASES, "dp-fedavg", SAMPLED)
    dep, sim = deploy.deploy_and_simulate("dp-fedavg", tmp_path)
    assert sim.returncode == 0, sim.stderr[-3000:]
    assert dep.returncode == 0, dep.stderr[-3000:]
    runs = {k: json.loads((tmp_path / k / "summary.json").read_text()) for k in ("d", "s")}
    keys = ("epsilon_vs_server", "epsilon_vs_server_per_hospital", "rounds_per_hospital", "rounds_released")
    keys += ("rounds_skipped_small_sample",)
    assert {k: runs["d"]["privacy"][k] for k in keys} == {k: runs["s"]["privacy"][k] for k in keys}
    rows = {
        k: [(r["client"], r["global_acc"], r["epsilon"]) for r in s["final"]["per_client"]]
        for k, s in runs.items()
    }
    assert rows["d"] == rows["s"]
    p = runs["s"]["privacy"]
    assert p["min_survivors"] == 2 and p["privacy_unit"] == "subclient"
    assert p["rounds_released"] == 1 and p["rounds_skipped_small_sample"] == 1
    assert sorted(p["rounds_per_hospital"].values()) == [0, 1, 1]
    assert sorted(p["epsilon_vs_server_per_hospital"].values())[0] == 0.0 < p["epsilon_vs_server"]
    assert "no amplification by sampling claimed" in dep.stdout
