"""Scoring many models at once gives the accuracies of scoring each alone."""

import pytest
import torch
from torch import nn

from silofl.models import build_model
from silofl.training.evaluation import accuracies, accuracy


@pytest.mark.parametrize(
    "arch,shape",
    [
        ("lenet5", (1, 28, 28)),
        ("cnn1", (1, 28, 28)),
        ("cnn2", (3, 32, 32)),
        ("mlp", (1, 28, 28)),
        ("logreg", (1, 8, 8)),
    ],
)
def test_batched_accuracies_equal_one_by_one(arch, shape):
    torch.manual_seed(0)
    models = [build_model(arch, shape, 10) for _ in range(3)]
    x = torch.randn(160, *shape)
    y = torch.randint(0, 10, (160,))
    # a trained-looking model: labels from model 0's own predictions, so accuracies are far from chance
    with torch.no_grad():
        y[:80] = models[0](x[:80]).argmax(1)
    alone = [accuracy(m, x, y, batch_size=64) for m in models]
    assert accuracies(models, x, y, batch_size=64) == alone
    assert alone[0] >= 0.5


def test_mixed_architectures_keep_their_order():
    torch.manual_seed(1)
    models = [build_model("mlp", (1, 8, 8), 10), build_model("lenet5", (1, 28, 28), 10)]
    models = [models[0], nn.Sequential(nn.Flatten(), nn.Linear(64, 10)), models[0]]
    x, y = torch.randn(50, 1, 8, 8), torch.randint(0, 10, (50,))
    assert accuracies(models, x, y) == [accuracy(m, x, y) for m in models]
