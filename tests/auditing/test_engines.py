"""The gradient-canary audit on every engine (silofl.auditing.gradient): over torch.distributed
(`silofl launch … audit`) and on a local Flower deployment (`silofl audit --engine flower-local`, where the
audited site arms and observes itself) it measures what the simulator's audit measures, bit for bit when
seeded; what cannot run there is refused before any process starts; a deployed site's audit spec and evidence
are read checked."""

import json

import numpy as np
import pytest

from silofl.auditing import gradient
from silofl.auditing.settings import AuditSettings
from silofl.core.errors import ConfigError
from tests.auditing.test_gradient import DIGITS

ENGINE_RUN = dict(
    DIGITS,
    method="proxyfl",
    private_model="cnn1",
    proxy_model="mlp",
    rounds=2,
    noise_multiplier=1.0,
    threads=1,
)  # the engine tests' audited run
ENGINE_AUDIT = dict(canaries=100, canary_kind="dirac", seed=5, reference_models=0)  # the engine tests' audit


@pytest.mark.slow
@pytest.mark.multiprocess
def test_torchdist_audit_sees_what_the_simulator_sees(tmp_path):
    """`silofl launch --nproc-per-node 2 audit …`: site 0 and the observer on process 0, site 1 (and 2) served
    by process 1; the same observer records, scores, bound and accountant ε as the simulator's audit."""
    from silofl.auditing import run_audit
    from silofl.runner.config import RunConfig
    from tests.helpers import silofl_cli

    run, settings = ENGINE_RUN, ENGINE_AUDIT
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in {**run, **settings}.items()]
    out = str(tmp_path / "dist")
    res = silofl_cli(
        "launch", "--nproc-per-node", "2", "audit", *flags, "--peer-timeout=60", "--quiet", "--out", out
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "empirical ε lower bound" in res.stdout and "Traceback" not in res.stderr
    sim = run_audit(RunConfig.from_dict(run), AuditSettings(**settings), tmp_path / "sim")
    dist = json.loads((tmp_path / "dist" / "audit.json").read_text())
    assert (dist["engine"]["name"], dist["engine"]["processes"]) == ("torch.distributed (audited)", 2)
    assert sim["engine"]["name"] == "simulator (audited)"
    assert dist["observer_records"] == sim["observer_records"] and len(sim["observer_records"]) == 2
    scores = [(tmp_path / d / "canary_scores.csv").read_text() for d in ("dist", "sim")]
    assert scores[0] == scores[1] and scores[0].count("\n") == 101
    assert dist["command"].startswith("silofl launch --nproc-per-node 2 audit --dataset=digits")
    assert dist["epsilon_lower_bound"] == sim["epsilon_lower_bound"]
    assert dist["epsilon_accountant"] == sim["epsilon_accountant"]


@pytest.mark.slow
def test_flower_deployment_audit_is_the_simulators(tmp_path):
    """`silofl audit --engine flower-local`: every site its own process behind a SuperLink, payloads sealed
    between sites; the audited site arms and observes itself from the spec in its folder. Seeded, its canary
    scores, observer records, bounds and accountant ε are the simulator's, bit for bit."""
    from silofl.auditing import run_audit
    from silofl.runner.config import RunConfig

    settings = ENGINE_AUDIT
    cfg = RunConfig.from_dict(dict(ENGINE_RUN, clients=2))
    fl = run_audit(cfg, AuditSettings(**settings), tmp_path / "fl", engine="flower-local")
    sim = run_audit(cfg, AuditSettings(**settings), tmp_path / "sim")
    assert fl["engine"]["name"] == "flower" and fl["engine"]["sealed"] and fl["engine"]["tls"]
    assert fl["observer_records"] == sim["observer_records"] and len(sim["observer_records"]) == 2
    assert fl["canaries"]["releases_scored"] == 2 and fl["canaries"]["placement"] == "quiet"
    scores = [(tmp_path / d / "canary_scores.csv").read_text() for d in ("fl", "sim")]
    assert scores[0] == scores[1] and scores[0].count("\n") == 101
    assert fl["bounds"] == sim["bounds"] and fl["epsilon_accountant"] == sim["epsilon_accountant"]
    assert fl["guarantee_note"] == sim["guarantee_note"] and "seeded research run" in fl["guarantee_note"]
    site0 = tmp_path / "fl" / "run" / "deployment" / "sites"
    evidence = sorted(site0.glob("*/audit/evidence.json"))
    assert len(evidence) == 1 and len(sorted(site0.glob("*/audit/spec.json"))) == 1  # site 0 only


def test_a_site_audit_spec_is_checked(tmp_path):
    """The spec a deployed site arms itself from is read bounded and checked: one line, nothing armed."""
    good = {"m": 3, "kind": "dirac", "seed": 1, "method": "proxyfl", "included": [True, False, True]}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(good))
    assert gradient.read_spec(path)["included"].tolist() == [True, False, True]
    for bad, why in (
        ({**good, "m": 0}, "m must be a positive"),
        ({**good, "kind": "mislabelled"}, "kind must be one of"),
        ({**good, "seed": -1}, "seed must be"),
        ({**good, "included": [True, 1, False]}, "one true/false coin per canary"),
        ({**good, "included": [True]}, "one true/false coin per canary"),
        ({k: v for k, v in good.items() if k != "seed"}, "not an audit spec"),
    ):
        path.write_text(json.dumps(bad))
        with pytest.raises(ConfigError, match=why):
            gradient.read_spec(path)
    path.write_text("[1, 2")
    with pytest.raises(ConfigError, match="not an audit spec"):
        gradient.read_spec(path)


