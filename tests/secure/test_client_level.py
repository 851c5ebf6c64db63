"""Secure aggregation wired into the client-level methods: the server sees masked vectors and noisy sums
only, dropouts are survived or the round releases nothing, hostile steps are refused, and the figures
equal the central-noise run's within the discretisation error."""

import logging

import numpy as np
import pytest
import torch

from silofl.comm.messages import Message, Packet
from silofl.core.errors import BudgetExhausted, ConfigError
from silofl.privacy import discrete
from silofl.runner.config import RunConfig
from silofl.secure.messages import unpack_masked
from silofl.training.local_sgd import flat
from tests.helpers import build_run, secure_or_plain, spy_packets


def config(tmp_path, **kw):
    """A seconds-long client-level config on digits: 4 hospitals × 160 examples, MLP 64-256-10."""
    base = dict(
        method="dp-fedavg",
        dataset="digits",
        partition="iid",
        clients=4,
        samples_per_client=160,
        batch_size=16,
        rounds=2,
        delta=1e-3,
        proxy_model="mlp256",
        test_limit=200,
        seed=0,
        secure_aggregation=True,
        out=str(tmp_path / "run"),
    )
    return RunConfig.from_dict({**base, **kw})


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(method="proxyfl"), "client-level methods"),
        (dict(client_rate=0.5, secagg_min_survivors=5), "min_survivors"),
        (dict(secagg_min_survivors=5), "min_survivors"),
        (dict(secagg_threshold=1), "threshold"),
        (dict(secagg_bits=4), "secagg_bits"),
    ],
)
def test_unsupported_settings_are_config_errors(tmp_path, kw, match):
    with pytest.raises(ConfigError, match=match):
        config(tmp_path, **kw).resolve()


def weights(server):
    return flat({k: p.detach().clone() for k, p in server.model.named_parameters()})


@pytest.mark.slow
def test_the_server_sees_only_masked_vectors_and_the_round_matches_central_noise(tmp_path):
    """One round with negligible noise and 40 bits: the model moves by the plain mean of the clipped updates
    (within the discretisation error); every upload the server receives is a masked group vector."""
    kw = dict(noise_multiplier=1e-6, secagg_bits=40, clip=0.05)
    central = build_run(config(tmp_path / "c", **secure_or_plain(kw, False)))
    secure = build_run(config(tmp_path / "s", **kw))
    moves = []
    for b in (central, secure):
        b.coordinator.start()
        before = weights(b.coordinator.server)
        packets = spy_packets(b.engine)
        b.coordinator.run_round(1)
        moves.append(weights(b.coordinator.server) - before)
        if b is secure:
            srv = b.coordinator.server
            mech = srv.secure_mechanism(4)
            uploads = [d for s, dst, d in packets if dst == b.coordinator.server_id]
            assert len(uploads) == 4
            for data in uploads:
                y, sealed = unpack_masked(data, mech.padded_dim(), 40, {"secagg": True})
                assert y.dtype == np.uint64 and int(y.max()) < 1 << 40 and len(sealed) == 3
                # a masked vector is spread over the group, not a small update near 0 or 2**40
                assert 0.3 < float(np.mean(y < (1 << 39))) < 0.7
            h = srv.history[-1]
            assert h["survivors"] == 4 and "abandoned" not in h
            assert h["epsilon_vs_server"] == pytest.approx(
                discrete.epsilon([mech], rounds=1, delta=1e-3), rel=1e-12
            )
    err = float((moves[0] - moves[1]).abs().max())
    assert float(moves[0].abs().max()) > 1e-3  # the round moved the model
    assert err < 1e-6


