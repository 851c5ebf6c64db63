import gzip
import struct

import numpy as np
import pytest
import torch

from silofl.core.errors import DataError
from silofl.data import load_dataset, read_idx
from silofl.data.datasets import IDX_FILES


def write_idx(path, arr, gz=False):
    header = struct.pack(">BBBB", 0, 0, 0x08, arr.ndim) + struct.pack(">" + "I" * arr.ndim, *arr.shape)
    data = header + arr.astype(np.uint8).tobytes()
    (gzip.open(path, "wb") if gz else open(path, "wb")).write(data)


def make_idx_set(root, n_train=30, n_test=10, gz=True):
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train_x": rng.integers(0, 256, (n_train, 28, 28)),
        "train_y": rng.integers(0, 10, n_train),
        "test_x": rng.integers(0, 256, (n_test, 28, 28)),
        "test_y": rng.integers(0, 10, n_test),
    }
    for k, stem in IDX_FILES.items():
        write_idx(root / (stem + (".gz" if gz else "")), arrays[k], gz=gz)
    return arrays


@pytest.mark.parametrize("gz,name", [(True, "fashion-mnist"), (False, "fashion-mnist"), (True, "mnist")])
def test_idx_dataset_from_data_dir(tmp_path, gz, name):
    arrays = make_idx_set(tmp_path / name, gz=gz)
    d = load_dataset(name, tmp_path)
    assert d.x_train.shape == (30, 1, 28, 28) and d.x_train.dtype == torch.float32
    assert float(d.x_train.max()) <= 1.0
    np.testing.assert_array_equal(d.y_test.numpy(), arrays["test_y"])
    np.testing.assert_allclose(d.x_train[3, 0].numpy() * 255, arrays["train_x"][3], atol=1e-3)


def test_idx_bad_magic_and_truncation(tmp_path):
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04junk")
    with pytest.raises(DataError, match="not an unsigned-byte IDX"):
        read_idx(tmp_path / "bad")
    write_idx(tmp_path / "ok", np.zeros((4, 2, 2)))
    raw = (tmp_path / "ok").read_bytes()
    (tmp_path / "cut").write_bytes(raw[:-3])
    with pytest.raises(DataError, match="header says"):
        read_idx(tmp_path / "cut")


def test_missing_dataset_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr("silofl.data.datasets.search_roots", lambda d=None: [tmp_path])
    with pytest.raises(DataError, match="SILOFL_DATA/mnist"):
        load_dataset("mnist")


def test_npz_and_digits(tmp_path):
    rng = np.random.default_rng(1)
    np.savez(
        tmp_path / "data.npz",
        x_train=rng.integers(0, 256, (20, 8, 8), dtype=np.uint8),
        y_train=rng.integers(0, 3, 20),
        x_test=rng.integers(0, 256, (5, 8, 8), dtype=np.uint8),
        y_test=rng.integers(0, 3, 5),
    )
    d = load_dataset("npz", tmp_path)
    assert d.input_shape == (1, 8, 8) and d.num_classes <= 3
    with pytest.raises(DataError):
        load_dataset("npz", tmp_path / "nothing")
    dg = load_dataset("digits")
    assert dg.input_shape == (1, 16, 16) and len(dg.y_train) + len(dg.y_test) == 1797


def test_digits_read_from_the_file_equal_scikit_learns_loader():
    from sklearn.datasets import load_digits

    from silofl.data.datasets import digits_arrays

    images, target = digits_arrays()
    ref = load_digits()
    assert np.array_equal(images, ref.images) and np.array_equal(target, ref.target)
    assert images.dtype == ref.images.dtype and target.dtype == np.int64


def test_fashion_mnist_system_package_if_installed():
    try:
        d = load_dataset("fashion-mnist")
    except DataError:
        pytest.skip("Fashion-MNIST not installed here")
    assert d.x_train.shape == (60000, 1, 28, 28) and d.x_test.shape == (10000, 1, 28, 28)
    assert torch.bincount(d.y_test).tolist() == [1000] * 10


def test_cifar10_python_batches(tmp_path):
    import pickle

    rng = np.random.default_rng(2)
    d = tmp_path / "cifar-10-batches-py"
    d.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(d / name, "wb") as f:
            pickle.dump(
                {
                    b"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8),
                    b"labels": list(rng.integers(0, 10, 4)),
                },
                f,
            )
    ds = load_dataset("cifar10", tmp_path)
    assert ds.x_train.shape == (20, 3, 32, 32) and ds.x_test.shape == (4, 3, 32, 32)
    assert abs(float(ds.x_train.mean())) < 1.0  # normalised with the CIFAR-10 mean/std
