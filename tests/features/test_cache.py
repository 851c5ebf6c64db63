"""The feature cache: identical tensors back, keyed by each example's content and the stage's exact spec."""

import torch

from silofl.features import apply
from silofl.features.cache import FeatureCache, stage_key
from silofl.features.scatter import ScatterFeatures


class Counting(ScatterFeatures):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.rows = 0

    def transform(self, x):
        self.rows += len(x)
        return super().transform(x)


def test_cache_returns_identical_tensors_and_is_keyed_by_content(tmp_path):
    x = torch.rand(10, 1, 16, 16, generator=torch.Generator().manual_seed(1))
    stage = Counting(j=2)
    first = apply(stage, x, tmp_path)
    assert stage.rows == 10
    again = apply(Counting(j=2), x, tmp_path)
    assert torch.equal(first, again)
    # other tensors holding the same rows (a subset, another order, duplicated) read them back: nothing
    # computed
    s2 = Counting(j=2)
    perm = torch.tensor([7, 3, 3, 0])
    assert torch.equal(apply(s2, x[perm], tmp_path), first[perm]) and s2.rows == 0
    # a changed row is computed, alone
    y = x.clone()
    y[5] += 0.5
    s3 = Counting(j=2)
    out = apply(s3, y, tmp_path)
    assert s3.rows == 1 and torch.equal(out[:5], first[:5]) and not torch.equal(out[5], first[5])
    assert torch.equal(out[5], ScatterFeatures(j=2).transform(y[5:6])[0])


def test_key_follows_the_stage_spec(tmp_path):
    assert stage_key(ScatterFeatures(j=2), (1, 16, 16)) != stage_key(ScatterFeatures(j=1), (1, 16, 16))
    assert stage_key(ScatterFeatures(j=2), (1, 16, 16)) != stage_key(ScatterFeatures(j=2), (1, 32, 32))
    x = torch.rand(3, 1, 16, 16)
    apply(ScatterFeatures(j=2), x, tmp_path)
    s = Counting(j=1)
    assert apply(s, x, tmp_path).shape == (3, 9, 8, 8) and s.rows == 3


def test_damaged_chunk_is_recomputed(tmp_path):
    x = torch.rand(4, 1, 16, 16)
    good = apply(ScatterFeatures(j=2), x, tmp_path)
    cache = FeatureCache(tmp_path, ScatterFeatures(j=2), (1, 16, 16))
    for f in cache.dir.glob("*.npy"):
        f.write_bytes(b"not a numpy file")
    assert torch.equal(apply(ScatterFeatures(j=2), x, tmp_path), good)
