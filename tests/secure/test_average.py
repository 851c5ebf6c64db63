"""FedAvg and FML with secure aggregation (silofl.fl.exchange.secure_average): the server sees masked
vectors only and decodes the weighted sum of the survivors' model moves; at a large bit width the global
model equals the plain run's within the quantisation error; dropouts are survived or release nothing; the
range bound clips (logged) and the sum never wraps around."""

import logging

import numpy as np
import pytest
import torch

from silofl.comm.messages import Message
from silofl.core.errors import ConfigError
from silofl.privacy import discrete
from silofl.runner.config import RunConfig
from silofl.secure.messages import unpack_masked
from silofl.training.local_sgd import flat
from tests.helpers import build_run, secure_or_plain, spy_packets


def config(tmp_path, **kw):
    """A seconds-long FedAvg config on digits: 3 sites × 100 examples, the MLP."""
    base = dict(
        method="fedavg",
        dataset="digits",
        partition="iid",
        clients=3,
        samples_per_client=100,
        batch_size=25,
        rounds=2,
        delta=1e-3,
        proxy_model="mlp",
        test_limit=100,
        seed=0,
        lr=0.01,
        secure_aggregation=True,
        out=str(tmp_path / "run"),
    )
    return RunConfig.from_dict({**base, **kw})


def weights(server):
    return flat({k: v.detach().clone().double() for k, v in server.model.state_dict().items()})


def test_exact_range_never_wraps_even_for_aligned_vectors_at_the_bound():
    """The worst case of :func:`discrete.exact_range`: every party's vector at the bound c and rotated onto
    the same coordinate (all of its mass there), at 12 bits — the decoded sum is n·x within the rounding."""
    n, c, dim = 5, 3.0, 64
    mech = discrete.exact_range(dim=dim, clip=c, bits=12, parties=n)
    e = np.zeros(mech.padded_dim())
    e[7] = c
    x = discrete.unrotate(e, mech, rotation_seed=11)  # rotate(x) = c·e_7
    rng = discrete.DiscreteRandom(0)
    total = np.zeros(mech.padded_dim(), dtype=np.uint64)
    for _ in range(n):
        total = (total + discrete.encode(x, mech, rotation_seed=11, rng=rng)) % np.uint64(1 << 12)
    got = discrete.decode(total, mech, rotation_seed=11)
    assert np.linalg.norm(got - n * x) <= n * np.sqrt(mech.padded_dim()) / mech.scale
    with pytest.raises(ConfigError, match="too few"):
        discrete.exact_range(dim=dim, clip=c, bits=3, parties=n)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(method="proxyfl"), "client-level methods .* example-level fedavg, fml, .*not for proxyfl"),
        (
            dict(method="scaffold"),
            "example-level fedavg, .*not for scaffold",
        ),  # its pooled reason: pooled only
        (dict(secagg_range=0.0), "secagg_range"),
        (dict(secagg_min_survivors=4), "min_survivors"),
        (dict(secagg_bits=4), "secagg_bits"),
    ],
)
def test_fedavg_secure_settings_are_checked(tmp_path, kw, match):
    with pytest.raises(ConfigError, match=match):
        config(tmp_path, **kw).resolve()


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fedavg", "fml", "fedavg-adam", "fedprox", "apfl"])
def test_the_server_sees_masked_vectors_and_the_average_equals_the_plain_run(tmp_path, method):
    """One round at 48 bits: the global model equals the plain run's (weighted by the public sizes) within
    the quantisation error; every upload to the server is a masked group vector."""
    kw = dict(method=method, secagg_bits=48, **({"private_model": "mlp"} if method == "fml" else {}))
    runs = {}
    for secure in (False, True):
        b = build_run(config(tmp_path / str(secure), **secure_or_plain(kw, secure)))
        c = b.coordinator
        c.start()
        w0 = weights(c.server)
        packets = spy_packets(b.engine)
        c.run_round(1)
        c.flush()
        runs[secure] = (weights(c.server) - w0, b)
        if secure:
            mech = c.secure.mechanism(c.dim, 3)
            uploads = [d for s, dst, d in packets if dst == c.server_id]
            assert len(uploads) == 3
            for data in uploads:
                y, sealed = unpack_masked(data, mech.padded_dim(), 48, {"secagg": True})
                assert len(sealed) == 2 and 0.3 < float(np.mean(y < (1 << 47))) < 0.7
            assert c.history[-1] == {"round": 1, "participants": 3, "survivors": 3, "step": True}
            assert c.privacy_summary()["secure_aggregation"] is True
    plain, secure = runs[False][0], runs[True][0]
    assert float(plain.norm()) > 0.1
    assert float((plain - secure).abs().max()) < 1e-6
    # the example-level ε is the DP-SGD accountant's, unchanged
    eps = [[s.epsilon() for s in b.engine.sites.values()] for _, b in runs.values()]
    assert eps[0] == eps[1] and eps[0][0] > 0


