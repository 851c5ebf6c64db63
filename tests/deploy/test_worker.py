"""The site worker behind the engine seam, without Flower: every party as a real site folder, every frame
packed and checked, payloads between sites sealed. The same numbers as the simulator; a hostile relay or
coordinator gets refusals, never a payload or an overspend."""

import json

import pytest
import torch

from silofl.comm import batch
from silofl.comm.messages import Message, Packet, pack, unpack
from silofl.core.errors import SiloflError
from silofl.deploy.coordinator import FlowerEngine, join
from silofl.deploy.local import make_site_folders
from silofl.deploy.site import ERROR, HELLO, SETUP, SiteConfig, SiteWorker
from silofl.runner.data import prepare_data
from silofl.runner.loop import run as simulate
from tests.helpers import MODEL_FOR


class Loopback(FlowerEngine):
    """FlowerEngine's checks, with each site's worker called directly; ``tap`` sees (and may change) every
    frame."""

    def __init__(self, workers, tap=None):
        super().__init__(None, {k: k for k in range(len(workers))}, 60.0, {"tls": False, "sealed": True})
        self.workers, self.tap = workers, tap or (lambda step, k, frame, way: frame)

    def exchange(self, step, requests, timeout_s=None):
        out = {}
        for k, m in requests.items():
            if k in self.lost:
                continue
            frame = self.tap(step, k, pack(step, {k: m}), "to")
            reply = self.reply_of(k, step, self.tap(step, k, self.workers[k].handle_frame(frame), "from"))
            if reply is not None:
                out[k] = reply
        return out


def deployment(cfg, tmp_path, **site_changes):
    cfg = cfg.resolve()
    cfg, split = prepare_data(cfg, torch.device("cpu"))
    cards, folders = make_site_folders(cfg, split, tmp_path / "sites")
    for f in folders:
        if site_changes:
            d = json.loads((f / "site.json").read_text())
            (f / "site.json").write_text(json.dumps({**d, **site_changes}))
    workers = [SiteWorker(f) for f in folders]
    spec = {
        "config": cfg.to_dict(),
        "sites": [{**c, "node_id": k} for k, c in enumerate(cards)],
        "coordinator_keys": str(tmp_path / "coordinator-keys"),
        "state_dir": str(tmp_path / "coordinator-state"),
    }
    return cfg, workers, spec, folders


def deployed_run(cfg, tmp_path, tap=None):
    cfg, workers, spec, folders = deployment(cfg, tmp_path)
    engine = Loopback(workers, tap)
    cfg2, remote = join(engine, spec)
    s = simulate(
        cfg2.replace(out=str(tmp_path / "deployed")),
        progress=False,
        engine_factory=lambda make, n: engine,
        remote=remote,
    )
    return s, engine, workers, folders


def _acc(a):
    out = {k: v for k, v in a.items() if k not in ("target_epsilon", "rounds_within_budget", "site_ledger")}
    # a deployed site's ledger holds its lifetime budget too; what it composed is the same
    return {**out, "site_ledger": a.get("site_ledger", {}).get("epsilon")}


def per_client(s, key):
    return [(r["client"], r[key], r["epsilon"]) for r in s["final"]["per_client"]]


CLIENT_LEVEL = {"intermediaries": "adaptive", "noise_multiplier": 1.0, "clip": 1.0, "proxy_model": "mlp"}
EXTRA = {
    "dp-fedavg": CLIENT_LEVEL,
    "dp-fedadam": CLIENT_LEVEL,
    "dp-fednova": CLIENT_LEVEL,
    "dp2-rmsprop": CLIENT_LEVEL,
    "fedbn": MODEL_FOR["fedbn"],  # FedBN keeps normalisation layers: a model with GroupNorm
}


