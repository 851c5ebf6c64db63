"""The data types the loaders return and the split a run trains on."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Dataset:
    """A data set as loaded: training and test tensors, the classes, where it came from."""

    name: str
    x_train: torch.Tensor  # float32, N×C×H×W, normalised
    y_train: torch.Tensor  # int64
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    source: str
    class_names: list[str] | None = None
    groups: np.ndarray | None = None  # site of each training example (bags), for partition "site"
    test_groups: np.ndarray | None = None
    preprocessing: dict | None = None  # how raw inputs became x (silofl.data.preprocessing JSON), where known

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one example."""
        return tuple(self.x_train.shape[1:])

    def test_split(self, limit: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The test set, or its first ``limit`` examples."""
        if limit is None:
            return self.x_test, self.y_test
        return self.x_test[:limit], self.y_test[:limit]


@dataclass
class SplitData:
    """A data set split for a run: each client's training data, the shared test set, and (partition
    ``site``, per-site files) each client's own held-out test set. With per-site files each site prepares
    inputs its own way, so it also sees the shared test set through its own preprocessing (``external``,
    one per client; ``test`` is client 0's view) and ``preprocessing`` holds each client's (JSON)."""

    dataset: Dataset
    parts: list[tuple[torch.Tensor, torch.Tensor]]
    test: tuple[torch.Tensor, torch.Tensor]
    internal: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    sites: list[str] | None = None  # the site of each client (partition "site")
    test_set: str = "the data set's test split"
    external: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    preprocessing: list[dict] | None = None
    indices: list[np.ndarray] | None = None  # each client's rows of ``dataset.x_train`` (what it trains on)
    # after a feature stage (silofl.features): the shape of one example's features and the stage's record; the
    # tensors above then hold features, ``dataset`` the raw inputs
    feature_shape: tuple[int, ...] | None = None
    features: dict | None = None
    # person-level DP (--id-column, silofl.privacy.person): each client's training rows' person 0 … P−1, and
    # the column; without it, a column that looks like a repeated person id (summary's privacy_unit_warning)
    persons: list[torch.Tensor] | None = None
    id_column: str | None = None
    privacy_unit_warning: dict | None = None
    internal_persons: list[np.ndarray] | None = None  # --id-column: each site's held-out rows' person

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one example as the models see it (its features' shape after a feature stage)."""
        return self.feature_shape if self.feature_shape is not None else self.dataset.input_shape

    @property
    def num_classes(self) -> int:
        """The number of classes."""
        return self.dataset.num_classes

    @property
    def source(self) -> str:
        """Where the data set was read from."""
        return self.dataset.source
