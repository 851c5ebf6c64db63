import pytest
import torch

from silofl.fl.exchange import gossip
from silofl.fl.exchange.gossip import mix
from silofl.topology import combine, share


def bits(state):
    return {
        k: v.view(torch.int32) if v.dtype == torch.float32 else v.view(torch.int64) for k, v in state.items()
    }


def complete_round(k_sites, cache, seed=0):
    """Every site's mix on a complete graph (self-weight 1/K, unequal PushSum weights, magnitudes far apart),
    the senders' decoded tensors shared among the readers as the simulator's wire cache shares them."""
    g = torch.Generator().manual_seed(seed)
    states = [
        {
            "w": torch.randn(7, 5, generator=g) * torch.logspace(-30, 6, 5),
            "b": torch.randn(5, generator=g).double(),
        }
        for _ in range(k_sites)
    ]
    weights = [float(x) for x in torch.rand(k_sites, generator=g, dtype=torch.float64) + 0.5]
    kept, each = zip(*(share(w, 1.0 / k_sites, k_sites - 1) for w in weights), strict=True)
    sent = [{n: t.clone() for n, t in s.items()} for s in states]  # decoded once per payload
    got, want = [], []
    for i in range(k_sites):
        received = [(dict(sent[j]), each[j]) for j in range(k_sites) if j != i]
        got.append(mix(states[i], kept[i], received, cache))
        want.append(combine(states[i], kept[i], received))
    return got, want


@pytest.mark.parametrize("k_sites", [3, 5, 8, 12])
def test_mix_is_combine_bit_for_bit_with_each_mass_computed_once(k_sites):
    cache: dict = {}
    got, want = complete_round(k_sites, cache)
    for (g_state, g_w), (w_state, w_w) in zip(got, want, strict=True):
        assert g_w == w_w
        assert {k: torch.equal(v, bits(w_state)[k]) for k, v in bits(g_state).items()} == {
            "w": True,
            "b": True,
        }
    masses = [key for key in cache if isinstance(key, tuple) and key[0] == "pushsum mass"]
    assert len(masses) == k_sites  # one per sender, not one per (sender, reader)


def test_mix_past_the_budget_and_without_a_cache_is_still_combine(monkeypatch):
    monkeypatch.setattr(gossip, "MASS_CACHE_BYTES", 7 * 5 * 8 * 2)  # room for the first sender only
    cache: dict = {}
    got, want = complete_round(4, cache, seed=1)
    assert sum(isinstance(key, tuple) and key[0] == "pushsum mass" for key in cache) == 1
    none, _ = complete_round(4, None, seed=1)
    for (a, _), (b, _), (c, _) in zip(got, want, none, strict=True):
        assert all(torch.equal(bits(a)[k], bits(b)[k]) and torch.equal(bits(c)[k], bits(b)[k]) for k in b)
