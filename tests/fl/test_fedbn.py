"""FedBN: the normalisation layers stay at each site (never sent, never averaged), everything else is
averaged; a BatchNorm model is refused under DP with the GroupNorm variant named; the norm parameters
train inside the DP model."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from silofl.comm.messages import Message, Packet
from silofl.comm.wire import decode, encode
from silofl.core.errors import ConfigError
from silofl.fl.exchange.centralized import WEIGHT_KEY
from silofl.fl.methods.fedbn import fedbn_keys, norm_keys, shared_keys
from silofl.fl.methods.fedper import PersonalHeadSite
from silofl.models import ModelSpec
from silofl.runner.config import RunConfig
from tests.fl.test_fedprox import data, settings

GN = ModelSpec("cnn-gn", (1, 8, 8), 10)
NORM = {"norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"}


def test_the_norm_layers_are_kept_and_everything_else_is_shared():
    model = GN.build()
    assert set(norm_keys(model)) == NORM
    assert set(fedbn_keys(GN, True)) == set(model.state_dict()) - NORM


def test_batchnorm_is_refused_under_dp_naming_the_groupnorm_variant_and_kept_whole_without_dp():
    bn = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(144, 10))
    with pytest.raises(ConfigError, match="BatchNorm.*--proxy-model cnn-gn") as e:
        shared_keys(bn, "bncnn", private=True)
    assert "\n" not in str(e.value)
    kept = set(bn.state_dict()) - set(shared_keys(bn, "bncnn", private=False))
    assert kept == {"1.weight", "1.bias", "1.running_mean", "1.running_var", "1.num_batches_tracked"}
    with pytest.raises(ConfigError, match="'mlp' has none: use --proxy-model cnn-gn"):
        fedbn_keys(ModelSpec("mlp", (1, 8, 8), 10), True)


def test_a_site_sends_no_norm_parameter_keeps_its_own_and_trains_them_with_dp():
    x, y = data()
    keys = fedbn_keys(GN, True)
    site = PersonalHeadSite(
        0, x, y, GN, settings(True, local_steps=2), shared_field="private", shared_keys=keys
    )
    before = site.shared_state()
    site.train(1)
    after = site.shared_state()
    assert site.accountant.steps == 2  # the whole model's DP steps, norm parameters included
    assert all(not torch.equal(before[k], after[k]) for k in NORM)  # trained (with DP) like the rest
    sent, _ = decode(site.payload(1))
    assert set(sent) == set(keys) and not NORM & set(sent)
    new = {k: v + 0.25 for k, v in after.items() if k in keys}
    r = site.on_receive_global(Message({"round": 1}, [Packet(3, 0, encode(new, {"round": 1, "src": 3}))]))
    assert r.meta["rejected"] == []
    now = site.shared_state()
    assert all(torch.equal(now[k], new[k]) for k in keys)
    assert all(torch.equal(now[k], after[k]) for k in NORM)  # the site's own, untouched by the broadcast


def test_the_server_averages_everything_but_the_norm_layers():
    cfg = RunConfig.from_dict({"method": "fedbn", "clients": 2, "seed": 0}).resolve()
    assert cfg.options.proxy_model == "cnn-gn"  # FedBN's default: a model with GroupNorm
    server = (
        cfg.info.cls(cfg)
        .make_coordinator(2, SimpleNamespace(input_shape=(1, 8, 8), num_classes=10), torch.device("cpu"))
        .server
    )
    start = {k: v.clone() for k, v in server.state().items()}
    assert set(start) == set(GN.build().state_dict()) - NORM
    ups = [{k: v + d for k, v in start.items()} for d in (1.0, 4.0)]
    w = (1.0, 2.0)  # data sizes: the average is weighted by them
    packets = [
        Packet(
            k, 2, encode({**u, WEIGHT_KEY: torch.tensor(w[k], dtype=torch.float64)}, {"round": 1, "src": k})
        )
        for k, u in enumerate(ups)
    ]
    assert server.aggregate(1, packets, {0: 1.0, 1: 2.0}) == []
    for k, v in server.state().items():
        torch.testing.assert_close(v, start[k] + 3.0)  # (1·1 + 2·4) / 3
    assert not NORM & set(decode(server.payload(1))[0])
