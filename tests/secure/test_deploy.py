"""``silofl deploy local --secure-aggregation``: a real Flower deployment (SuperLink, one SuperNode per site,
sealed payloads, each site's relayed key-agreement key signed with its pinned identity and checked by the
others) runs the secure aggregation steps and gives the simulator's figures exactly (the masks cancel
exactly; the sites' noise, rounding and the rotation seeds are seeded in both)."""

import json

import pytest

from tests.deploy import test_deploy_local as deploy

CASES = {
    "dp-fedavg": ["--secure-aggregation", "--noise-multiplier", "1.0"],
    "fedavg": ["--proxy-model", "mlp", "--secure-aggregation"],
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
    if method == "dp-fedavg":
        assert "ε against the server" in dep.stdout
    else:
        assert "the example-level ε is unchanged" in dep.stdout
