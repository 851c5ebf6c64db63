"""A registered method on in-memory per-site arrays (silofl.runner.arrays): the adapter keeps one client per
site and refuses bad arrays; a run goes through the method's own sites, coordinator and the simulator engine,
and its ε is the server accountant's, checked against an independent accountant (Google's dp-accounting)."""

import dp_accounting
import numpy as np
import pytest
import torch

from silofl.core.errors import ConfigError
from silofl.runner.arrays import split_of_arrays, train_on_arrays
from silofl.runner.config import RunConfig
from silofl.training.local_sgd import local_updates


def _sites(k=3, n=40, d=4, seed=0, regression=False):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(k):
        x = rng.random((n + 5 * len(out), d))
        y = x[:, 0] - x[:, 1] if regression else (x[:, 0] > x[:, 1]).astype(int)
        out.append((x, y))
    return out


def test_the_adapter_keeps_one_client_per_site_and_refuses_bad_arrays():
    split = split_of_arrays(_sites())
    assert [len(y) for _, y in split.parts] == [40, 45, 50] and split.num_classes == 2
    assert split.parts[0][1].dtype == torch.long and split.sites == ["site0", "site1", "site2"]
    assert [len(i) for i in split.indices] == [40, 45, 50] and split.indices[1][0] == 40
    reg = split_of_arrays(_sites(regression=True), "regression")
    assert reg.num_classes == 1 and reg.parts[0][1].dtype == torch.float32
    with pytest.raises(ConfigError, match="differ in shape"):
        split_of_arrays([(np.zeros((3, 2)), np.zeros(3)), (np.zeros((3, 5)), np.zeros(3))])
    with pytest.raises(ConfigError, match="class labels"):
        split_of_arrays([(np.zeros((3, 2)), np.array([0, 1, 5]))], num_classes=2)
    with pytest.raises(ConfigError, match="unknown task"):
        split_of_arrays(_sites(), "ranking")


@pytest.mark.slow  # two rounds of dp-fedavg on three tiny sites (about 1–2 s on a quiet machine)
def test_a_registered_method_runs_on_arrays_and_reports_its_accountants_epsilon():
    cfg = RunConfig.from_dict(
        dict(
            method="dp-fedavg",
            dataset="table",
            data_at_sites=True,
            rounds=2,
            seed=5,
            noise_multiplier=1.3,
            delta=1e-3,
            batch_size=20,
            proxy_model="mlp64",
            local_lr=0.1,
        )
    )
    ran = train_on_arrays(cfg, _sites())
    assert ran.rounds == 2 and ran.plan.config.clients == 3 and ran.plan.batch_size == 20
    rep = ran.privacy()
    ref = dp_accounting.rdp.RdpAccountant()
    ref.compose(dp_accounting.GaussianDpEvent(1.3), 2)  # q = 1: every site every round
    assert rep["epsilon"] == pytest.approx(ref.get_epsilon(1e-3), rel=0.02) and rep["steps"] == 2
    # the released model is the server's, and every site holds the same broadcast
    model = ran.global_model()
    site = ran.engine.sites[0].final_models()["global"][0]
    pairs = zip(model.state_dict().values(), site.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


def test_local_updates_train_a_regression_target_and_take_fedproxs_term():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    x = torch.rand(32, 3)
    y = x[:, 0] * 2.0  # float: a regression target (mean squared error)
    shards = [torch.arange(32)]

    def update(mu):
        return local_updates(
            model, start, x, y, shards, 2, 8, 0.1, torch.Generator().manual_seed(1), prox_mu=mu
        )

    (plain, steps), (prox, _) = update(0.0)[0], update(5.0)[0]
    assert steps == 8 and torch.isfinite(plain).all()
    # the proximal pull towards the start shortens the update, never lengthens it by much
    assert not torch.equal(plain, prox) and prox.norm() < plain.norm()
