"""White-box gradient canaries (silofl.auditing.gradient) and the Gaussian-sum estimate
(silofl.auditing.gauss).

Fast: the DPGradient hook off is the unhooked mechanism bit for bit; canaries are clipped and noised like
examples and leave the accountant's inputs alone; the GDP conversion against numerical integration; a deployed
site's audit spec and evidence are checked. Slow (digits, few rounds): the no-DP control has power, no bound
exceeds its accountant ε, an audited run whose canaries are all out is bit-identical to a plain run. The same
audit on the other engines: tests/auditing/test_engines.py."""

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import integrate, stats
from torch import nn

from silofl.auditing import gauss, gradient
from silofl.auditing.gradient import GradientCanaries
from silofl.auditing.settings import AuditSettings
from silofl.core.errors import ConfigError
from silofl.privacy import DPGradient, NoiseSource
from silofl.privacy.grad_sample import make_clipper


def loss_fn(out, y, _logp=None):
    return F.cross_entropy(out, y, reduction="none")


def mechanism(seed=7, sigma=1.3, clip=0.5, n=40):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    return model, DPGradient(
        model, clip, sigma, 0.25 * n, NoiseSource(seed), backend="vmap", sample_rate=0.25
    )


def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(9, 6, generator=g), torch.randint(0, 3, (9,), generator=g)


def canaries_for(dp, included, q=1.0, kind="dirac", m=8):
    return GradientCanaries(dp.params, m, kind, np.asarray(included, bool), q, seed=11)


def test_hook_off_is_the_unhooked_mechanism():
    """canaries None: p.grad is the pre-hook formula (clipped sum + N(0, σ²C²), over q·n) bit for bit, and a
    hook whose canaries are all out changes no bit either."""
    x, y = batch()
    model, dp = mechanism()
    dp.compute(x, loss_fn, y, torch.zeros(9, 1))
    ref_model, _ = mechanism()
    _, grads, _ = make_clipper(ref_model, "vmap").clipped_sum(x, loss_fn, (y, torch.zeros(9, 1)), 0.5)
    noise = NoiseSource(7)
    for p, q in zip(model.parameters(), ref_model.parameters(), strict=True):
        want = noise.normal(tuple(q.shape), 1.3 * 0.5).add_(grads[q].detach()).div_(10.0)
        assert torch.equal(p.grad, want)
    model2, dp2 = mechanism()
    dp2.canaries = canaries_for(dp2, [False] * 8)
    dp2.compute(x, loss_fn, y, torch.zeros(9, 1))
    for p, p2 in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(p.grad, p2.grad)
    assert dp.take_run() == dp2.take_run()


@pytest.mark.parametrize("kind", ["dirac", "random"])
def test_canaries_are_clipped_and_noised_like_examples(kind):
    """Each canary has norm C; the sampled ones join the sum before the same noise draw, divided by the same
    q·n; σ, q and the step count the accountant reads are unchanged, empty batches included."""
    x, y = batch()
    model, dp = mechanism()
    model_c, dp_c = mechanism()
    can = canaries_for(dp_c, [True, False] * 4, q=1.0, kind=kind)
    for i in range(8):
        v = can.flat(np.eye(8, dtype=bool)[i], 0.5)
        assert float(v.norm()) == pytest.approx(0.5, rel=1e-6)
        assert not v[30:].any()  # on the largest tensor (the first layer's 5×6 weight), fixed before the run
    dp_c.canaries = can
    for xb, yb in ((x, y), (x[:0], y[:0])):
        dp.compute(xb, loss_fn, yb, torch.zeros(len(yb), 1))
        dp_c.compute(xb, loss_fn, yb, torch.zeros(len(yb), 1))
        added = can.pieces(can.flat(np.array([True, False] * 4), 0.5))
        for p, pc, a in zip(model.parameters(), model_c.parameters(), added, strict=True):
            torch.testing.assert_close(pc.grad - p.grad, a / 10.0, rtol=0, atol=1e-6)
    assert can.sampled.tolist() == [2, 0] * 4  # q = 1: every included canary joined both steps
    assert dp.take_run() == dp_c.take_run()
    other, _ = mechanism()
    with pytest.raises(RuntimeError):
        can.add({}, list(other.parameters()), 0.5)


