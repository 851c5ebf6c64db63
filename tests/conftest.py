import os

import pytest
import torch

os.environ.setdefault("SILOFL_NO_PROGRESS", "1")
# one intra-op thread per core: under pytest-xdist (scripts/test.sh) the workers share the cores
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // _workers)))


@pytest.fixture
def tiny_cfg(tmp_path):
    """A seconds-long ProxyFL config on scikit-learn's digits."""
    from silofl.run.config import RunConfig

    return RunConfig.from_dict(
        dict(
            dataset="digits",
            clients=4,
            rounds=3,
            samples_per_client=120,
            batch_size=30,
            delta=1e-3,
            private_model="cnn1",
            proxy_model="mlp",
            out=str(tmp_path / "run"),
            test_limit=200,
        )
    )


# The schedule under pytest-xdist (scripts/test.sh: two workers, ``--dist loadfile``) is xdist's own: files
# with the most tests first. Measured on this suite: 9 min 2 s; the longest files first
# (``--no-loadscope-reorder`` and a sort) 9 min 38 s, as the README commands' test then shares the cores with
# the deployments' test.