def test_evidence_read_back_from_a_site_is_checked():
    """The evidence a deployed site wrote goes through JSON unchanged; one of another shape is refused."""
    ev = gradient.Evidence(
        step_scores=np.array([0.5, -1.25]),
        release_scores=np.array([2.0, 0.0]),
        records=[{"round": 1, "released": True, "delta_norm": 0.1, "score_sum": 2.0}],
        releases=1,
        trained=1,
        steps=4,
        q=0.25,
        sampled=np.array([1, 0]),
        m=2,
        d=10,
        pool=(0, 8),
        placement="quiet",
        activity=1e-9,
        private=True,
        sigma=1.0,
        epsilon=3.5,
        n=40,
    )
    back = gradient.Evidence.from_json(json.loads(json.dumps(ev.to_json())))
    assert back.to_json() == ev.to_json() and back.pool == (0, 8)
    with pytest.raises(ConfigError, match="one score per canary"):
        gradient.Evidence.from_json({**ev.to_json(), "step_scores": [1.0]})
    with pytest.raises(ConfigError, match="not what silofl writes"):
        gradient.Evidence.from_json({**ev.to_json(), "extra": 1})
    with pytest.raises(ConfigError, match="malformed"):
        gradient.Evidence.from_json({**ev.to_json(), "m": "two"})


def test_torchdist_audit_refuses_what_it_cannot_audit(tmp_path):
    """Before any process waits for another: input-space canaries, and an audited site off process 0."""
    from silofl.auditing import check_engine
    from silofl.runner.config import RunConfig

    cfg = RunConfig.from_dict(dict(DIGITS, method="proxyfl", rounds=1))
    with pytest.raises(ConfigError, match="white-box gradient canaries"):
        check_engine(cfg, AuditSettings(canary_kind="mislabelled"))
    with pytest.raises(ConfigError, match="runs on process 1 of 2"):
        check_engine(cfg, AuditSettings(canary_kind="dirac", site=1), processes=2)
    check_engine(cfg, AuditSettings(canary_kind="dirac", site=2), processes=2)
    client = RunConfig.from_dict({**{k: v for k, v in DIGITS.items() if k != "lr"}, "method": "dp-fedavg"})
    with pytest.raises(ConfigError, match="example-level methods"):
        check_engine(client, AuditSettings(canary_kind="dirac"))
    # silofl audit --engine flower-local: the same refusals, before anything is written
    from silofl.auditing import run_audit

    with pytest.raises(
        ConfigError, match="over flower-local, silofl audit takes white-box gradient canaries"
    ):
        run_audit(cfg, AuditSettings(canary_kind="mislabelled"), tmp_path / "a", engine="flower-local")
    with pytest.raises(ConfigError, match="runs on the engines simulator, flower-local"):
        run_audit(cfg, AuditSettings(canary_kind="dirac"), tmp_path / "a", engine="torch.distributed")
    assert not (tmp_path / "a").exists()