def test_canary_sampling_is_poisson_at_q():
    _, dp = mechanism()
    can = canaries_for(dp, [True] * 40, q=0.25, m=40)
    for _ in range(200):
        can.draw()
    assert can.sampled.sum() / (40 * 200) == pytest.approx(0.25, abs=0.02)
    with pytest.raises(ConfigError, match="distinct coordinates"):
        canaries_for(dp, [True] * 100, m=100)


def _delta_by_integration(mu, eps):
    """δ(ε) of N(0,1) vs N(μ,1) as ∫ (p_μ − e^ε p_0)_+ — an independent route to Dong et al.'s closed form."""
    f = lambda x: max(0.0, stats.norm.pdf(x, mu) - math.exp(eps) * stats.norm.pdf(x))  # noqa: E731
    cross = eps / mu + mu / 2
    return integrate.quad(f, cross, cross + 40, limit=200)[0]


def test_gdp_conversion_matches_integration():
    for mu in (0.5, 1.0, 2.0):
        for eps in (0.0, 1.0, 3.0):
            assert gauss.gdp_delta(mu, eps) == pytest.approx(
                _delta_by_integration(mu, eps), rel=1e-6, abs=1e-12
            )
        e = gauss.gdp_epsilon(mu, 1e-5)
        assert gauss.gdp_delta(mu, e) == pytest.approx(1e-5, rel=1e-6)
    assert gauss.gdp_delta(1.0, 0.0) == pytest.approx(2 * stats.norm.cdf(0.5) - 1)
    assert gauss.gdp_epsilon(0.0, 1e-5) == 0.0


def test_gauss_estimate_recovers_mu():
    rng = np.random.default_rng(0)
    inc = rng.random(4000) < 0.5
    scores = rng.normal(size=4000) * 3 + 1.5 * 3 * inc  # μ = 1.5 in units of the noise
    g = gauss.gauss_estimate(scores, inc, 1e-5, 0.95)
    assert abs(g["mu_hat"] - 1.5) < 3 * g["mu_standard_error"]
    assert g["mu_lower"] < g["mu_hat"] and g["epsilon_estimate"] < g["epsilon_point"]
    null = gauss.gauss_estimate(rng.normal(size=4000), inc, 1e-5)
    assert null["epsilon_estimate"] < 0.5