@pytest.mark.slow
def test_adaptive_clip_and_intermediaries_travel_the_same_way(tmp_path):
    """The unclipped count and the norm sum are encoded (own mechanisms, own noise) and masked with the
    update; with negligible noise the clip moves as in the central run; the accountant composes all three."""
    kw = dict(noise_multiplier=1e-6, secagg_bits=40, adaptive_clip=True, intermediaries="adaptive", clip=0.05)
    clips = []
    for secure in (False, True):
        b = build_run(config(tmp_path / str(secure), **secure_or_plain(kw, secure)))
        b.coordinator.start()
        b.coordinator.run_round(1)
        srv = b.coordinator.server
        clips.append(srv.clip.clip)
        h = srv.history[-1]
        assert h["v_next"] >= 1 and -0.01 <= h["unclipped_fraction_noisy"] <= 1.01
        if secure:
            mechs = [discrete.DiscreteMechanism.from_dict(m) for m in srv.secure_released]
            assert [m.dim for m in mechs] == [srv.d, 1, 1]  # the round's, at the clip before it moved
            assert [m.clip for m in mechs] == [pytest.approx(0.05), 0.5, pytest.approx(0.05)]
            assert h["epsilon_vs_server"] == pytest.approx(
                discrete.epsilon(mechs, rounds=1, delta=1e-3), rel=1e-12
            )
    assert clips[0] != 0.05 and clips[1] == pytest.approx(clips[0], rel=1e-6)


@pytest.mark.slow
def test_the_budget_counts_the_discrete_mechanism(tmp_path):
    """A target between one round's Gaussian ε (3.537) and its discrete ε against the server: the run
    cannot start, and says the discrete figure."""
    with pytest.raises(BudgetExhausted, match=r"single round \(3\.55"):
        build_run(config(tmp_path, target_epsilon=3.545, noise_multiplier=1.0))


@pytest.mark.slow
def test_a_wrong_mask_is_detected_and_the_model_does_not_move(tmp_path, monkeypatch):
    """A site whose masked vector is garbage (uniform in the group): the decoded sum is implausibly long, the
    model does not move — and the sum is accounted, since the server saw it."""
    from silofl.secure import Party

    b = build_run(config(tmp_path))
    proto = b.coordinator
    proto.start()
    srv = proto.server
    real = Party.mask

    def garbage(self, rnd, x, parts, seed):
        y, sealed = real(self, rnd, x, parts, seed)
        if self.pid == 1:
            y = np.random.default_rng(0).integers(0, 1 << 20, len(y), dtype=np.uint64)
        return y, sealed

    monkeypatch.setattr(Party, "mask", garbage)
    before = weights(srv)
    proto.run_round(1)
    h = srv.history[-1]
    assert h["step"] is False and h["survivors"] == 4
    assert torch.equal(weights(srv), before) and len(srv.secure_released) == 1
    monkeypatch.setattr(Party, "mask", real)
    proto.run_round(2)
    assert srv.history[-1]["step"] is True and not torch.equal(weights(srv), before)


@pytest.mark.slow
def test_dropouts_are_survived_and_too_many_release_nothing(tmp_path, caplog):
    b = build_run(config(tmp_path, secagg_min_survivors=3))
    proto = b.coordinator
    proto.start()
    srv = proto.server
    site2 = b.engine.sites[2]
    real_unmask = site2.on_secagg_unmask
    site2.on_secagg_unmask = lambda msg: Message({"refused": "gone"})  # survives step 1, not step 2
    before = weights(srv)
    proto.run_round(1)
    h = srv.history[-1]
    assert h["survivors"] == 4 and "abandoned" not in h and len(srv.secure_released) == 1
    assert float((weights(srv) - before).abs().max()) > 0
    site2.on_secagg_unmask = real_unmask
    # two sites lost before masking: 2 survivors < 3 → abandoned, nothing released or recorded
    for k in (1, 3):
        b.engine.sites[k].on_train_upload = lambda msg: Message({"refused": "offline"})
    before, eps = weights(srv), srv.epsilon_vs_server()
    ledger = len(srv.accounts.accountants["hospital"].history)
    with caplog.at_level(logging.WARNING, logger="silofl"):
        proto.run_round(2)
    assert srv.history[-1]["abandoned"] and srv.secure_abandoned == 1
    assert torch.equal(weights(srv), before)
    assert srv.epsilon_vs_server() == eps and len(srv.accounts.accountants["hospital"].history) == ledger
    assert any("nothing released" in r.message for r in caplog.records)


