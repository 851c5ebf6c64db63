from silofl.data.datasets import Dataset, load_dataset, read_idx
from silofl.data.partition import dirichlet, iid, p_major, partition

__all__ = ["Dataset", "load_dataset", "read_idx", "partition", "p_major", "iid", "dirichlet"]