def test_quiet_placement_avoids_coordinates_real_gradients_move():
    """Inputs 0 … 2 are never on in the public rows: every first-layer weight reading them has a zero
    gradient, so quiet Dirac canaries sit there (and only there); the global RNG is left as it was."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    g = torch.Generator().manual_seed(2)
    x = torch.randn(64, 6, generator=g)
    x[:, :3] = 0.0
    y = torch.randint(0, 3, (64,), generator=g)
    state = torch.get_rng_state()
    act = gradient.activity_on_public_data(model, x, y, batch=16)
    assert torch.equal(torch.get_rng_state(), state)
    w = act[:30].reshape(5, 6)  # the first layer's weight, (out, in)
    assert (w[:, :3] == 0).all() and (w[:, 3:] > 0).any()
    params = list(model.parameters())
    quiet = GradientCanaries(params, 10, "dirac", np.ones(10, bool), 1.0, seed=4, activity=act)
    cols = quiet.support[:, 0].numpy() % 6
    assert quiet.placement == "quiet" and (cols < 3).all() and len(set(quiet.support[:, 0].tolist())) == 10
    assert quiet.activity == 0.0
    anywhere = GradientCanaries(params, 10, "dirac", np.ones(10, bool), 1.0, seed=4)
    assert anywhere.placement == "random" and anywhere.activity is None
    assert gradient.activity_on_public_data(nn.Linear(6, 1), x, torch.full((64,), 5), batch=16) is None


def test_public_rows_are_rows_no_client_trains_on():
    from types import SimpleNamespace

    ds = SimpleNamespace(x_train=torch.arange(20.0).view(20, 1), y_train=torch.arange(20))
    parts = [(torch.zeros(3, 1), torch.zeros(3)), (torch.zeros(4, 1), torch.zeros(4))]
    split = SimpleNamespace(
        dataset=ds,
        parts=parts,
        indices=[np.array([0, 1, 2]), np.array([5, 6, 7, 8])],
        features=None,
        preprocessing=None,
        external=None,
    )
    x, y = gradient.public_rows(split, seed=1, limit=10)
    assert len(y) == 10 and not set(y.tolist()) & {0, 1, 2, 5, 6, 7, 8}
    assert torch.equal(x[:, 0].long(), y)
    assert gradient.public_rows(SimpleNamespace(**{**vars(split), "indices": None}), seed=1) is None
    assert gradient.public_rows(SimpleNamespace(**{**vars(split), "preprocessing": [{}]}), seed=1) is None
    with pytest.raises(ConfigError, match="--canary-placement"):
        AuditSettings(canary_placement="loud").validate()


def test_gradient_kinds_are_refused_for_published_models_but_dp_nn():
    with pytest.raises(ConfigError, match="published dp-logreg"):
        AuditSettings(canary_kind="dirac", pubsub_model="dp-logreg").validate()
    AuditSettings(canary_kind="random").validate()
    AuditSettings(canary_kind="dirac", pubsub_model="dp-nn").validate()


# ---------------------------------------------------------------------------------------------- runs (slow)
DIGITS = dict(
    dataset="digits",
    clients=3,
    samples_per_client=150,
    batch_size=30,
    delta=1e-5,
    partition="iid",
    test_limit=100,
    eval_every=100,
    lr=0.01,
)


def grad_audit(tmp_path, name, canaries=200, kind="dirac", **kw):
    from silofl.auditing import run_audit
    from silofl.runner.config import RunConfig

    return run_audit(
        RunConfig.from_dict(kw),
        AuditSettings(canaries=canaries, canary_kind=kind, seed=3, reference_models=0),
        tmp_path / name,
    )


@pytest.mark.slow
def test_no_dp_control_has_power(tmp_path):
    a = grad_audit(
        tmp_path,
        "off",
        **dict(DIGITS, method="proxyfl", private_model="cnn1", proxy_model="mlp", rounds=3, privacy="off"),
    )
    assert a["epsilon_accountant"] is None and a["threat_model"] == "white-box per step"
    assert a["epsilon_lower_bound"] > 1.0, a["bounds"]
    assert (
        a["epsilon_gauss_unbounded"] or a["epsilon_gauss"] > 1.0
    )  # above 700: the fitted Gaussians do not overlap
    assert a["epsilon_lower_bound"] <= a["certifiable_epsilon_max"]
    # quiet placement (the default): the real examples' gradients barely touch the canaries' coordinates, so
    # without DP the included and excluded canaries' per-step sums separate almost perfectly
    assert a["canaries"]["placement"] == "quiet"
    assert a["bounds"]["white-box per step"]["snj"]["canary_auc"]["steps"] >= 0.95, a["bounds"]
    assert set(a["bounds"]) == {"white-box per step", "white-box per release"}
    assert a["canaries"]["space"] == "gradient" and "Dirac" in a["canaries"]["kind"]
    assert a["canaries"]["releases_scored"] == 3
    assert (tmp_path / "off" / "audit.md").is_file() and (tmp_path / "off" / "canary_scores.csv").is_file()


@pytest.mark.slow
@pytest.mark.parametrize(("method", "sigma", "kind"), [("proxyfl", 0.7, "dirac"), ("fedavg", 2.0, "random")])
def test_no_bound_exceeds_its_accountant_epsilon(tmp_path, method, sigma, kind):
    """Fails the suite if any bound or estimate, under any threat model, is above the accountant's ε."""
    kw = dict(DIGITS, method=method, proxy_model="mlp", rounds=4, noise_multiplier=sigma)
    if method == "proxyfl":
        kw["private_model"] = "cnn1"
    a = grad_audit(tmp_path, method, kind=kind, **kw)
    eps = a["epsilon_accountant"]
    assert a["formal_guarantee"] and eps > 0
    for tm, b in a["bounds"].items():
        assert b["snj"]["epsilon_lower_bound"] <= eps, (tm, b["snj"])
        assert b["gauss"]["epsilon_estimate"] <= eps, (tm, b["gauss"])
    assert a["noise_multiplier"] == sigma and a["steps"] == 4 * 5 and a["sample_rate"] == pytest.approx(0.2)


