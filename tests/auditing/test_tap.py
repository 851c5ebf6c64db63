"""The auditor's seam: an observer around the engine sees exactly what leaves a site, and the research hooks
change a run only where asked (canaries in one site's data, extra sites)."""

import dataclasses

import pytest
import torch

from silofl.auditing.tap import TappedEngine, model_tensors, released_by
from silofl.comm.engine import InProcessEngine
from silofl.runner.config import RunConfig
from silofl.runner.loop import RunHooks, build

TINY = dict(
    dataset="digits",
    clients=3,
    rounds=2,
    samples_per_client=60,
    batch_size=30,
    delta=1e-3,
    private_model="mlp",
    proxy_model="mlp",
    test_limit=100,
    seed=4,
)


class Recorder:
    def __init__(self, site):
        self.site, self.seen, self.steps = site, [], []

    def before(self, step, requests, engine):
        self.steps.append(step)

    def after(self, step, requests, replies, engine):
        self.seen += [(step, p) for p in released_by(self.site, replies)]


def _rounds(coordinator, n):
    coordinator.start()
    for r in range(1, n + 1):
        coordinator.run_round(r)


@pytest.mark.slow
def test_tap_sees_what_leaves_the_site_and_changes_nothing():
    cfg = RunConfig.from_dict(TINY)
    rec = Recorder(1)
    _, _, plain, eng0 = build(cfg)
    _, _, tapped, eng1 = build(
        cfg, engine_factory=lambda make, n: TappedEngine({k: make(k) for k in range(n)}, [rec])
    )
    assert isinstance(eng1, TappedEngine) and isinstance(eng1, InProcessEngine)
    torch.manual_seed(0)
    _rounds(plain, 2)
    torch.manual_seed(0)
    _rounds(tapped, 2)
    # one proxy per round left site 1, to its neighbour, and it is the site's shared model of that moment
    assert [s for s, _ in rec.seen] == ["train_send", "train_send"]
    assert all(p.src == 1 and p.dst != 1 for _, p in rec.seen)
    assert set(model_tensors(rec.seen[0][1])) == set(eng1.sites[1].shared.state_dict())
    assert "train_send" in rec.steps and "receive" in rec.steps
    # observing changes nothing: same bytes, same models
    assert dict(eng0.bytes_sent) == dict(eng1.bytes_sent)
    for k in range(3):
        for a, b in zip(eng0.sites[k].shared.parameters(), eng1.sites[k].shared.parameters(), strict=True):
            assert torch.equal(a, b)


def test_split_hook_adds_examples_to_one_site_only():
    cfg = RunConfig.from_dict(TINY)
    extra = torch.zeros(7, *build(cfg)[1].input_shape), torch.zeros(7, dtype=torch.long)

    def add(run_cfg, split):
        assert run_cfg.batch_size == 30  # the hook sees the data-filled config
        parts = list(split.parts)
        parts[2] = (torch.cat([parts[2][0], extra[0]]), torch.cat([parts[2][1], extra[1]]))
        return dataclasses.replace(split, parts=parts)

    _, split, _, engine = build(cfg, hooks=RunHooks(split=add))
    assert [engine.sites[k].n for k in range(3)] == [60, 60, 67]
    assert len(split.indices) == 3 and all(len(i) == 60 for i in split.indices)
