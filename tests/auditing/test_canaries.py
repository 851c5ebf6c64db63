"""The audit's data sets and the bound over score types × k."""

import numpy as np
import pytest
import torch

from silofl.auditing.bound import k_grid, one_run_bound
from silofl.auditing.canaries import Pool, draw
from silofl.core.errors import ConfigError


def _pool(n_train=600, n_test=200, classes=4, used=200):
    g = torch.Generator().manual_seed(0)
    x_tr, y_tr = torch.randn(n_train, 3, generator=g), torch.arange(n_train) % classes
    x_te, y_te = torch.randn(n_test, 3, generator=g), torch.arange(n_test) % classes
    return Pool(x_tr, y_tr, np.arange(used), x_te, y_te), y_tr[:used]


def test_sets_are_disjoint_and_avoid_what_sites_train_on():
    pool, member_y = _pool()
    d = draw(
        pool, member_y[member_y < 2], 4, canaries=100, nonmembers=80, references=3, reference_size=50, seed=1
    )
    ids = {
        name: set(r.ids()) for name, r in (("can", d.canaries), ("non", d.nonmembers), ("pop", d.population))
    }
    assert not ids["can"] & ids["non"] and not ids["can"] & ids["pop"] and not ids["non"] & ids["pop"]
    everything = ids["can"] | ids["non"] | ids["pop"] | {i for r in d.references for i in r.ids()}
    assert not {f"train:{i}" for i in range(200)} & everything  # rows the sites train on are never used
    for r in d.references:
        assert not set(r.ids()) & (ids["can"] | ids["non"] | ids["pop"])
    # non-members follow the members' classes (only classes 0 and 1 here)
    assert set(d.nonmembers.y.tolist()) <= {0, 1}
    # canaries carry a wrong label; the coins are about half
    assert (d.canaries.y.numpy() != d.canary_true_labels).all()
    assert 30 < d.included.sum() < 70
    assert len(d.canaries_in) == d.included.sum()


def test_coins_do_not_change_which_canaries_exist():
    a = draw(_pool()[0], _pool()[1], 4, canaries=50, nonmembers=40, references=0, reference_size=10, seed=5)
    b = draw(_pool()[0], _pool()[1], 4, canaries=50, nonmembers=40, references=0, reference_size=10, seed=5)
    assert a.canaries.ids() == b.canaries.ids() and (a.included == b.included).all()


def test_too_small_a_pool_is_a_clear_error():
    pool, member_y = _pool(n_train=300, n_test=0, used=200)
    with pytest.raises(ConfigError, match="examples no site trains on"):
        draw(pool, member_y, 4, canaries=100, nonmembers=50, references=0, reference_size=10, seed=0)


def test_bound_separates_perfect_from_random_scores():
    rng = np.random.default_rng(0)
    inc = rng.random(1000) < 0.5
    perfect = one_run_bound({"s": inc + 0.01 * rng.standard_normal(1000)}, inc, 1e-5)
    assert (
        perfect["correct"] == perfect["guesses"] == 400
    )  # k = 500 would need 500 included: the coins gave fewer
    assert 4.0 < perfect["epsilon_lower_bound"] <= perfect["max_auditable_epsilon"] < 5.8
    noise = one_run_bound({"a": rng.standard_normal(1000), "b": rng.standard_normal(1000)}, inc, 1e-5)
    assert noise["epsilon_lower_bound"] < 0.3
    assert noise["hypotheses"] == 2 * len(k_grid(1000))
    assert k_grid(1000) == [5, 10, 25, 50, 100, 200, 500]