@pytest.mark.slow
def test_hostile_secure_steps_are_refused_and_the_site_stays_intact(tmp_path, caplog):
    b = build_run(config(tmp_path))
    proto = b.coordinator
    proto.start()
    proto.run_round(1)
    proto.flush()
    site = b.engine.sites[0]
    session = site.party.session
    with caplog.at_level(logging.WARNING, logger="silofl"):
        for meta in ({}, {"session": "zz" * 16, "keys": {}}, {"session": "00" * 16, "keys": {"0": "x"}}):
            assert "refused" in site.handle("secagg_setup", Message(meta)).meta
        assert site.party.session == session
        for sec in (None, {"participants": "all"}, {"participants": [0, 1], "graph_seed": "00" * 16}):
            r = site.handle("train_upload", Message({"round": 5, "server": 4, "secagg": sec}))
            assert "refused" in r.meta and not r.packets
        junk = Message({"round": 1, "survivors": [0, 1, 2, 3]}, [Packet(4, 0, b"\0" * 100)])
        assert "refused" in site.handle("secagg_unmask", junk).meta
    # the site still takes part: the next round releases a sum
    proto.run_round(2)
    assert proto.server.history[-1]["survivors"] == 4
    assert sum("refused secure aggregation" in r.message for r in caplog.records) >= 7


@pytest.mark.slow
def test_a_run_reports_the_epsilon_against_the_server(tmp_path):
    import json

    from silofl.runner.loop import run as simulate

    cfg = config(tmp_path, rounds=2)
    simulate(cfg)
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    p = s["privacy"]
    assert p["secure_aggregation"] is True and p["noise_placement"] == "site"
    assert p["min_survivors"] == 3 and p["bits_per_coordinate"] == 20 and p["rounds_released"] == 2
    assert 0 < p["epsilon_vs_server"] < float("inf")
    # no un-noised diagnostics: the server never had the plain sum
    assert len(s["server_rounds"]) == 2
    assert all("xi" not in h and h["epsilon_vs_server"] > 0 for h in s["server_rounds"])
    assert all(h["step"] for h in s["server_rounds"])  # real noise passes the plausibility bound
    assert s["server_rounds"][-1]["epsilon_vs_server"] == p["epsilon_vs_server"]


@pytest.mark.slow
def test_the_nonprivate_twin_aggregates_securely_without_noise(tmp_path):
    """fedadam (dp-fedadam's --privacy off twin) with secure aggregation: no noise, no ε; one round moves
    the model exactly as the plain run's, within the discretisation error, when the clip does not bind."""
    kw = dict(method="fedadam", clip=100.0, secagg_bits=40)
    moves = []
    for secure in (False, True):
        b = build_run(config(tmp_path / str(secure), **secure_or_plain(kw, secure)))
        b.coordinator.start()
        before = weights(b.coordinator.server)
        b.coordinator.run_round(1)
        moves.append(weights(b.coordinator.server) - before)
        if secure:
            assert b.coordinator.privacy_summary()["secure_aggregation"] is True
            assert b.coordinator.privacy_summary()["epsilon_vs_server"] is None
    assert float(moves[0].abs().max()) > 1e-4
    assert float((moves[0] - moves[1]).abs().max()) < 1e-5


@pytest.mark.slow
def test_a_resumed_run_agrees_on_new_keys_and_keeps_its_accounting(tmp_path):
    """Keys are never checkpointed: the resumed coordinator runs key agreement again; the server's record of
    the sums it saw carries over."""
    a = build_run(config(tmp_path / "a"))
    a.coordinator.start()
    a.coordinator.run_round(1)
    a.coordinator.flush()
    state = a.coordinator.state_dict()
    sites = {k: s.state_dict() for k, s in a.engine.sites.items()}
    assert not any("party" in str(k) for s in sites.values() for k in s)
    b = build_run(config(tmp_path / "b"))
    b.coordinator.load_state_dict(state)
    for k, s in b.engine.sites.items():
        s.load_state_dict(sites[k])
    assert not b.coordinator.server.secagg.keys_ready
    b.coordinator.run_round(2)
    srv = b.coordinator.server
    assert srv.history[-1]["survivors"] == 4 and len(srv.secure_released) == 2
    assert srv.epsilon_vs_server() > a.coordinator.server.epsilon_vs_server() > 0
