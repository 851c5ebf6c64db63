"""Combination at inference (silofl.site.combine): held-out rows carved once from the site's own training
rows, a combiner fitted on them only (never the test split), equal to an independent fit, no worse than its
worse part."""

import numpy as np
import pytest
import torch
from torch import nn

from silofl.comm.messages import Message
from silofl.core.errors import ConfigError
from silofl.models import ModelSpec
from silofl.runner.config import RunConfig
from silofl.site.combine import Combination, CombineSettings, fit_combiner, holdout_rows, log_probs
from silofl.site.dpsgd import DPSGDSettings, DPSGDSite
from silofl.training.fusion import fit_weights, weight_grid


def test_holdout_rows_are_a_fixed_disjoint_share_of_the_sites_rows():
    keep, held = holdout_rows(101, 0.2, 7, site=3)
    assert len(held) == 20 and len(keep) == 81
    assert sorted(np.concatenate([keep, held]).tolist()) == list(range(101))
    again = holdout_rows(101, 0.2, 7, site=3)
    assert (again[1] == held).all()  # taken once: the same rows from the split seed
    assert not (holdout_rows(101, 0.2, 7, site=4)[1] == held).all()  # each site its own
    assert len(holdout_rows(101, 0.2, None, site=3)[1]) == 20  # secret randomness without a seed
    with pytest.raises(ConfigError, match="leaves no rows"):
        holdout_rows(3, 0.1, 0, site=0)


def _logps(n=120, c=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, c, (n,), generator=g)
    a = torch.randn(n, c, generator=g) + 2.0 * nn.functional.one_hot(y, c) * (
        torch.rand(n, 1, generator=g) < 0.7
    )
    b = torch.randn(n, c, generator=g) + 1.5 * nn.functional.one_hot(y, c) * (
        torch.rand(n, 1, generator=g) < 0.6
    )
    return [torch.log_softmax(a, 1), torch.log_softmax(b, 1)], y


def test_stacker_equals_scikit_learns_logistic_regression():
    from sklearn.linear_model import LogisticRegression

    logps, y = _logps()
    l2 = 1e-2
    w, b, mix = fit_combiner(logps, y, "stack", l2)
    feats = torch.cat(logps, 1).double().numpy()
    ones = np.ones((len(y), 1))
    # mean CE + l2·(‖W‖² + ‖b‖²) is sklearn's C·ΣCE + ½‖[W b]‖² with C = 1 / (2·l2·n), the intercept a weight
    ref = LogisticRegression(C=1 / (2 * l2 * len(y)), fit_intercept=False, tol=1e-10, max_iter=10_000)
    ref.fit(np.hstack([feats, ones]), y.numpy())
    assert mix is None
    assert np.allclose(w.numpy(), ref.coef_[:, :-1], atol=2e-3)
    assert np.allclose(b.numpy(), ref.coef_[:, -1], atol=2e-3)


def test_a_balanced_stacker_equals_scikit_learn_with_balanced_sample_weights():
    from sklearn.linear_model import LogisticRegression

    logps, y = _logps(n=90, seed=2)
    y = torch.where(torch.arange(90) < 60, torch.zeros_like(y), y)  # mostly class 0, as a p_major site
    w, b, _ = fit_combiner(logps, y, "stack", 1e-2, balance=True)
    counts = np.bincount(y.numpy(), minlength=3)
    sw = len(y) / (3 * counts[y.numpy()])  # sklearn's class_weight="balanced"
    ref = LogisticRegression(C=1 / (2 * 1e-2 * sw.sum()), fit_intercept=False, tol=1e-10, max_iter=10_000)
    ref.fit(
        np.hstack([torch.cat(logps, 1).double().numpy(), np.ones((len(y), 1))]), y.numpy(), sample_weight=sw
    )
    assert np.allclose(w.numpy(), ref.coef_[:, :-1], atol=2e-3) and np.allclose(
        b.numpy(), ref.coef_[:, -1], atol=2e-3
    )


def test_weights_are_the_best_grid_point_by_held_out_cross_entropy():
    logps, y = _logps(seed=1)
    w, b, mix = fit_combiner(logps, y, "weights")
    losses = {
        m: float(nn.functional.cross_entropy(m[0] * logps[0] + m[1] * logps[1], y)) for m in weight_grid(2)
    }
    assert len(losses) == 21 and mix == min(losses, key=losses.get)
    assert torch.equal(w, torch.cat([mix[0] * torch.eye(3), mix[1] * torch.eye(3)], 1)) and not b.any()
    assert (
        fit_weights([logps[0], logps[0] - 5.0 * logps[0].exp()], y)[0] == 1.0
    )  # a useless part gets no weight


