import math

import pytest

from silofl.topology import ExponentialGraph, RingGraph, StaticGraph, exponential_hops, in_neighbors


@pytest.mark.parametrize(
    "K,hops", [(2, [1]), (3, [1, 2]), (5, [1, 2, 4]), (8, [1, 2, 4]), (9, [1, 2, 4, 8]), (1, [])]
)
def test_exponential_hops(K, hops):
    assert exponential_hops(K) == hops


@pytest.mark.parametrize("K", [2, 5, 8, 16])
def test_exponential_schedule_matches_definition(K):
    g = ExponentialGraph()
    period = int(math.floor(math.log2(K - 1))) + 1
    for t in range(3 * period):
        out = g.out_neighbors(t, list(range(K)))
        h = 2 ** (t % period)
        for k in range(K):
            assert out[k] == [(k + h) % K]  # send to the peer 2^(t mod period) ahead
        inn = in_neighbors(out)
        for k in range(K):
            assert inn[k] == [(k - h) % K]  # receive from the one as far behind


def test_exponential_graph_skips_clients_that_left():
    out = ExponentialGraph().out_neighbors(1, [0, 2, 3, 5, 7])  # 5 active, hop 2 in round 1
    assert out == {0: [3], 2: [5], 3: [7], 5: [0], 7: [2]}
    assert ExponentialGraph().out_neighbors(0, [4]) == {4: []}


def test_ring_and_static():
    assert RingGraph().out_neighbors(0, [1, 2, 3]) == {1: [2], 2: [3], 3: [1]}
    g = StaticGraph({0: [1, 2], 1: [2], 2: [0]})
    assert g.out_neighbors(0, [0, 2]) == {0: [2], 2: [0]}


def test_complete_graph_sends_to_every_other_active_client_and_graphs_are_one_registry():
    from silofl.fl.options import GRAPHS
    from silofl.topology.graphs import GRAPH_TYPES, CompleteGraph, make_graph

    assert CompleteGraph().out_neighbors(3, [0, 2, 5]) == {0: [2, 5], 2: [0, 5], 5: [0, 2]}
    assert set(GRAPHS) == set(GRAPH_TYPES)  # the CLI's choices are the registered graphs
    assert isinstance(make_graph("complete"), CompleteGraph)
    with pytest.raises(Exception, match="unknown graph 'star'"):
        make_graph("star")
