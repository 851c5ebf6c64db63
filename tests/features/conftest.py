import pytest
import torch


@pytest.fixture(autouse=True)
def _feature_cache(tmp_path, monkeypatch):
    """Every test's features are cached under its own tmp_path (never ~/.cache), also in processes it starts;
    one torch thread (small batches: a second thread only spins on a shared machine)."""
    monkeypatch.setenv("SILOFL_CACHE", str(tmp_path / "cache"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
