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
    from silofl.runner.config import RunConfig

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


# The schedule under pytest-xdist (scripts/test.sh: two workers, ``--dist loadfile``, whole files each): xdist
# would hand out the files with the most tests first, which leaves the long files with few tests to the end,
# where one worker then runs them alone. They go first instead, beside the many short tests; the rest keep
# xdist's order. Measured on fresh clones: 10 min 3 s and 10 min 18 s with xdist's order, 9 min 13 s with
# these first. All the longest files first was slower (9 min 38 s against 9 min 2 s in one checkout): the
# README commands' test then shares the cores with the deployments' test.
FIRST = (
    "tests/deploy/test_readme_site_commands.py",
    "tests/secure/test_deploy.py",
    "tests/comm/test_faults.py",
    "tests/auditing/test_engines.py",  # 5 tests, two of them start processes: 11 min 33 s at the end (below)
)


def pytest_configure(config):
    """Keep the order :func:`pytest_collection_modifyitems` gives (xdist would sort files by test count)."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist: :data:`FIRST` first, then xdist's own order (the files with the most tests first;
    a file's tests stay in order). A worker knows itself by ``workerinput`` (its ``numprocesses`` is None); a
    serial run keeps pytest's order."""
    if not hasattr(config, "workerinput") and not getattr(config.option, "numprocesses", None):
        return
    count: dict[str, int] = {}
    for item in items:
        f = item.nodeid.split("::")[0]
        count[f] = count.get(f, 0) + 1

    def key(item) -> tuple[int, int]:
        f = item.nodeid.split("::")[0]
        return (FIRST.index(f) if f in FIRST else len(FIRST), -count[f])

    items.sort(key=key)