@pytest.mark.slow
def test_dropouts_range_clipping_and_refusals(tmp_path, caplog):
    """A site lost before masking: the survivors' weighted mean moves the model; two lost (a survivor keeps
    fewer than t = 2 surviving neighbours): abandoned, the model stays. A move longer than the range is
    clipped and logged. A site asked for a plain upload refuses it."""
    b = build_run(config(tmp_path, clients=4, secagg_min_survivors=2, secagg_range=0.5))
    c = b.coordinator
    c.start()
    offline = lambda msg: Message({"refused": "offline"})  # noqa: E731
    b.engine.sites[2].on_train_upload = offline
    before = weights(c.server)
    with caplog.at_level(logging.WARNING, logger="silofl"):
        c.run_round(1)
    assert c.history[-1]["survivors"] == 3 and c.released == 1
    move = weights(c.server) - before
    assert 0 < float(move.norm()) <= 0.5 * (1 + 1e-6)  # each weighted move clipped to 0.5, their mean
    assert any("above the secure aggregation range" in r.message for r in caplog.records)
    b.engine.sites[1].on_train_upload = offline
    before = weights(c.server)
    c.run_round(2)
    assert c.history[-1]["abandoned"] and c.abandoned == 1
    assert torch.equal(weights(c.server), before)
    site = b.engine.sites[0]
    r = site.handle("train_upload", Message({"round": 5, "server": 4}))
    assert "refused" in r.meta and not r.packets
    bad = {"round": 6, "server": 4, "weight_scale": 1.0, "secagg": {}}
    assert "refused" in site.handle("train_upload", Message(bad)).meta


@pytest.mark.slow
@pytest.mark.multiprocess
def test_fml_with_secure_aggregation_on_torch_distributed_equals_the_simulator(tmp_path):
    """`silofl launch` (two processes) runs the same steps and gives the simulator's figures (seeded)."""
    import json
    import subprocess
    import sys

    from tests.helpers import TINY_LAUNCH, launch_tiny

    extra = ["--method", "fml", "--secure-aggregation", "--seed", "0", "--clients", "3"]  # 3 sites at least
    r = launch_tiny(tmp_path / "l", *extra)
    assert r.returncode == 0, r.stderr[-3000:]
    args = TINY_LAUNCH[3:]  # without "launch --nproc-per-node 2"
    sim = subprocess.run(
        [sys.executable, "-m", "silofl.cli.main", "run", *args, "--out", str(tmp_path / "s"), *extra],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert sim.returncode == 0, sim.stderr[-3000:]
    runs = [json.loads((tmp_path / k / "summary.json").read_text()) for k in ("l", "s")]
    assert runs[0]["processes"] == 2
    for s in runs:
        assert s["privacy"]["secure_aggregation"] is True and s["privacy"]["rounds_released"] == 1
    rows = [[(c["client"], c["proxy_acc"], c["epsilon"]) for c in s["final"]["per_client"]] for s in runs]
    assert rows[0] == rows[1]
