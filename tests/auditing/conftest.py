import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Audits on one torch thread (two threads on a busy 2-core machine ran many times slower); the setting is
    restored for the tests that follow."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