class Fixed(nn.Module):
    """A 'model' whose logits for row i are a fixed table's row i (inputs are row indices)."""

    def __init__(self, table):
        super().__init__()
        self.register_buffer("table", table)

    def forward(self, x):
        return self.table[x[:, 0].long()]


@pytest.mark.parametrize("mode", ["weights", "stack"])
def test_the_combination_beats_the_worse_part_and_here_both(mode):
    """Part A knows classes 0-1, part B classes 2-3 (each guesses elsewhere): fused, they know all four."""
    g = torch.Generator().manual_seed(0)
    n, c = 800, 4
    y = torch.randint(0, c, (n,), generator=g)
    onehot = nn.functional.one_hot(y, c).float()
    noise = 0.3 * torch.randn(n, c, generator=g)
    a = noise + 3.0 * onehot * (y < 2)[:, None]
    b = noise.flip(1) + 3.0 * onehot * (y >= 2)[:, None]
    idx = torch.arange(n)[:, None].float()
    parts = [Fixed(a), Fixed(b)]
    held, test = torch.arange(0, 300), torch.arange(300, n)
    w, bias, _ = fit_combiner([log_probs(m, idx[held]) for m in parts], y[held], mode)
    z = torch.cat([log_probs(m, idx[test]) for m in parts], 1) @ w.T + bias
    acc = float((z.argmax(1) == y[test]).float().mean())
    accs = [float((m(idx[test]).argmax(1) == y[test]).float().mean()) for m in parts]
    assert acc >= min(accs)
    assert acc > max(accs) + 0.1


def _site(n=60, mode="stack", seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n + 20, 5, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    keep, held = holdout_rows(len(y), 0.25, 11, 0)
    settings = DPSGDSettings(
        seed=seed,
        batch_size=15,
        lr=0.05,
        weight_decay=0.0,
        private=False,
        noise_multiplier=1.0,
        clip=1.0,
        delta=1e-5,
        accountant="rdp",
        target_epsilon=None,
        dp_backend="auto",
    )
    site = DPSGDSite(
        0,
        x[keep],
        y[keep],
        ModelSpec("logreg", (5,), 3),
        settings,
        private_spec=ModelSpec("tabmlp", (5,), 3),
        shared_field="proxy",
    )
    site.combination = Combination(CombineSettings(mode=mode, epochs=2, seed=seed), x[held], y[held])
    for rnd in (1, 2):
        site.train(rnd)
    return site, x, y, torch.as_tensor(held)


def test_combination_never_reads_the_test_split():
    site, x, y, held = _site()
    clean = (x[:40], y[:40])
    poisoned = (x[:40], (y[:40] + 1) % 3)  # every test label wrong
    fitted = []
    for test in (clean, poisoned):
        site.tests = {"external": test, "internal": test}
        reply = site.on_evaluate(Message({"score": True, "internal": True}))
        fitted.append((site.combination.weight.clone(), site.combination.bias.clone()))
        assert "combined_acc" in reply.meta["accs"] and "combined_acc" in reply.meta["internal"]
    assert torch.equal(fitted[0][0], fitted[1][0]) and torch.equal(fitted[0][1], fitted[1][1])
    # and it is exactly the fit on the held-out rows' log-probabilities of the site's own and DP models
    expect, _, _ = fit_combiner(
        [log_probs(site.private, x[held]), log_probs(site.shared, x[held])], y[held], "stack", balance=True
    )  # the default: class-balanced
    assert torch.equal(fitted[0][0], expect)
    assert site.combination.roles == ["private", "proxy"]
    assert site.metric_label("combined_acc") == "non-private"


def test_a_site_without_its_own_model_trains_one_without_dp_and_keeps_the_combined_figure(tmp_path):
    import json

    site, x, y, held = _site(mode="weights")
    site.private, site.private_opt = None, None  # as FedAvg's site: only the shared model
    site.release_nonprivate, site.folder = False, tmp_path
    site.tests = {"external": (x[:40], y[:40])}
    reply = site.on_evaluate(Message({"score": True, "round": 2}))
    assert "combined_acc" not in reply.meta["accs"]  # non-private: kept in the site's own folder
    kept = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert 0.0 <= kept["combined_acc"] <= 1.0
    assert site.combination.roles == ["own", "proxy"] and site.combination.own is not None


def test_combine_options_are_checked():
    base = dict(method="fedavg", dataset="digits", clients=2, rounds=1)
    for bad, msg in (
        (dict(combine="mean"), "unknown combine"),
        (dict(combine="stack", combine_holdout=1.0), "(0, 1)"),
        (dict(combine_epochs=0), "at least 1"),
        (dict(combine_l2=-1.0), "positive"),
    ):
        with pytest.raises(ConfigError, match=msg):
            RunConfig.from_dict({**base, **bad}).resolve()
