"""A deployment holds against the coordinator and relay that carry its messages (issue 25): every attack below
was carried out against today's code before it was fixed, on real site folders and real site workers (the
socket ones against a real ``silofl site run`` process).

1. sealed means sealed: an unsealed model claiming any node id is never taken; nothing leaves in the clear;
2. replay-proof: rounds only move forward, a run id is used once, the replay state survives re-setups and
restarts;
3. no path from a request: a run id is a plain name, nothing is written outside the site folder;
5. decisions stay separate: a seed never unlocks a mode the site refuses; each refusal names its site.json
field;
6. the ledger is the budget of record: a missing, shorter or foreign ledger is refused, the coordinator keeps
each
   site's last head, the budget changes only by a ledger entry, a lost ledger is restored explicitly.

(4, the worker nothing can wedge, is ``test_site_worker_fuzz.py``.)"""

import json
import shutil

import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from silofl.comm.messages import Message, Packet, pack, unpack
from silofl.comm.wire import encode
from silofl.core.errors import SiloflError
from silofl.deploy import seal as sealing
from silofl.deploy.site import ERROR, SETUP, SiteWorker
from silofl.fl.exchange.gossip import PUSHSUM_KEY
from silofl.fl.registry import method_info, methods
from silofl.privacy.ledger import Ledger, LedgerTampered
from tests.deploy.test_worker import EXTRA, Loopback, deployment, join

# dp-ssp needs 3 sites (its one release goes through the secure sum, masked: tests/fl/test_pooled.py); these
# attacks are staged on 2
DEPLOYABLE = [m for m in methods() if m not in ("joint", "dp-ssp")]


def joined(cfg, tmp_path, **site_changes):
    cfg, workers, spec, folders = deployment(cfg, tmp_path, **site_changes)
    engine = Loopback(workers)
    join(engine, spec)
    return engine, workers, spec, folders


def ask(worker, step, k, meta, packets=()):
    """Send one frame straight to a worker (the relay's position); (step, reply message)."""
    got, msgs = unpack(worker.handle_frame(pack(step, {k: Message(meta, list(packets))})))
    return got, next(iter(msgs.values()))


def spy(worker):
    """Record every packet the worker hands to its site."""
    seen = []
    handle = worker.site.handle

    def wrapped(step, msg):
        seen.extend(msg.packets)
        return handle(step, msg)

    worker.site.handle = wrapped
    return seen


def sending_step(method, k, dst):
    ex = method_info(method).exchange
    return {
        "gossip": ("train_send", {"round": 1, "to": [dst]}),
        "cycle": ("send", {"round": 1, "to": dst}),
        "server": ("train_upload", {"round": 1, "server": dst, "uniform": False}),
    }.get(ex)


# ---------------------------------------------------------------------------------------------- 1. sealed
# means sealed
@pytest.mark.slow
@pytest.mark.parametrize("method", DEPLOYABLE)
@pytest.mark.deploy
def test_an_unsealed_model_claiming_any_node_is_never_taken(method, tiny_cfg, tmp_path):
    cfg = tiny_cfg.replace(method=method, clients=2, rounds=2, seed=0, **EXTRA.get(method, {}))
    engine, workers, spec, _ = joined(cfg, tmp_path)
    w = workers[0]
    ask(w, "status", 0, {"round": 1})
    seen = spy(w)
    blob = encode({"w": torch.zeros(3)}, meta={"round": 1, "src": 2, "model": "mlp"})
    forged = sealing.seal(
        blob,
        run_id=engine.setup_meta["run_id"],
        src="coordinator",
        dst="site0",
        rnd=1,
        step="receive_global",
        index=0,
        sign_key=Ed25519PrivateKey.generate(),  # not the pinned key
        recipient=w.seal_key.public_key(),
    )
    for step in ("receive", "receive_global"):
        for src, data in (
            (2, blob),
            (3, blob),
            (1, blob),
            (0, blob),
            (2, forged),
        ):  # K = 2: the server-role id
            got, reply = ask(w, step, 0, {"round": 1}, [Packet(src, 0, data)])
            assert got == ERROR or reply.meta.get("refused_payloads"), (step, src)
    assert (
        seen == []
    )  # nothing unsealed (or sealed by an unpinned key) reached the site, whatever id it claimed


