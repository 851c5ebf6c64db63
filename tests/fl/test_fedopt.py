"""FedAdam / FedYogi on the average of example-level uploads, against a hand-written Adam / Yogi step
(numpy)."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from silofl.comm.messages import Packet
from silofl.comm.wire import encode
from silofl.fl.exchange.centralized import WEIGHT_KEY
from silofl.runner.config import RunConfig

DATA = SimpleNamespace(input_shape=(1, 8, 8), num_classes=10)


def hand_steps(w0, deltas, lr, b1, b2, tau, yogi):
    """w after one server step per round's mean update Δ̄ (pseudo-gradient −Δ̄), moments from 0, no bias
    correction."""
    w, m, u = w0.copy(), np.zeros_like(w0), np.zeros_like(w0)
    for d in deltas:
        m = b1 * m + (1 - b1) * d
        u = u - (1 - b2) * d * d * np.sign(u - d * d) if yogi else b2 * u + (1 - b2) * d * d
        w = w + lr * m / (np.sqrt(u) + tau)
    return w


def flat(state):
    return np.concatenate([v.double().numpy().ravel() for v in state.values()])


@pytest.mark.parametrize("method,yogi", [("fedavg-adam", False), ("fedavg-yogi", True)])
def test_the_server_steps_with_adam_or_yogi_on_the_weighted_average_of_the_uploads(method, yogi):
    cfg = RunConfig.from_dict(
        {
            "method": method,
            "clients": 3,
            "proxy_model": "logreg",
            "adam_beta2": 0.9,
            "server_lr": 0.05,
            "seed": 0,
        }
    ).resolve()
    proto = cfg.info.cls(cfg).make_coordinator(3, DATA, torch.device("cpu"))
    server = proto.server
    w0 = flat(server.state())
    g = torch.Generator().manual_seed(3)
    sizes = {0: 10.0, 1: 30.0, 2: 60.0}
    deltas, w = [], w0
    for rnd in (1, 2, 3):
        uploads = {
            k: {
                n: v + 0.01 * torch.randn(v.shape, generator=g) * (k + rnd) for n, v in server.state().items()
            }
            for k in sizes
        }
        packets = [
            Packet(
                k,
                3,
                encode(
                    {**s, WEIGHT_KEY: torch.tensor(sizes[k], dtype=torch.float64)}, {"round": rnd, "src": k}
                ),
            )
            for k, s in uploads.items()
        ]
        assert server.aggregate(rnd, packets, sizes) == []
        avg = sum(flat(s) * sizes[k] for k, s in uploads.items()) / sum(sizes.values())
        deltas.append(avg - w)
        w = flat(server.state())
        np.testing.assert_allclose(
            w, hand_steps(w0, deltas, 0.05, 0.9, 0.9, 1e-3, yogi).astype(np.float32), rtol=1e-5, atol=1e-6
        )
    other = hand_steps(w0, deltas, 0.05, 0.9, 0.9, 1e-3, not yogi)
    assert np.abs(other - w).max() > 1e-4  # Adam and Yogi part ways after the first round


def test_fedopt_defaults_and_refusals():
    cfg = RunConfig.from_dict({"method": "fedavg-yogi"}).resolve()
    assert cfg.options.server_lr == 0.03 and cfg.resolve() == cfg
    from silofl.core.errors import ConfigError

    with pytest.raises(ConfigError, match="adam_beta1 instead"):
        RunConfig.from_dict({"method": "fedavg-adam", "server_momentum": 0.9}).resolve()
    with pytest.raises(ConfigError, match="adam_beta2"):
        RunConfig.from_dict({"method": "fedavg-adam", "adam_beta2": 1.0}).resolve()
