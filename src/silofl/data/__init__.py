"""Data sets from the standard files, their partition among clients, and the split a run trains on."""

from silofl.data.datasets import load_dataset, read_idx
from silofl.data.partition import dirichlet, iid, p_major, partition
from silofl.data.types import Dataset, SplitData

__all__ = ["Dataset", "SplitData", "load_dataset", "read_idx", "partition", "p_major", "iid", "dirichlet"]