@pytest.mark.slow
@pytest.mark.deploy
def test_an_unsealed_model_from_the_server_id_is_not_mixed_into_a_proxyfl_site(tiny_cfg, tmp_path):
    cfg = tiny_cfg.replace(method="proxyfl", clients=2, rounds=2, seed=0)
    engine, workers, _, _ = joined(cfg, tmp_path)
    w = workers[0]
    ask(w, "status", 0, {"round": 1})
    state = w.site.shared_state()
    blob = w.site.payload(1, {PUSHSUM_KEY: torch.tensor(0.5, dtype=torch.float64)})  # a well-formed model …
    got, reply = ask(
        w, "receive", 0, {"round": 1}, [Packet(2, 0, blob)]
    )  # … claiming node K (no server in ProxyFL)
    assert w.site.pushsum_weight == 1.0 and reply.meta["refused_payloads"]
    assert all(torch.equal(v, w.site.shared_state()[k]) for k, v in state.items())


@pytest.mark.slow
@pytest.mark.parametrize("method", [m for m in DEPLOYABLE if sending_step(m, 0, 1)])
@pytest.mark.deploy
def test_a_site_never_sends_in_the_clear_nor_to_an_unpinned_destination(method, tiny_cfg, tmp_path):
    cfg = tiny_cfg.replace(method=method, clients=2, rounds=2, seed=0, **EXTRA.get(method, {}))
    _, workers, _, _ = joined(cfg, tmp_path)
    w = workers[0]
    bad = [0, 7] + (
        [2] if method_info(method).exchange != "server" else []
    )  # itself, no node, a server it lacks
    for dst in bad:
        step, meta = sending_step(method, 0, dst)
        got, reply = ask(w, step, 0, meta)
        assert got == ERROR and not reply.packets, dst
    step, meta = sending_step(method, 0, 1 if method_info(method).exchange != "server" else 2)
    got, reply = ask(w, step, 0, meta)
    assert got == step and all(p.data[:4] == b"SFS1" for p in reply.packets)  # what leaves is sealed


# ---------------------------------------------------------------------------------------------- 2.
# replay-proof
def _one_payload(tiny_cfg, tmp_path):
    cfg = tiny_cfg.replace(method="proxyfl", clients=3, rounds=3, seed=0)
    engine, workers, spec, folders = joined(cfg, tmp_path)
    engine.exchange("status", {0: Message()})
    reply = engine.exchange("train_send", {k: Message({"round": 1, "to": [(k + 1) % 3]}) for k in range(3)})
    pk = [p for p in reply[0].packets if p.dst != 0][0]
    assert pk.dst in engine.exchange("receive", {pk.dst: Message({"round": 1}, [pk])})
    return engine, workers, spec, folders, pk


def _replayed(worker, pk, rnd):
    seen = spy(worker)
    worker.handle_frame(pack("receive", {pk.dst: Message({"round": rnd}, [pk])}))
    return bool(seen)


@pytest.mark.slow
@pytest.mark.deploy
def test_rounds_only_move_forward(tiny_cfg, tmp_path):
    _, workers, _, _, pk = _one_payload(tiny_cfg, tmp_path)
    w = workers[pk.dst]
    ask(w, "status", pk.dst, {"round": 7})  # the relay jumps ahead, so the guard forgets round 1 …
    got, reply = ask(w, "status", pk.dst, {"round": 2})  # … and comes back
    assert got == ERROR and "forward" in reply.meta["error"]
    assert not _replayed(w, pk, 2)


@pytest.mark.slow
@pytest.mark.deploy
def test_a_batch_cannot_smuggle_a_setup_nor_move_rounds_back(tiny_cfg, tmp_path):
    """Several steps in one message (silofl.comm.batch) are checked as the steps they are: a hello or setup
    inside a batch, a batch inside a batch, a part whose round goes back, are refused and change nothing."""
    from silofl.comm import batch

    engine, workers, spec, _ = joined(tiny_cfg.replace(clients=2), tmp_path)
    w = workers[0]
    for parts in (
        [("status", Message({"round": 1})), (SETUP, Message(dict(spec)))],
        [("status", Message({"round": 1})), ("__hello__", Message({"nonce": "x"}))],
    ):
        got, reply = ask(w, batch.BATCH, 0, batch.make(parts).meta, batch.make(parts).packets)
        assert got == ERROR and "never part of a batch" in reply.meta["error"]
    nested = Message({"parts": [{"step": batch.BATCH, "meta": {}, "packets": 0}]})
    got, reply = ask(w, batch.BATCH, 0, nested.meta)
    assert got == ERROR
    got, reply = ask(
        w,
        batch.BATCH,
        0,
        batch.make([("status", Message({"round": 3})), ("status", Message({"round": 2}))]).meta,
    )
    assert got == ERROR and "forward" in reply.meta["error"]
    got, reply = ask(w, batch.BATCH, 0, batch.make([("status", Message({"round": 3}))]).meta)
    assert got == batch.BATCH and len(batch.split_reply(reply, 1)) == 1  # a well-formed batch still runs


