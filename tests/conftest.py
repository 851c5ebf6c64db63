import os

import pytest
import torch

os.environ.setdefault("SILOFL_NO_PROGRESS", "1")
torch.set_num_threads(min(2, os.cpu_count() or 1))


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
