"""Pooled noise for FedAvg (silofl.fl.exchange.pooled) and dp-ssp (silofl.fl.methods.dp_ssp): refusals of
what the analysis does not cover; one pooled round moves the global model by −lr·(Σ clipped sums + noise)/N
and the server sees only masked vectors; each masked round is one secagg-discrete ledger entry; dp-ssp's
head is the closed-form ridge solution on un-noised statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from silofl.core.errors import ConfigError
from silofl.fl.methods import dp_ssp
from silofl.privacy import discrete as D
from silofl.runner.config import RunConfig
from silofl.secure.messages import unpack_masked
from tests.helpers import build_run, spy_packets


def config(tmp_path, drop: tuple[str, ...] = (), **kw):
    """A seconds-long pooled FedAvg config on digits: 4 sites × 60 examples, a linear head (without the
    options in ``drop``)."""
    base = dict(
        method="fedavg",
        dataset="digits",
        partition="iid",
        clients=4,
        samples_per_client=60,
        batch_size=20,
        rounds=2,
        delta=1e-3,
        proxy_model="linear",
        test_limit=100,
        seed=0,
        lr=0.5,
        clip=0.5,
        optimizer="sgd",
        noise_multiplier=2.0,
        secure_aggregation=True,
        noise_placement="pooled",
        out=str(tmp_path / "run"),
    )
    return RunConfig.from_dict({k: v for k, v in {**base, **kw}.items() if k not in drop})


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(secure_aggregation=False), "needs --secure-aggregation"),
        (dict(sample_rate=0.5), "no amplification"),
        (dict(local_steps=3), "local_steps must be 1"),
        (dict(secagg_min_survivors=5), "min_survivors"),
        (dict(optimizer="adam"), "optimizer sgd"),
        (dict(privacy="off"), "privacy on"),
        (dict(method="fml", private_model="linear", privacy="paper", dml_beta=0.5), "dml_beta must be 0"),
        (
            dict(method="scaffold"),
            "refused for scaffold: a site's control variate would be its own un-noised",
        ),
        (dict(noise_placement="central"), "unknown noise_placement"),
    ],
)
def test_pooled_noise_refuses_what_its_analysis_does_not_cover(tmp_path, kw, match):
    with pytest.raises(ConfigError, match=match):
        config(tmp_path, **kw).resolve()


def test_pooled_noise_fills_full_batch_single_steps(tmp_path):
    o = config(tmp_path).resolve().options
    assert o.sample_rate == 1.0 and o.local_steps == 1 and o.noise_placement == "pooled"
    fml = config(tmp_path, method="fml", private_model="linear", privacy="paper").resolve().options
    assert fml.dml_beta == 0.0  # the meme learns from the labels only (paper mode's default is 0.5)


# every example-level method that takes pooled noise, with what it needs on top of config()
POOLED = {
    "fedavg": {},
    "fedavg-adam": {},
    "fedavg-yogi": {},
    "fedprox": {"mu": 0.5},
    "ditto": {},
    "apfl": {},
    "fml": {"private_model": "linear"},
}


def test_the_pooled_table_is_every_method_that_takes_pooled_noise():
    from silofl.fl.registry import methods

    able = {n for n, m in methods().items() if getattr(m.options, "supports_pooled", False)}
    assert able == set(POOLED)


def pooled_rounds(tmp_path, method: str, rounds: int = 1, **kw):
    """``rounds`` seeded pooled rounds of ``method`` (four sites, floor 3), each site's ledger in
    ``tmp_path``; the run's parts and the global model's flat weights before and after."""
    from silofl.privacy.ledger import Ledger

    b = build_run(
        config(tmp_path / method, method=method, secagg_min_survivors=3, **{**POOLED[method], **kw})
    )
    c = b.coordinator
    c.start()
    for s in b.sites:
        s.ledger = Ledger(tmp_path / method / f"ledger{s.cid}")
    w0 = torch.cat([v.reshape(-1).double() for v in c.server.state().values()])
    for r in range(1, rounds + 1):
        c.flush()
        for s in b.sites:  # the models that never leave the site, as the last round starts
            s.private_start = (
                None if s.private is None else {k: v.clone() for k, v in s.private.state_dict().items()}
            )
        c.run_round(r)
    c.flush()
    return b, w0, torch.cat([v.reshape(-1).double() for v in c.server.state().values()])


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(POOLED))
def test_every_pooled_method_runs_seeded_rounds_and_books_them_as_secure_discrete(tmp_path, method):
    """Two pooled rounds: each steps the shared model, every site's metrics are finite, and its ledger holds
    one secagg-discrete entry per round, one example the unit, placed in the secure sum; its ε is the
    discrete accountant's of those entries."""
    b, w0, w1 = pooled_rounds(tmp_path, method, rounds=2)
    c = b.coordinator
    assert [h["step"] for h in c.history] == [True, True] and float((w1 - w0).norm()) > 0
    assert torch.isfinite(w1).all()
    for s in b.sites:
        metrics = s.evaluate(*b.test)
        assert metrics and all(math.isfinite(v) for v in metrics.values()), metrics
        entries = [e for e in s.ledger.entries if e["kind"] == "secagg-discrete"]
        assert [(e["round"], e["unit"], e["placement"]) for e in entries] == [
            (1, "row", "secure"),
            (2, "row", "secure"),
        ]
        mechs = [D.DiscreteMechanism.from_dict(m) for e in entries for m in e["mechanisms"]]
        assert s.epsilon() == D.epsilon(mechs, rounds=1, delta=1e-3) > 0
        assert not any(e["kind"] == "dp-sgd" for e in s.ledger.entries)  # no DP-SGD step ran besides
        if s.private is not None:  # a personal / private model trains at the site every round, as without:
            assert any(not torch.equal(v, s.private.state_dict()[k]) for k, v in s.private_start.items())


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fedavg-adam", "fedavg-yogi"])
def test_fedopt_steps_on_the_decoded_pooled_step_as_post_processing(tmp_path, method):
    """The same seeded round as pooled FedAvg decodes the same step Δ (the sites' shares and the rotation
    are the run's seeds'); the adaptive server's first moment is (1 − β1)·Δ: its step is post-processing of
    the one release, and the sites' books are FedAvg's."""
    plain, v0, v1 = pooled_rounds(tmp_path, "fedavg")
    b, w0, _ = pooled_rounds(tmp_path, method)
    opt = b.coordinator.server.opt
    assert type(opt).__name__ == {"fedavg-adam": "FedAdam", "fedavg-yogi": "FedYogi"}[method]
    assert torch.equal(w0, v0)
    assert torch.allclose(opt.m.double() / (1 - opt.beta1), v1 - v0, rtol=1e-9, atol=1e-12)
    for s, t in zip(b.sites, plain.sites, strict=True):
        assert s.pooled_epsilons() == t.pooled_epsilons()