@pytest.mark.slow
@pytest.mark.deploy
def test_a_resent_setup_does_not_reset_the_replay_guard(tiny_cfg, tmp_path):
    engine, workers, spec, _, pk = _one_payload(tiny_cfg, tmp_path)
    w = workers[pk.dst]
    got, reply = ask(w, SETUP, pk.dst, dict(engine.setup_meta))
    assert got == ERROR and "used before" in reply.meta["error"]
    assert not _replayed(w, pk, 1)


@pytest.mark.slow
@pytest.mark.deploy
def test_a_restarted_worker_remembers_its_run_ids_and_replay_state(tiny_cfg, tmp_path):
    engine, workers, spec, folders, pk = _one_payload(tiny_cfg, tmp_path)
    again = SiteWorker(folders[pk.dst])  # the worker process restarted
    got, reply = ask(again, SETUP, pk.dst, dict(engine.setup_meta))
    assert got == ERROR and "used before" in reply.meta["error"]
    kept = json.loads((folders[pk.dst] / "state" / "runs.json").read_text())[engine.setup_meta["run_id"]]
    assert kept["round"] == 1 and kept["seen"]  # the replay state is in the site's own folder


# ---------------------------------------------------------------------------------------------- 3. no path
# from a request
def test_a_run_id_is_a_plain_name_and_nothing_is_written_outside_the_site(tiny_cfg, tmp_path):
    cfg = tiny_cfg.replace(method="fedavg", clients=2, rounds=1, seed=0)
    cfg, workers, spec, folders = deployment(cfg, tmp_path)
    before = sorted(p for p in tmp_path.rglob("*") if not p.is_relative_to(folders[0]))
    w = workers[0]
    for run_id in ("../../escaped", str(tmp_path / "abs"), "a/b", "..", ".hidden", "x\x00y", "", 7):
        meta = {"run_id": run_id, "sites": [c["name"] for c in spec["sites"]], "config": spec["config"]}
        got, reply = ask(w, SETUP, 0, meta)
        assert got == ERROR and ("plain name" in reply.meta["error"] or "run id" in reply.meta["error"]), (
            run_id
        )
        ask(w, "save", 0, {"root": str(tmp_path / "x"), "round": 1})
        assert sorted(p for p in tmp_path.rglob("*") if not p.is_relative_to(folders[0])) == before, run_id


# ---------------------------------------------------------------------------------------------- 5. decisions
# stay separate
def test_a_seed_never_unlocks_a_mode_the_site_refuses(tiny_cfg, tmp_path):
    cfg = tiny_cfg.replace(method="proxyfl", clients=2, rounds=1, seed=0, privacy="off")
    _, workers, spec, _ = deployment(cfg, tmp_path, allow_research_seed=True, allow_non_formal=False)
    with pytest.raises(SiloflError, match="allow_non_formal") as e:
        join(Loopback(workers), spec)
    assert "site0" in str(e.value)
    assert all(w.site is None for w in workers)  # nobody trained without DP


def test_every_refusal_names_the_site_json_field(tiny_cfg, tmp_path):
    cfg = tiny_cfg.replace(method="proxyfl", clients=2, rounds=2, seed=0, noise_multiplier=1.0)
    _, workers, spec, folders = deployment(cfg, tmp_path, allow_research_seed=False)
    with pytest.raises(SiloflError, match="allow_research_seed"):
        join(Loopback(workers), spec)
    unseeded = {**spec, "config": {**spec["config"], "seed": None, "delta": 0.5}}
    with pytest.raises(SiloflError, match="lifetime_delta"):
        join(Loopback(workers), unseeded)