@pytest.mark.slow
def test_audited_run_with_no_canary_in_is_bit_identical(tmp_path):
    """All coins out: the hook, the optimizer pre-hook and the observer are installed and change nothing."""
    from silofl.auditing.tap import tap
    from silofl.comm.engine import InProcessEngine
    from silofl.runner.config import RunConfig
    from silofl.runner.loop import run as run_loop

    cfg = RunConfig.from_dict(
        dict(
            DIGITS,
            method="fedavg",
            proxy_model="mlp",
            rounds=2,
            noise_multiplier=1.0,
            seed=4,
            eval_every=1,
            report_nonprivate=True,
        )
    )
    plain = run_loop(cfg.replace(out=str(tmp_path / "plain")), progress=False)
    seen = {}

    def factory(make, n):
        engine = InProcessEngine({k: make(k) for k in range(n)})
        site = engine.sites[0]
        can = GradientCanaries(
            [p for p in site.shared.parameters()], 50, "dirac", np.zeros(50, bool), site.sample_rate, 1
        )
        gradient.attach(site, can)
        obs = gradient.ReleaseObserver(0)
        obs.canaries, obs.names = can, [n for n, _ in site.shared.named_parameters()]
        seen.update(can=can, obs=obs)
        return tap(engine, [obs])

    hooked = run_loop(cfg.replace(out=str(tmp_path / "hooked")), progress=False, engine_factory=factory)
    assert seen["can"].steps > 0 and seen["obs"].trained == 2
    assert hooked["final"] == plain["final"] and hooked["accounting"] == plain["accounting"]
    a = (tmp_path / "plain" / "metrics.jsonl").read_text().splitlines()
    b = (tmp_path / "hooked" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in a] == [json.loads(x) for x in b]


@pytest.mark.slow
def test_published_dp_nn_with_gradient_canaries(tmp_path):
    """PubSub-ML's dp-nn with the canaries in its DP-SGD step: the no-DP publisher leaks, the DP one stays
    below its ε."""
    from silofl.auditing import run_audit
    from silofl.runner.config import RunConfig

    cfg = dict(dataset="digits", samples_per_client=300, delta=1e-5)
    off = run_audit(
        RunConfig.from_dict(dict(cfg, privacy="off")),
        AuditSettings(
            canaries=200,
            canary_kind="dirac",
            seed=2,
            pubsub_model="dp-nn",
            pubsub_epochs=10,
            reference_models=0,
        ),
        tmp_path / "off",
    )
    assert off["epsilon_lower_bound"] > 1.0, off["bounds"]
    assert off["canaries"]["placement"] == "quiet"
    assert "publisher does not hold" in off["canaries"]["placement_note"]
    dp = run_audit(
        RunConfig.from_dict(cfg),
        AuditSettings(
            canaries=200,
            canary_kind="dirac",
            seed=2,
            epsilon=2.0,
            pubsub_model="dp-nn",
            pubsub_epochs=10,
            reference_models=0,
        ),
        tmp_path / "dp",
    )
    assert dp["epsilon_accountant"] <= 2.0 * (1 + 1e-6) and dp["steps"] == dp["mechanism"]["steps"]
    assert set(dp["bounds"]) == {"white-box per step", "white-box final model"}
    for b in dp["bounds"].values():
        assert b["snj"]["epsilon_lower_bound"] <= dp["epsilon_accountant"]
        assert b["gauss"]["epsilon_estimate"] <= dp["epsilon_accountant"]