@pytest.mark.slow
def test_the_ema_of_the_global_models_is_released_under_pooled_noise_too(tmp_path):
    """ema_decay d: after three pooled rounds a site releases d·EMA + (1 − d)·w₃, the EMA over the
    broadcasts w₁, w₂ (post-processing of the released models, as without pooling)."""
    from silofl.privacy.ledger import Ledger

    b = build_run(config(tmp_path, secagg_min_survivors=3, ema_decay=0.5))
    c = b.coordinator
    c.start()
    for s in b.sites:
        s.ledger = Ledger(tmp_path / f"ledger{s.cid}")
    seen = []
    for r in (1, 2, 3):
        c.run_round(r)
        c.flush()
        seen.append({k: v.detach().clone() for k, v in b.sites[0].shared.state_dict().items()})
    got = b.sites[0].released().state_dict()
    for k, v in got.items():
        want = 0.5 * (0.5 * seen[0][k] + 0.5 * seen[1][k]) + 0.5 * seen[2][k]
        assert torch.allclose(v, want, atol=1e-6), k
    assert not all(torch.equal(v, seen[2][k]) for k, v in got.items())  # not the last broadcast alone


@pytest.mark.slow
def test_a_pooled_fedprox_round_is_pooled_fedavgs_bit_for_bit(tmp_path):
    """Each site clips its data term's gradients only, at the received global model, where the proximal
    gradient μ·(w − w_g) is zero: the same seeded round moves the global model exactly as pooled FedAvg's."""
    _, v0, v1 = pooled_rounds(tmp_path, "fedavg", rounds=2)
    b, w0, w1 = pooled_rounds(tmp_path, "fedprox", rounds=2)
    assert torch.equal(w0, v0) and torch.equal(w1, v1) and b.sites[0].mu == 0.5


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(rounds=3), "rounds must be 1"),
        (dict(secure_aggregation=False), "--secure-aggregation"),
        (dict(proxy_model="mlp"), "linear"),
        (dict(ssp_dim=-1), "ssp_dim"),
    ],
)
def test_dp_ssp_refuses_bad_settings(tmp_path, kw, match):
    cfg = {"method": "dp-ssp", "rounds": 1, **kw}
    with pytest.raises(ConfigError, match=match):
        config(tmp_path, drop=("noise_placement",), **cfg).resolve()