# ---------------------------------------------------------------------------------------------- 6. the ledger
# of record
def _after_a_round(tiny_cfg, tmp_path):
    cfg = tiny_cfg.replace(method="proxyfl", clients=2, rounds=3, seed=0)
    cfg, workers, spec, folders = deployment(cfg, tmp_path)
    engine = Loopback(workers)
    join(engine, spec)
    engine.exchange("train_send", {k: Message({"round": 1, "to": [1 - k]}) for k in range(2)})
    engine.exchange("save", {k: Message({"root": "x", "round": 1}) for k in range(2)})
    assert Ledger(folders[0] / "ledger").history()  # it spent
    fresh = {**spec, "run_id": None}
    return fresh, folders


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["deleted", "truncated", "foreign"])
@pytest.mark.deploy
def test_a_site_with_history_refuses_a_missing_shorter_or_foreign_ledger(loss, tiny_cfg, tmp_path):
    spec, folders = _after_a_round(tiny_cfg, tmp_path)
    led = folders[0] / "ledger"
    if loss == "deleted":
        shutil.rmtree(led)
    elif loss == "truncated":
        rows = (led / "ledger.jsonl").read_text().splitlines()
        (led / "ledger.jsonl").write_text("\n".join(rows[:2]) + "\n")
    else:  # another site's ledger and key, copied in: a valid chain that has spent nothing of this site's
        shutil.rmtree(led)
        shutil.copytree(folders[1] / "ledger", led)
    with pytest.raises(LedgerTampered, match="ledger"):
        SiteWorker(folders[0])


@pytest.mark.slow
@pytest.mark.deploy
def test_the_coordinator_refuses_an_older_ledger_head_even_when_the_site_forgot_everything(
    tiny_cfg, tmp_path
):
    spec, folders = _after_a_round(tiny_cfg, tmp_path)
    for sub in ("ledger", "state", "checkpoint", "models"):  # nothing left at the site to tell it has run
        shutil.rmtree(folders[0] / sub, ignore_errors=True)
    workers = [SiteWorker(f) for f in folders]
    with pytest.raises(SiloflError, match="site0.*ledger-restore"):
        join(Loopback(workers), spec)
    assert (
        json.loads((tmp_path / "coordinator-state" / "ledger_heads.json").read_text())["heads"]["site0"][
            "entries"
        ]
        > 2
    )


@pytest.mark.slow
@pytest.mark.deploy
def test_the_lifetime_budget_changes_only_by_a_ledger_entry_and_a_lost_ledger_is_restored_explicitly(
    tiny_cfg, tmp_path
):
    from typer.testing import CliRunner

    from silofl.cli.main import app
    from silofl.privacy.ledger import lifetime_of

    spec, folders = _after_a_round(tiny_cfg, tmp_path)
    f = folders[0]
    d = json.loads((f / "site.json").read_text())
    (f / "site.json").write_text(json.dumps({**d, "lifetime_epsilon": 1e9}))  # edited: changes nothing
    w = SiteWorker(f)
    assert w.lifetime[0] == d["lifetime_epsilon"] and "the ledger's wins" in w.budget_note
    r = CliRunner().invoke(
        app, ["site", "budget", str(f), "--lifetime-epsilon", "40", "--why", "board decision"]
    )
    assert r.exit_code == 0, r.output
    e = Ledger(f / "ledger").entries[-1]
    assert (
        e["kind"] == "budget"
        and e["previous"][0] == d["lifetime_epsilon"]
        and e["epsilon"] == 40
        and e["why"]
    )
    assert (
        lifetime_of(Ledger(f / "ledger")) == (40.0, d["lifetime_delta"]) and SiteWorker(f).budget_note is None
    )
    shutil.rmtree(f / "ledger")
    r = CliRunner().invoke(app, ["site", "ledger-restore", str(f), "--why", "disk lost"])
    assert r.exit_code == 2  # the prior spend must be declared
    r = CliRunner().invoke(
        app, ["site", "ledger-restore", str(f), "--spent-epsilon", "30", "--why", "disk lost"]
    )
    assert r.exit_code == 0, r.output
    w = SiteWorker(f)
    assert w.lifetime[0] == pytest.approx(10.0)  # 40 − the declared 30
    joined_again = Loopback([w, SiteWorker(folders[1])])
    join(joined_again, spec)  # the restored ledger starts a new epoch: the coordinator takes its head
    heads = json.loads((tmp_path / "coordinator-state" / "ledger_heads.json").read_text())["heads"]
    assert heads["site0"]["epoch"] == 1


# ---------------------------------------------------------------------------------------------- 4. (fast
# part)
def test_a_header_nesting_200000_lists_is_refused_without_recursion():
    from silofl.core.errors import PeerModelRejected

    deep = (
        b'{"step": "s", "messages": {"0": {"meta": {"x": '
        + b"[" * 200_000
        + b"]" * 200_000
        + b'}, "packets": []}}}'
    )
    with pytest.raises(PeerModelRejected, match="nests deeper"):
        unpack(len(deep).to_bytes(8, "little") + deep)
    ok = pack("s", {0: Message({"x": [[["[[[[[[" * 100]]], "y": {"z": ']]]]\\"{{{{'}})})
    assert unpack(ok)[1][0].meta["x"] == [[["[[[[[[" * 100]]]  # brackets inside strings do not count