@pytest.mark.slow
# dp-ssp is left out: a deployed site's ε against the server + c colluders uses its own policy's c
# (deploy local's admitting policy lowers c to fit 3 sites), the simulator's the default c = 1
@pytest.mark.parametrize(
    "method",
    [
        m
        for m in __import__("silofl.fl.registry", fromlist=["methods"]).methods()
        if m not in ("joint", "dp-ssp")
    ],
)
@pytest.mark.deploy
def test_every_method_runs_on_deployed_sites_with_the_simulators_numbers(method, tiny_cfg, tmp_path):
    cfg = tiny_cfg.replace(method=method, clients=3, rounds=2, eval_every=2, seed=0, **EXTRA.get(method, {}))
    s, engine, workers, _ = deployed_run(cfg, tmp_path)
    sim = simulate(cfg.replace(out=str(tmp_path / "sim")), progress=False)
    keys = sorted(k for k in s["final"]["per_client"][0] if k.endswith("_acc"))
    assert keys and [[r[k] for k in (*keys, "epsilon")] for r in s["final"]["per_client"]] == [
        [r[k] for k in (*keys, "epsilon")] for r in sim["final"]["per_client"]
    ]
    # the same accountant inputs and ε; a deployed site caps its target at its own lifetime budget
    assert [_acc(a) for a in s["accounting"]] == [_acc(a) for a in sim["accounting"]]
    assert s["engine"]["name"] == "flower" and s["engine"]["sealed"] is True
    assert all(not w.refused for w in workers)


@pytest.mark.slow
@pytest.mark.deploy
def test_the_relay_sees_no_payload_and_its_tampering_is_refused(tiny_cfg, tmp_path):
    seen, sent = [], {}

    def tap(step, k, frame, way):
        _, msgs = unpack(frame)
        ((kk, m),) = msgs.items()
        seen.extend(p.data for p in m.packets)
        if way != "to":
            return frame
        # a round's deliveries (receive) ride in a batch with the site's next step (silofl.comm.batch)
        parts = batch.split(m) if step == batch.BATCH else [(step, m)]
        for s, part in parts:
            if s == "receive":
                sent.setdefault(k, []).extend(p.data for p in part.packets if p.src != p.dst)
                if k == 1:  # corrupt every payload to site 1 in transit
                    part.packets = [
                        Packet(p.src, p.dst, p.data[:-1] + bytes([p.data[-1] ^ 1])) for p in part.packets
                    ]
        return pack(step, {kk: batch.make(parts) if step == batch.BATCH else parts[0][1]})

    cfg = tiny_cfg.replace(method="proxyfl", clients=3, rounds=2, seed=0)
    s, engine, workers, folders = deployed_run(cfg, tmp_path, tap)
    assert sent and all(
        d[:4] == b"SFS1" for d in (p for ps in sent.values() for p in ps)
    )  # only sealed ones travel
    proxy = workers[0].site.shared.state_dict()
    raw = proxy[next(iter(proxy))].numpy().tobytes()[:32]
    assert not any(raw in d for d in seen)  # the relay never holds a proxy's weights in the clear
    assert {r["client"] for r in engine.refused} == {1} and all(
        "signature" in r["reason"] for r in engine.refused
    )
    assert s["rounds_run"] == 2  # site 1 refused the tampered payloads and went on


@pytest.mark.slow
@pytest.mark.deploy
def test_a_replayed_payload_is_refused(tiny_cfg, tmp_path):
    cfg = tiny_cfg.replace(method="proxyfl", clients=3, rounds=1, seed=0)
    cfg, workers, spec, _ = deployment(cfg, tmp_path)
    engine = Loopback(workers)
    join(engine, spec)
    engine.exchange("status", {0: Message()})
    reply = engine.exchange("train_send", {k: Message({"round": 1, "to": [(k + 1) % 3]}) for k in range(3)})
    pk = [p for p in reply[0].packets if p.dst != 0][0]
    first = engine.exchange("receive", {pk.dst: Message({"round": 1}, [pk])})
    assert pk.dst in first and not workers[pk.dst].refused
    again = workers[pk.dst].handle_frame(pack("receive", {pk.dst: Message({"round": 1}, [pk])}))
    _, msgs = unpack(again)
    assert "replay" in " ".join(msgs[pk.dst].meta["refused_payloads"])


