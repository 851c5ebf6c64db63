"""A DP-SGD site with the recipe: the EMA it evaluates and saves is the EMA of its round-end weights while it
exchanges the raw iterate, and its accountant counts exactly the steps the mechanism ran;
``round_schedule`` keeps today's q and steps by default."""

from copy import deepcopy

import pytest
import torch

from silofl.comm.wire import decode
from silofl.models import ModelSpec
from silofl.privacy import epsilon_of
from silofl.site.dpsgd import DPSGDSettings, DPSGDSite, round_schedule


def test_round_schedule_defaults_to_one_epoch_of_batch_size_and_takes_q_and_local_steps():
    assert round_schedule(1000, 250) == (0.25, 4)
    assert round_schedule(123, 30) == (30 / 123, 4)
    assert round_schedule(100, 250) == (1.0, 1)
    assert round_schedule(1000, 250, sample_rate=0.5) == (0.5, 2)
    assert round_schedule(1000, 250, sample_rate=1.0) == (1.0, 1)  # full batch
    assert round_schedule(1000, 250, sample_rate=0.1) == (0.1, 10)
    assert round_schedule(1000, 250, local_steps=1) == (0.25, 1)


def test_ema_is_what_is_evaluated_and_saved_the_raw_iterate_is_exchanged_and_the_accountant_is_exact():
    torch.manual_seed(0)
    x, y = torch.randn(40, 1, 6, 6), torch.randint(0, 3, (40,))
    s = DPSGDSettings(
        seed=3,
        batch_size=10,
        lr=0.05,
        weight_decay=0.0,
        private=True,
        noise_multiplier=1.3,
        clip=0.1,
        delta=1e-3,
        accountant="rdp",
        target_epsilon=None,
        dp_backend="auto",
        optimizer="sgd",
        momentum=0.9,
        nesterov=True,
        ema_decay=0.6,
        sample_rate=0.5,
        local_steps=3,
        augmult=2,
        aug_pad=1,
        aug_flip=True,
    )
    site = DPSGDSite(0, x, y, ModelSpec("logreg", (1, 6, 6), 3), s, shared_field="global")
    copy = DPSGDSite(0, x, y, ModelSpec("logreg", (1, 6, 6), 3), s, shared_field="global")
    ends = []
    for rnd in range(1, 4):
        site.train(rnd)
        ends.append(site.shared_state())
    e = ends[0]
    for w in ends[1:]:
        e = {k: 0.6 * e[k] + 0.4 * w[k] for k in e}
    released = site.final_models()["global"][0].state_dict()
    for k in e:
        torch.testing.assert_close(released[k], e[k])
        assert torch.equal(decode(site.payload(3))[0][k], ends[-1][k])  # the raw iterate crosses the boundary
        assert not torch.equal(released[k], ends[-1][k])
    rep = site.privacy_report()
    assert [tuple(h) for h in rep["history"]] == [(1.3, 0.5, 9)]  # 3 rounds × local_steps 3, merged
    assert rep["steps"] == 9 and rep["sample_rate"] == 0.5
    # ε of exactly what ran (dp-accounting's independent check is in tests/fl/test_recipe.py's whole run)
    assert rep["epsilon"] == pytest.approx(epsilon_of("rdp", ((1.3, 0.5, 9),), 1e-3), rel=1e-12)
    # a checkpoint carries the EMA and the augmentation's generator: a resumed site trains on identically
    copy.load_state_dict(deepcopy(site.state_dict()))  # as a checkpoint file would: no shared tensors
    for k, v in copy.released().state_dict().items():
        assert torch.equal(v, released[k])
    site.train(4)
    copy.train(4)
    for k, v in copy.released().state_dict().items():
        assert torch.equal(v, site.released().state_dict()[k])
