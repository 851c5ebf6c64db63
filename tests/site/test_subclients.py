"""silofl.site.subclients.SubclientSite directly: its split, one round's update message, labels and ε,
its state."""

import pytest
import torch

from silofl.comm.wire import decode
from silofl.models import ModelSpec
from silofl.site.subclients import NORM_SUM, STEPS, UNCLIPPED, UNITS, SubclientSettings, SubclientSite

SPEC = ModelSpec("logreg", (1, 8, 8), 10)


def _site(cid=0, private=True, unit="hospital", seed=3, n=60):
    g = torch.Generator().manual_seed(cid)
    x, y = torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)
    return SubclientSite(
        cid,
        x,
        y,
        SPEC,
        SubclientSettings(
            seed=seed,
            batch_size=10,
            local_epochs=1,
            local_lr=0.1,
            private=private,
            privacy_unit=unit,
            normalise=False,
            clip=0.01,
        ),
    )


def test_a_seeded_site_draws_its_own_split_and_an_unseeded_one_a_secret_one():
    assert torch.equal(_site(0).perm, _site(0).perm) and not torch.equal(_site(0).perm, _site(1).perm)
    assert sorted(_site(0).perm.tolist()) == list(range(60))
    assert not torch.equal(_site(0, seed=None).perm, _site(0, seed=None).perm)


@pytest.mark.parametrize("unit", ["hospital", "subclient"])
def test_one_round_clips_every_subclients_update_and_says_how_many_units_it_sent(unit):
    site = _site(unit=unit)
    site.v = 3  # as a broadcast would set it
    tensors, meta = decode(site.train(rnd=2))
    assert meta == {"round": 2, "src": 0, "v": 3}
    # three updates of norm at most clip = 0.01 each (logistic regression moves far more in 2 steps at lr 0.1)
    assert float(torch.linalg.vector_norm(tensors["update"])) <= 3 * 0.01 + 1e-6
    assert float(tensors[NORM_SUM]) == pytest.approx(3 * 0.01) and float(tensors[UNCLIPPED]) == 0.0
    assert float(tensors[UNITS]) == (1.0 if unit == "hospital" else 3.0)
    assert float(tensors[STEPS]) == 3 * 2  # 20 examples a sub-client, batch 10, one epoch
    assert site.last_train["subclients"] == 3 and site.last_train["local_steps"] == 6


def test_labels_and_epsilon_follow_the_servers_dp_release_and_the_unit():
    site = _site(unit="subclient")
    site.eps = {"hospital": 2.0, "subclient": 0.7}
    assert site.epsilon() == 0.7 and _site(private=False).epsilon() is None
    assert (
        site.metric_label("global_acc"),
        site.metric_label("subclients"),
        site.metric_label("update_norm_mean"),
    ) == ("dp", "public", "non-private")
    assert _site(private=False).metric_label("global_acc") == "non-private"
    scores = site.evaluate(site.x, site.y)
    assert {"global_acc", "global_auroc", "global_f1"} <= set(scores) and 0.0 <= scores["global_acc"] <= 1.0


def test_state_round_trips_exactly():
    a = _site()
    a.v, a.clip, a.eps = 2, 0.5, {"hospital": 1.0, "subclient": 0.4}
    a.train(rnd=1)
    b = _site(seed=99)
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.perm, b.perm) and (b.v, b.clip, b.eps, b.rounds_trained) == (2, 0.5, a.eps, 1)
    assert all(
        torch.equal(p, q)
        for p, q in zip(a.model.state_dict().values(), b.model.state_dict().values(), strict=True)
    )
    assert torch.equal(
        decode(a.train(rnd=2))[0]["update"], decode(b.train(rnd=2))[0]["update"]
    )  # same generator
