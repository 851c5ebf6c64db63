"""The site's own policy against a hostile coordinator (issue 41: "Downgrade to central noise", "The
coordinator picks the collusion assumption", backbones from the coordinator's config): a real ``silofl site
run`` process answers each plan its policy does not allow with one line, joins nothing, spends and uploads
nothing, and keeps its policy file as it was; the coordinator's own output names the refusal."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch

from silofl.core.errors import SiloflError
from silofl.deploy.coordinator import join
from silofl.deploy.local import free_port, make_site_folders
from silofl.deploy.site import ERROR, SETUP, SiteWorker
from silofl.fl.exchange.client_level import LEDGER_KIND, SecureFloor
from silofl.runner.data import prepare_data
from silofl.site.folder import SiteFolder
from silofl.site.policy import POLICY_FILE, SitePolicy, save_policy
from tests.adversarial.test_site_worker_fuzz import frame_of, request
from tests.deploy.test_worker import CLIENT_LEVEL, Loopback
from tests.helpers import build_run
from tests.secure.test_client_level import config as secure_config

NAMES = ["site0", "site1", "site2"]


def hospitals(tiny_cfg, tmp_path):
    """Three site folders, each with the safe default policy its hospital's `silofl site init` writes (not
    the admitting one `deploy local` writes for a user who plays every party); (config, folders, spec)."""
    cfg = tiny_cfg.replace(method="proxyfl", clients=3, rounds=2, noise_multiplier=1.0).resolve()
    cfg, split = prepare_data(cfg, torch.device("cpu"))
    cards, folders = make_site_folders(cfg, split, tmp_path / "sites")
    for f in folders:
        save_policy(SiteFolder.load(f), SitePolicy())
    spec = {
        "config": cfg.to_dict(),
        "sites": [{**c, "node_id": k} for k, c in enumerate(cards)],
        "coordinator_keys": str(tmp_path / "coordinator-keys"),
    }
    return cfg, folders, spec


def snapshot(folder):
    """The bytes of what a refusal must leave untouched: the policy and the ledger."""
    return {str(p): p.read_bytes() for p in [folder / POLICY_FILE, *sorted((folder / "ledger").iterdir())]}


def start_site(folder, log_path):
    """A real `silofl site run` (its SuperLink does not exist: the worker serves its socket regardless)."""
    log = open(log_path, "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "silofl.cli.main", "site", "run", "--site-dir", str(folder)]
        + ["--superlink", f"127.0.0.1:{free_port()}", "--insecure"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "SILOFL_NO_PROGRESS": "1"},
        start_new_session=True,
    )
    deadline, path = time.monotonic() + 60, None
    while path is None and time.monotonic() < deadline:
        m = re.search(r"serves (\S+site\.sock)", log_path.read_text(errors="replace"))
        path = m.group(1) if m else None
        assert proc.poll() is None, log_path.read_text()
        time.sleep(0.2)
    assert path, log_path.read_text()
    return proc, log, path


@pytest.mark.slow
@pytest.mark.deploy
@pytest.mark.multiprocess
def test_a_real_site_refuses_each_plan_its_policy_does_not_allow(tiny_cfg, tmp_path):
    cfg, folders, _ = hospitals(tiny_cfg, tmp_path)
    f0 = folders[0]
    (tmp_path / "there").mkdir()  # a directory that exists on the site's machine
    before = snapshot(f0)
    proc, log, path = start_site(f0, tmp_path / "site.log")
    client = dict(method="dp-fedavg", **CLIENT_LEVEL)
    attacks = {
        # the downgrade: client-level DP without secure aggregation uploads un-noised sums to the coordinator
        "downgrade": (client, "does not trust a server's noise"),
        # the collusion assumption: a coordinator-chosen minimum survivors below the site's own floor
        "survivors": ({**client, "secure_aggregation": True, "secagg_min_survivors": 2}, "below this site's"),
        "no-dp": ({"privacy": "off"}, "--allow-placement none"),
        "seeded": ({"seed": 0}, "--allow-research-seed"),
        "backbone-there": ({"features": f"backbone:{tmp_path / 'there'}"}, "never opened"),
        "backbone-absent": ({"features": f"backbone:{tmp_path / 'absent'}"}, "never opened"),
        "backbone-name": ({"features": "backbone:resnet"}, "not registered"),
        "policy-by-message": ({}, "unknown config option"),
    }
    widen = {"policy-by-message": {"trust_server_noise": True, "colluders": 0}}
    try:
        said = {}
        for run_id, (changes, why) in attacks.items():
            conf = {**cfg.replace(**changes).with_data(300, smallest=100).to_dict(), **widen.get(run_id, {})}
            got, msgs = request(path, frame_of(SETUP, {"run_id": run_id, "sites": NAMES, "config": conf}))
            said[run_id] = msgs[0].meta.get("error", "")
            assert got == ERROR and why in said[run_id] and "\n" not in said[run_id], (run_id, said[run_id])
        assert said["backbone-there"] == said["backbone-absent"]  # nothing tells which paths exist
        assert str(tmp_path) not in said["backbone-there"]
        # nothing joined: a training step is refused and nothing is uploaded
        got, msgs = request(path, frame_of("train_upload", {"round": 1, "server": 3}))
        assert got == ERROR and not msgs[0].packets
        assert snapshot(f0) == before  # the policy as the site signed it, the ledger unchanged
        text = (tmp_path / "site.log").read_text(errors="replace")
        assert len(re.findall(r"refused a request: PolicyRefused: site site0 refuses the run", text)) == 7
        # the same worker joins a plan its policy allows (example-level DP-SGD, unseeded)
        conf = cfg.with_data(300, smallest=100).to_dict()
        got, msgs = request(path, frame_of(SETUP, {"run_id": "fine", "sites": NAMES, "config": conf}), 60)
        assert got == SETUP and msgs[0].meta["joined"], msgs
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(30)
        log.close()


@pytest.mark.slow
@pytest.mark.deploy
def test_the_coordinator_hears_the_downgrade_refused_and_nothing_is_spent(tiny_cfg, tmp_path):
    cfg, folders, spec = hospitals(tiny_cfg, tmp_path)
    before = [snapshot(f) for f in folders]
    workers = [SiteWorker(f) for f in folders]
    client = cfg.replace(method="dp-fedavg", **CLIENT_LEVEL)
    down = {**spec, "config": client.to_dict()}
    with pytest.raises(SiloflError) as e:
        join(Loopback(workers), down)
    said = str(e.value)
    assert "\n" not in said and all(f"PolicyRefused: site {n} refuses the run" in said for n in NAMES)
    assert "--trust-server-noise" in said and "--secure-aggregation" in said
    assert all(w.site is None for w in workers) and [snapshot(f) for f in folders] == before
    # the same run with secure aggregation and a survivors floor the sites accept: every site joins
    secure = {**down, "config": client.replace(secure_aggregation=True, secagg_min_survivors=3).to_dict()}
    join(Loopback([SiteWorker(f) for f in folders]), secure)
    # a site whose operator trusts the server's noise joins the downgraded run, and says so
    for f in folders:
        save_policy(SiteFolder.load(f), SitePolicy(trust_server_noise=True))
    workers = [SiteWorker(f) for f in folders]
    engine = Loopback(workers)
    join(engine, {**down, "run_id": "trusted"})
    assert all(w.site is not None for w in workers) and engine.security["trust_server_noise"] == NAMES
    assert engine.describe()["trust_server_noise"] == NAMES  # summary.json's engine section names them


@pytest.mark.slow
@pytest.mark.deploy
def test_a_tampered_policy_stops_the_site_before_it_starts(tiny_cfg, tmp_path):
    _, folders, _ = hospitals(tiny_cfg, tmp_path)
    path = folders[0] / POLICY_FILE
    d = json.loads(path.read_text())
    d["policy"]["trust_server_noise"] = True  # widened by hand, outside `silofl site policy`
    path.write_text(json.dumps(d))
    res = subprocess.run(
        [sys.executable, "-m", "silofl.cli.main", "site", "run", "--site-dir", str(folders[0])]
        + ["--superlink", f"127.0.0.1:{free_port()}", "--insecure"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SILOFL_NO_PROGRESS": "1"},
    )
    out = (res.stdout + res.stderr).strip()
    assert res.returncode == 2 and "signature does not verify" in out and "Traceback" not in out, out
    assert len(out.splitlines()) == 1, out


@pytest.mark.slow
@pytest.mark.deploy
def test_a_round_below_the_sites_own_floor_is_masked_by_no_one(tmp_path):
    """The coordinator picks minimum survivors 2 for its secure sums: every site's floor (from its policy,
    never the coordinator's numbers) refuses to mask; nothing is released, nothing enters a ledger."""
    b = build_run(secure_config(tmp_path, noise_multiplier=1.0, secagg_min_survivors=2))
    pol = SitePolicy()
    for k, site in b.engine.sites.items():
        site.open_folder(tmp_path / f"site{k}")
        site.secure_floor = SecureFloor(
            pol.min_noise, pol.survivors_floor(None), 1e6, 1e-3, pol.survivor_fraction, pol.colluders
        )
    coord = b.coordinator
    coord.start()
    coord.run_round(1)
    srv = coord.server
    assert srv.history[-1]["abandoned"] and not srv.secure_released
    assert all(not [e for e in s.ledger.entries if e["kind"] == LEDGER_KIND] for s in b.engine.sites.values())
