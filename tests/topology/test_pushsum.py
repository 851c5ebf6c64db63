import torch

from silofl.topology import StaticGraph, combine, in_neighbors, share


def mix(states, weights, graph, self_weight, rnd=0):
    """One synchronous PushSum round over dict states (the same steps ProxyFLClient takes)."""
    K = len(states)
    out = graph.out_neighbors(rnd, list(range(K)))
    kept, msgs = {}, {k: [] for k in range(K)}
    for k in range(K):
        kept[k], each = share(weights[k], self_weight, len(out[k]))
        for d in out[k]:
            msgs[d].append((states[k], each))
    new = [combine(states[k], kept[k], msgs[k]) for k in range(K)]
    return [s for s, _ in new], [w for _, w in new]


def test_mass_is_conserved_and_debiased_values_converge_to_the_average():
    torch.manual_seed(0)
    graph = StaticGraph({0: [1, 2], 1: [2], 2: [0, 3], 3: [0]})  # strongly connected, not regular
    states = [{"w": torch.randn(5, dtype=torch.float64)} for _ in range(4)]
    weights = [1.0] * 4
    avg = sum(s["w"] for s in states) / 4
    mass0 = sum(w * s["w"] for s, w in zip(states, weights, strict=True))
    for t in range(200):
        states, weights = mix(states, weights, graph, self_weight=0.5, rnd=t)
        mass = sum(w * s["w"] for s, w in zip(states, weights, strict=True))
        torch.testing.assert_close(mass, mass0)
        assert abs(sum(weights) - 4.0) < 1e-9
    assert len(set(round(w, 6) for w in weights)) > 1  # de-biasing mattered: weights are not all equal
    for s in states:
        torch.testing.assert_close(s["w"], avg, rtol=1e-8, atol=1e-8)


def test_self_weight_zero_replaces_with_the_received_proxy():
    a, b = {"w": torch.ones(3)}, {"w": torch.zeros(3)}
    kept, each = share(1.0, 0.0, 1)
    assert (kept, each) == (0.0, 1.0)
    new, w = combine(a, kept, [(b, each)])
    assert torch.equal(new["w"], b["w"]) and w == 1.0


def test_nothing_received_and_nothing_kept_keeps_own():
    a = {"w": torch.ones(3)}
    new, w = combine(a, 0.0, [])
    assert torch.equal(new["w"], a["w"]) and w == 1.0


def test_in_neighbors():
    assert in_neighbors({0: [1], 1: [0, 2], 2: []}) == {0: [1], 1: [0], 2: [1]}


def test_complete_graph_with_self_weight_one_over_k_gives_every_site_the_exact_average_in_one_round():
    from silofl.topology.graphs import CompleteGraph

    torch.manual_seed(1)
    K = 5
    states = [{"w": torch.randn(4, dtype=torch.float64)} for _ in range(K)]
    avg = sum(s["w"] for s in states) / K
    new, weights = mix(states, [1.0] * K, CompleteGraph(), self_weight=1.0 / K)
    for s, w in zip(new, weights, strict=True):
        torch.testing.assert_close(s["w"], avg, rtol=1e-12, atol=1e-12)
        assert abs(w - 1.0) < 1e-12
