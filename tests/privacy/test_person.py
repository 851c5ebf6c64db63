"""Person-level DP-SGD (--id-column): a person's rows' gradients summed and clipped together (against a hand
computation), person Poisson sampling takes all of a person's rows or none, and the accountant's q is over
persons (against Opacus' RDP accountant)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from silofl.privacy.dpsgd import DPGradient
from silofl.privacy.grad_sample import GhostClipper, VmapClipper
from silofl.privacy.noise import NoiseSource
from silofl.privacy.person import PersonIndex, group_pairs, id_like, id_named


def ce(logits, y):
    return F.cross_entropy(logits, y, reduction="none")


def hand_clipped_sum(model, x, y, groups, clip):
    """Per-row gradients one by one, summed per person, each sum clipped to C (Opacus' rule), then summed."""
    params = list(model.parameters())
    per_row = []
    for i in range(len(y)):
        g = torch.autograd.grad(ce(model(x[i : i + 1]), y[i : i + 1]).sum(), params)
        per_row.append(torch.cat([t.flatten() for t in g]))
    persons = [torch.stack([per_row[i] for i in range(len(y)) if groups[i] == p]).sum(0) for p in range(2)]
    norms = torch.stack([p.norm() for p in persons])
    total = sum(p * min(1.0, clip / (float(p.norm()) + 1e-6)) for p in persons)
    return total, norms


def close(a, b):  # (torch.testing.assert_close imports torch.distributed: seconds in a fast test)
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (a, b)


def flat(grads, model):
    return torch.cat([grads[p].flatten() for p in model.parameters()])


@pytest.mark.parametrize("clipper", [GhostClipper, VmapClipper])
def test_a_persons_rows_are_summed_then_clipped_together_as_by_hand(clipper):
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    x, y = torch.randn(4, 3) * 3, torch.tensor([0, 1, 1, 0])
    groups = torch.tensor([0, 0, 1, 0])  # person 0 has 3 rows, person 1 one
    clip = 0.5
    want, norms = hand_clipped_sum(model, x, y, groups, clip)
    assert float(norms.max()) > clip  # the clip binds for at least one person
    _, grads, sq = clipper(model).clipped_sum(x, ce, (y,), clip, groups=groups)
    close(sq.sqrt(), norms)
    close(flat(grads, model), want)
    # row-level clipping differs: the person's 3 rows would move the sum by up to 3C
    _, rows, _ = clipper(model).clipped_sum(x, ce, (y,), clip)
    assert not torch.allclose(flat(rows, model), want)


def test_ghost_and_vmap_agree_on_an_mlp_with_groupnorm_and_the_dp_gradient_divides_by_expected_persons():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(5, 8), nn.GroupNorm(2, 8), nn.ReLU(), nn.Linear(8, 3))
    x, y = torch.randn(9, 5), torch.randint(0, 3, (9,))
    groups = torch.tensor([2, 0, 1, 0, 2, 2, 1, 3, 0])
    _, g1, s1 = GhostClipper(model).clipped_sum(x, ce, (y,), 0.3, groups=groups)
    _, g2, s2 = VmapClipper(model).clipped_sum(x, ce, (y,), 0.3, groups=groups)
    close(s1, s2)
    close(flat(g1, model), flat(g2, model))
    dp = DPGradient(model, 0.3, 0.0, 2.5, NoiseSource(0), sample_rate=0.5)
    dp.person_level = True
    with pytest.raises(ValueError, match="needs each row's person"):
        dp.compute(x, ce, y)
    _, st = dp.compute(x, ce, y, groups=groups)
    assert st.batch_size == 4  # persons, not rows
    got = torch.cat([p.grad.flatten() for p in model.parameters()])
    close(got, flat(g1, model) / 2.5)


def test_group_pairs_are_every_pair_within_a_group():
    groups = torch.tensor([1, 0, 1, 2, 1])
    i, j = group_pairs(groups)
    got = sorted(zip(i.tolist(), j.tolist(), strict=True))
    want = sorted((a, b) for a in range(5) for b in range(5) if groups[a] == groups[b])
    assert got == want


def test_person_sampling_takes_all_of_a_persons_rows_or_none():
    ids = np.array(["a", "b", "a", "c", "b", "a", "d", "c"])
    index = PersonIndex.from_ids(ids)
    assert index.count == 4 and index.max_rows == 3
    rng = torch.Generator().manual_seed(0)
    sizes = set()
    for _ in range(200):
        rows, groups = index.batch(0.5, rng)
        chosen = set(ids[rows.numpy()])
        assert set(rows.tolist()) == {i for i, v in enumerate(ids) if v in chosen}  # all rows, or none
        for r, g in zip(rows.tolist(), groups.tolist(), strict=True):  # one number per sampled person
            assert [ids[s] for s, h in zip(rows.tolist(), groups.tolist(), strict=True) if h == g] == [
                ids[r]
            ] * sum(1 for s in rows.tolist() if ids[s] == ids[r])
        assert sorted(set(groups.tolist())) == list(range(len(chosen)))
        sizes.add(len(chosen))
    assert sizes == {0, 1, 2, 3, 4}  # persons join independently: every batch size occurs


def test_an_id_is_recognised_by_name_or_cardinality_and_only_when_it_repeats():
    assert id_named("patient_id") and id_named("personId") and id_named("MRN") and id_named("subject")
    assert not id_named("paid") and not id_named("covid") and not id_named("age")
    assert id_like("pid", np.array([1, 2, 2, 3])) == 2
    assert id_like("pid", np.array([1, 2, 3, 4])) == 0  # unique: a row is a person
    assert id_like("code", np.array(["x1", "x2", "x3", "x1", "x4", "x1"])) == 3  # high cardinality
    assert id_like("ward", np.array(["a", "b", "a", "b", "a", "b"])) == 0  # low cardinality, not an id name
    assert id_like("code", np.array(["x1", "x2", "x3", "x1"]), by_name_only=True) == 0
