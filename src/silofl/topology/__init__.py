from silofl.topology.graphs import (
    ExponentialGraph,
    RingGraph,
    StaticGraph,
    exponential_hops,
    in_neighbors,
    make_graph,
)
from silofl.topology.pushsum import combine, share

__all__ = [
    "ExponentialGraph",
    "RingGraph",
    "StaticGraph",
    "exponential_hops",
    "in_neighbors",
    "make_graph",
    "combine",
    "share",
]
