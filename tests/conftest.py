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


# the longest files, longest first (measured: `--durations` of scripts/test.sh); only the schedule: a file
# missing here or out of order costs time, never a result
LONGEST = (
    "tests/deploy/test_readme_site_commands.py",
    "tests/deploy/test_deploy_local.py",
    "tests/secure/test_deploy.py",
    "tests/comm/test_torchdist.py",
    "tests/cli/test_readme_commands.py",
    "tests/comm/test_faults.py",
    "tests/secure/test_cli.py",
)


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``-n``, scripts/test.sh), the longest files go first, then the other files with
    deployments and process groups: ``--dist loadfile`` hands out whole files in collection order, so the
    longest start early and the run does not end waiting on one of them. A serial run keeps pytest's order."""
    if not getattr(config.option, "numprocesses", None):
        return
    weight = {"deploy": 0, "multiprocess": 1, "slow": 2}
    rank: dict[str, tuple[int, int]] = {}
    for item in items:
        f = item.nodeid.split("::")[0]
        marks = [weight[m.name] for m in item.iter_markers() if m.name in weight]
        first = LONGEST.index(f) if f in LONGEST else len(LONGEST)
        rank[f] = (first, min(rank.get(f, (0, 3))[1], *marks) if marks else rank.get(f, (0, 3))[1])
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])  # stable: a file's tests stay in order