@pytest.mark.slow  # a whole run (fast tier ≤ 60 s)
@pytest.mark.deploy
def test_a_site_refuses_what_its_folder_does_not_allow(tiny_cfg, tmp_path):
    from silofl.privacy.ledger import Ledger, change_lifetime

    cfg = tiny_cfg.replace(method="proxyfl", clients=2, rounds=2, seed=0, noise_multiplier=1.0)
    _, workers, spec, folders = deployment(cfg, tmp_path, allow_research_seed=False)
    with pytest.raises(SiloflError, match="seed"):
        join(Loopback(workers), spec)
    unseeded = {**spec, "config": {**spec["config"], "seed": None}}
    for f in folders:  # the ledger is the budget of record: `silofl site budget` records a change
        change_lifetime(Ledger(f / "ledger"), 0.5, 1e-3, "a stricter budget")
    with pytest.raises(SiloflError, match="lifetime budget ε 0.5"):
        join(Loopback([SiteWorker(f) for f in folders]), unseeded)
    tight = {**unseeded, "config": {**unseeded["config"], "delta": 0.5}}
    with pytest.raises(SiloflError, match="lifetime δ"):
        join(Loopback([SiteWorker(f) for f in folders]), tight)
    paper = {**unseeded, "config": {**unseeded["config"], "privacy": "paper"}}
    for f in folders:
        change_lifetime(Ledger(f / "ledger"), 1e6, 1e-3, "a generous budget")
        d = json.loads((f / "site.json").read_text())
        (f / "site.json").write_text(json.dumps({**d, "allow_non_formal": False}))
    with pytest.raises(SiloflError, match="no formal guarantee"):
        join(Loopback([SiteWorker(f) for f in folders]), paper)


def test_a_site_answers_garbage_with_a_refusal_and_keeps_its_state(tiny_cfg, tmp_path):
    cfg = tiny_cfg.replace(method="fedavg", clients=2, rounds=2, seed=0)
    _, workers, spec, folders = deployment(cfg, tmp_path)
    w = workers[0]
    for frame in (
        b"",
        b"\xff" * 64,
        (10**12).to_bytes(8, "little") + b"{}",
        pack("train_upload", {0: Message()}),
        pack(HELLO, {0: Message({"nonce": 5})}),
        pack(SETUP, {0: Message({"run_id": "x"})}),
        pack(HELLO, {0: Message(), 1: Message()}),
    ):
        step, msgs = unpack(w.handle_frame(frame))
        assert step == ERROR and msgs[0].meta["error"]
    assert w.site is None  # nothing half-joined
    engine = Loopback(workers)
    join(engine, spec)
    # paths in a request are the coordinator's: the site writes only into its own folder
    engine.exchange("save", {0: Message({"root": str(tmp_path / "elsewhere"), "round": 1})})
    assert not (tmp_path / "elsewhere").exists() and list((folders[0] / "checkpoint").rglob("node0.*"))
    # a packet claiming to come from another site must be sealed by it
    step, msgs = unpack(
        w.handle_frame(pack("receive_global", {0: Message({"round": 1}, [Packet(1, 0, b"x" * 100)])}))
    )
    assert msgs[0].meta["refused_payloads"]


def test_site_config_is_checked(tmp_path):
    with pytest.raises(SiloflError, match="not a site folder"):
        SiteConfig.load(tmp_path)
    (tmp_path / "site.json").write_text(
        json.dumps({"name": "a", "data": "d", "lifetime_epsilon": -1, "lifetime_delta": 1e-5})
    )
    with pytest.raises(SiloflError, match="lifetime"):
        SiteConfig.load(tmp_path)
