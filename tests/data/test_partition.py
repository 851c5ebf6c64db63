import numpy as np
import pytest

from silofl.core.errors import ConfigError
from silofl.data import dirichlet, iid, p_major

LABELS = np.repeat(np.arange(10), 600)


def disjoint(shards):
    all_idx = np.concatenate(shards)
    return len(all_idx) == len(set(all_idx.tolist()))


def test_p_major_skew_and_disjointness():
    shards = p_major(LABELS, 8, 500, 0.8, np.random.default_rng(0))
    assert disjoint(shards) and all(len(s) == 500 for s in shards)
    majors = []
    for s in shards:
        counts = np.bincount(LABELS[s], minlength=10)
        majors.append(counts.argmax())
        assert counts.max() == 400  # ⌊0.8·500⌋ from the major class
    assert len(set(majors)) == 8  # distinct major classes while K ≤ C


@pytest.mark.parametrize("p", [0.0, 1.0])
def test_p_major_edges(p):
    shards = p_major(LABELS, 3, 100, p, np.random.default_rng(0))
    assert disjoint(shards)


def test_p_major_errors():
    with pytest.raises(ConfigError, match=r"\[0, 1\]"):
        p_major(LABELS, 2, 10, 1.5, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="exceeds"):
        p_major(LABELS, 20, 1000, 0.5, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="class"):
        p_major(LABELS, 2, 1000, 0.9, np.random.default_rng(0))  # 900 > 600 of one class


def test_iid_and_dirichlet():
    s = iid(LABELS, 5, 1000, np.random.default_rng(0))
    assert disjoint(s) and all(len(x) == 1000 for x in s)
    d = dirichlet(LABELS, 6, 900, 0.1, np.random.default_rng(0))
    assert disjoint(d) and all(len(x) == 900 for x in d)
    # small alpha: skewed clients
    assert np.mean([np.bincount(LABELS[x], minlength=10).max() / 900 for x in d]) > 0.4