def test_dp_ssp_statistics_solve_to_the_closed_form_ridge():
    """On un-noised statistics the head is (ZᵀZ + λI)⁻¹ZᵀY, the statistics' vector unpacks to ZᵀZ and ZᵀY,
    and every row's contribution has norm ≤ √2 (the sensitivity the mechanism is calibrated to)."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(50, 3, 4, generator=g) * 5, torch.randint(0, 4, (50,), generator=g)
    z = dp_ssp.rows(x, dp_ssp.projection(12, 6))
    assert float(z.norm(dim=1).max()) <= 1 + 1e-12
    v = dp_ssp.statistics(z, y, 4)
    assert v.size == dp_ssp.stats_dim(6, 4)
    a, b = dp_ssp.unpack(v, 6, 4)
    zn, yn = z.numpy(), np.eye(4)[y.numpy()]
    assert np.allclose(a, zn.T @ zn) and np.allclose(b, zn.T @ yn)
    w = dp_ssp._solve(a, b, 0.3)
    assert np.allclose(w, np.linalg.inv(zn.T @ zn + 0.3 * np.eye(6)) @ zn.T @ yn)
    # the shared head: least squares, with eigenvalues below the floor raised to it
    assert np.allclose(dp_ssp.floor_solve(a, b, 1e-9), np.linalg.solve(zn.T @ zn, zn.T @ yn))
    lam, v = np.linalg.eigh(a)
    floored = v @ np.diag(1 / np.maximum(lam, lam[3])) @ v.T
    assert np.allclose(dp_ssp.floor_solve(a, b, lam[3]), floored @ zn.T @ yn)
    one = [np.linalg.norm(dp_ssp.statistics(z[i : i + 1], y[i : i + 1], 4)) for i in range(50)]
    assert max(one) <= dp_ssp.ROW_BOUND * (1 + 1e-12)


@pytest.mark.slow
def test_one_pooled_round_is_a_dp_gd_step_on_the_pooled_data(tmp_path):
    """The server decodes Σ_k (clipped sum_k) + noise with the pooled variance and steps by −lr·that/N;
    every upload is a masked group vector; each site's ledger holds one secagg-discrete entry per round;
    the site's ε is the discrete accountant's, per threat."""
    b = build_run(config(tmp_path, secagg_min_survivors=3))
    c = b.coordinator
    c.start()
    for s in b.sites:
        from silofl.privacy.ledger import Ledger

        s.ledger = Ledger(tmp_path / f"ledger{s.cid}")
    w0 = torch.cat([v.reshape(-1).double() for v in c.server.state().values()])
    sums = [s.clipped_sum() for s in b.sites]  # the same model and data the round will use
    packets = spy_packets(b.engine)
    c.run_round(1)
    c.flush()
    mech = c.pooled.mechanism(c.dim, 4)
    uploads = [d for _, dst, d in packets if dst == c.server_id]
    assert len(uploads) == 4
    for data in uploads:
        y, _ = unpack_masked(data, mech.padded_dim(), mech.bits, {"secagg": True})
        assert 0.3 < float(np.mean(y < (1 << (mech.bits - 1)))) < 0.7
    w1 = torch.cat([v.reshape(-1).double() for v in c.server.state().values()])
    n = sum(s.n for s in b.sites)
    decoded = -(w1 - w0).numpy() * n / 0.5 - c.weight_decay * w0.numpy() * n
    noise = decoded - np.sum(sums, axis=0)
    target = 4 * mech.local_mu / mech.scale**2  # four sites' shares, each (zC)²/3
    assert target == pytest.approx(4 / 3 * (2.0 * 0.5) ** 2, rel=1e-6)
    assert abs(noise.var() - target) < 6 * target * math.sqrt(2 / noise.size)
    assert c.history[-1]["survivors"] == 4 and c.history[-1]["step"]
    for s in b.sites:
        entries = [e for e in s.ledger.entries if e["kind"] == "secagg-discrete"]
        assert len(entries) == 1 and entries[0]["unit"] == "row" and entries[0]["placement"] == "secure"
        mechs = [D.DiscreteMechanism.from_dict(m) for m in entries[0]["mechanisms"]]
        assert mechs == [mech]
        rep = s.privacy_report()
        assert rep["epsilon"] == D.epsilon(mechs, rounds=1, delta=1e-3)
        assert rep["epsilon_vs_server_plus_colluders"] == D.epsilon(mechs, rounds=1, delta=1e-3, survivors=2)
    assert c.privacy_summary()["epsilon_vs_server_per_site"]["0"] == b.sites[0].epsilon()


@pytest.mark.slow
def test_a_round_below_the_survivors_floor_releases_nothing(tmp_path):
    from silofl.comm.messages import Message

    b = build_run(config(tmp_path, secagg_min_survivors=4))
    c = b.coordinator
    c.start()
    b.engine.sites[2].on_train_upload = lambda msg: Message({"refused": "offline"})
    before = {k: v.clone() for k, v in c.server.state().items()}
    c.run_round(1)
    assert c.history[-1].get("abandoned") and c.released == 0
    assert all(torch.equal(before[k], v) for k, v in c.server.state().items())
    # nothing was released: the server's books hold no round; a site's own books count what it masked
    assert c.epsilon_of(0) == 0.0 and b.engine.sites[0].epsilon() > 0


@pytest.mark.slow
@pytest.mark.multiprocess
def test_pooled_fedavg_on_torch_distributed_equals_the_simulator(tmp_path):
    """`silofl launch` (two processes, three sites) runs the same pooled steps and gives the simulator's
    figures bit for bit (seeded), ε included."""
    import json
    import subprocess
    import sys

    from tests.helpers import TINY_LAUNCH, launch_tiny

    extra = [
        "--method",
        "fedavg",
        "--secure-aggregation",
        "--noise-placement",
        "pooled",
        "--optimizer",
        "sgd",
    ]
    extra += ["--seed", "0", "--clients", "3", "--secagg-min-survivors", "3"]  # secure sums: 3 sites at least
    r = launch_tiny(tmp_path / "l", *extra)
    assert r.returncode == 0, r.stderr[-3000:]
    sim = subprocess.run(
        [
            sys.executable,
            "-m",
            "silofl.cli.main",
            "run",
            *TINY_LAUNCH[3:],
            "--out",
            str(tmp_path / "s"),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert sim.returncode == 0, sim.stderr[-3000:]
    runs = [json.loads((tmp_path / k / "summary.json").read_text()) for k in ("l", "s")]
    assert runs[0]["processes"] == 2
    for s in runs:
        assert s["privacy"]["rounds_released"] == 1 and s["privacy"]["epsilon_vs_server"] > 0
    rows = [[(c["client"], c["global_acc"], c["epsilon"]) for c in s["final"]["per_client"]] for s in runs]
    assert rows[0] == rows[1]


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "needs --secure-aggregation"),
        (["--method", "scaffold", "--secure-aggregation"], "refused for scaffold"),
        (["--method", "scaffold"], "refused for scaffold"),
        (
            ["--secure-aggregation", "--client-rate", "0.5"],
            "option client_rate does not apply",
        ),  # no sampling
        (["--secure-aggregation", "--sample-rate", "0.5"], "no amplification can be claimed"),
        (
            ["--secure-aggregation", "--secagg-min-survivors", "5"],
            "secagg_min_survivors must lie in [2, clients = 4]",
        ),
        pytest.param(  # found when the model is built (after the data): slow
            ["--secure-aggregation", "--secagg-bits", "9", "--proxy-model", "mlp"],
            "9 bits are too few",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_the_cli_refuses_pooled_noise_it_cannot_account_with_one_line_and_exit_2(tmp_path, args, message):
    """Bad input: one line, exit 2, nothing written (so nothing trained or released)."""
    from typer.testing import CliRunner

    from silofl.cli.main import app

    base = [
        "run",
        "--method",
        "fedavg",
        "--dataset",
        "digits",
        "--clients",
        "4",
        "--samples-per-client",
        "40",
    ]
    base += ["--rounds", "1", "--optimizer", "sgd", "--noise-placement", "pooled", "--quiet"]
    r = CliRunner().invoke(app, [*base, *args, "--out", str(tmp_path / "x")])
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.split()) and "Traceback" not in r.output
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_a_pooled_round_past_the_sites_lifetime_is_refused_by_its_one_accountant(tmp_path):
    """A site whose ledger already holds DP-SGD spend close to its lifetime budget masks nothing: its one
    accountant (every mechanism of the ledger composed) refuses the pooled round before anything is
    released, and its ledger gains no entry; a site with room masks as usual."""
    from silofl.privacy.ledger import Ledger, change_lifetime, start_site_ledger
    from silofl.privacy.site_accountant import SiteAccountant

    b = build_run(config(tmp_path, secagg_min_survivors=3))
    c = b.coordinator
    c.start()
    for s in b.sites:
        s.ledger = Ledger(tmp_path / f"ledger{s.cid}")
        start_site_ledger(s.ledger, f"site{s.cid}", "k" * 16, (50.0, 1e-3), "test")
    full = b.sites[0].ledger
    full.record_steps("earlier", noise_multiplier=0.8, sample_rate=1.0, steps=32)
    now = SiteAccountant(full, colluders=1).epsilon(1e-3, "colluders")
    change_lifetime(full, now + 1e-3, 1e-3, "test: a hair above what it spent")
    books = SiteAccountant(full, colluders=1)
    mech = c.pooled.mechanism(c.dim, 4)
    assert not books.allows([{"kind": "secagg-discrete", "mechanisms": [mech.to_dict()], "unit": "row"}])
    before = len(full.entries)
    c.run_round(1)
    assert len(full.entries) == before  # refused: nothing masked, nothing recorded
    assert c.history[-1]["survivors"] == 3  # the three others still carry the floor
    for s in b.sites[1:]:
        assert [e["kind"] for e in s.ledger.entries][-1] == "secagg-discrete"
