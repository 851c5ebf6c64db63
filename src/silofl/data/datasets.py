"""Image data sets from the standard files, as float tensors in N×C×H×W.

Search order for a data set's files: ``data_dir`` (the ``--data-dir`` flag), ``$SILOFL_DATA``,
``~/.cache/silofl``, then the Debian package location ``/usr/share/datasets`` (Fashion-MNIST ships
as ``dataset-fashion-mnist``). Each root is searched as-is and in a sub-folder named after the
data set. scikit-learn's bundled digits set is always available (upsampled 8×8 → 16×16 so the
convolutional models fit).

Every data set is an entry of :data:`DATASETS` (group ``silofl.datasets``): a loader and its metadata
(:data:`DATASET_META`). Another package adds one with :func:`register_dataset` in a module it names in that
entry-point group; the configuration's choices and checks read the registry.
"""

from __future__ import annotations

import gzip
import os
import pickle
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from silofl.core.errors import ConfigError, DataError
from silofl.core.registry import Registry
from silofl.data.formats import load_bags, load_image_folder
from silofl.data.types import Dataset

IDX_FILES = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
HOW_TO_GET = {
    "fashion-mnist": "install it with `apt-get install -y dataset-fashion-mnist` (Debian), or put the four "
    "IDX "
    "files (train-images-idx3-ubyte[.gz], …) in $SILOFL_DATA/fashion-mnist",
    "mnist": "put the four MNIST IDX files (train-images-idx3-ubyte[.gz], …) in $SILOFL_DATA/mnist",
    "cifar10": "put the CIFAR-10 python batches (cifar-10-batches-py/data_batch_1…5, test_batch) in "
    "$SILOFL_DATA",
    "npz": "pass --data-dir pointing at a .npz file (or a folder holding data.npz) with x_train, y_train, "
    "x_test, y_test",
}


def search_roots(data_dir: str | os.PathLike | None = None) -> list[Path]:
    """The folders searched for data set files, in order."""
    roots: list[Path] = []
    if data_dir:
        roots.append(Path(data_dir))
    if os.environ.get("SILOFL_DATA"):
        roots.append(Path(os.environ["SILOFL_DATA"]))
    roots.append(Path.home() / ".cache" / "silofl")
    roots.append(Path("/usr/share/datasets"))
    return roots


def _open_maybe_gz(path: Path) -> bytes:
    with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as f:
        return f.read()


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (optionally gzipped): unsigned-byte images or labels."""
    try:
        raw = _open_maybe_gz(path)
    except (OSError, EOFError) as e:
        raise DataError(f"cannot read IDX file {path}: {e}") from None
    if len(raw) < 4:
        raise DataError(f"IDX file {path} is truncated")
    zero, dtype_code, ndim = raw[0:2], raw[2], raw[3]
    if zero != b"\x00\x00" or dtype_code != 0x08:
        raise DataError(f"{path} is not an unsigned-byte IDX file (magic {raw[:4].hex()})")
    dims = struct.unpack(">" + "I" * ndim, raw[4 : 4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise DataError(f"IDX file {path} holds {data.size} values, its header says {dims}")
    return data.reshape(dims).copy()  # writable, independent of the file buffer


def _find_idx_dir(name: str, data_dir) -> Path | None:
    for root in search_roots(data_dir):
        for d in (root / name, root):
            if all(_idx_path(d, f) is not None for f in IDX_FILES.values()):
                return d
    return None


def _idx_path(d: Path, stem: str) -> Path | None:
    for cand in (d / stem, d / f"{stem}.gz"):
        if cand.is_file():
            return cand
    return None


def _to_float_images(x: np.ndarray) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(x)).float().div_(255.0)
    return t.unsqueeze(1) if t.dim() == 3 else t


def load_idx_dataset(name: str, data_dir=None) -> Dataset:
    """Fashion-MNIST or MNIST from the four IDX files (optionally gzipped)."""
    d = _find_idx_dir(name, data_dir)
    if d is None:
        tried = ", ".join(str(r) for r in search_roots(data_dir))
        raise DataError(f"{name} not found (searched {tried}); {HOW_TO_GET[name]}")
    arrays = {k: read_idx(_idx_path(d, stem) or d / stem) for k, stem in IDX_FILES.items()}
    for split in ("train", "test"):
        if len(arrays[f"{split}_x"]) != len(arrays[f"{split}_y"]):
            raise DataError(f"{name} in {d}: {split} images and labels differ in count")
    return Dataset(
        name=name,
        x_train=_to_float_images(arrays["train_x"]),
        y_train=torch.from_numpy(arrays["train_y"].astype(np.int64)),
        x_test=_to_float_images(arrays["test_x"]),
        y_test=torch.from_numpy(arrays["test_y"].astype(np.int64)),
        num_classes=10,
        source=str(d),
    )


def load_cifar10(data_dir=None) -> Dataset:
    """CIFAR-10 from its python batches, standardised with the usual channel means and stds."""
    for root in search_roots(data_dir):
        for d in (root / "cifar-10-batches-py", root / "cifar10" / "cifar-10-batches-py", root):
            if (d / "test_batch").is_file() and (d / "data_batch_1").is_file():
                break
        else:
            continue
        break
    else:
        tried = ", ".join(str(r) for r in search_roots(data_dir))
        raise DataError(f"cifar10 not found (searched {tried}); {HOW_TO_GET['cifar10']}")

    def batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
        # The CIFAR-10 python batches are pickles by format; they are local files the user
        # placed, never data received from another site.
        with open(path, "rb") as f:
            obj = pickle.load(f, encoding="bytes")
        return np.asarray(obj[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32), np.asarray(obj[b"labels"])

    parts = [batch(d / f"data_batch_{i}") for i in range(1, 6)]
    xtr, ytr = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    xte, yte = batch(d / "test_batch")
    mean = torch.tensor(CIFAR10_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR10_STD).view(1, 3, 1, 1)
    return Dataset(
        name="cifar10",
        x_train=(_to_float_images(xtr) - mean) / std,
        y_train=torch.from_numpy(ytr.astype(np.int64)),
        x_test=(_to_float_images(xte) - mean) / std,
        y_test=torch.from_numpy(yte.astype(np.int64)),
        num_classes=10,
        source=str(d),
    )


def load_npz(data_dir=None) -> Dataset:
    """A ``.npz`` with x_train, y_train, x_test, y_test (uint8 images 0–255 or floats already scaled)."""
    cands = []
    if data_dir:
        p = Path(data_dir)
        cands = [p] if p.suffix == ".npz" else [p / "data.npz"]
    path = next((c for c in cands if c.is_file()), None)
    if path is None:
        raise DataError(f"npz data not found at {data_dir!r}; {HOW_TO_GET['npz']}")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in ("x_train", "y_train", "x_test", "y_test")}
    except KeyError as e:
        raise DataError(f"{path} lacks array {e}; it needs x_train, y_train, x_test, y_test") from None
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read {path}: {e}") from None

    def images(x: np.ndarray) -> torch.Tensor:
        if x.dtype == np.uint8:
            t = _to_float_images(x)
        else:
            t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
            t = t.unsqueeze(1) if t.dim() == 3 else t
        if t.dim() not in (2, 4):
            raise DataError(f"{path}: images must be N×H×W, N×C×H×W or N×D, got shape {tuple(x.shape)}")
        return t

    ytr, yte = arrays["y_train"].astype(np.int64), arrays["y_test"].astype(np.int64)
    return Dataset(
        name="npz",
        x_train=images(arrays["x_train"]),
        y_train=torch.from_numpy(ytr),
        x_test=images(arrays["x_test"]),
        y_test=torch.from_numpy(yte),
        num_classes=int(max(ytr.max(), yte.max())) + 1,
        source=str(path),
    )


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled digits as (images 1797×8×8 float64, targets int64), read straight from the file
    ``sklearn.datasets.load_digits`` reads (``sklearn/datasets/data/digits.csv.gz``: 64 pixels and the label
    per row) without importing scikit-learn — about a second of CPU in every process that loads digits (each
    site worker, torch.distributed process and command of a run)."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the digits data set is scikit-learn's: install scikit-learn")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = np.loadtxt(f, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(np.int64)


def load_digits_dataset(test_fraction: float = 0.25, seed: int = 0) -> Dataset:
    """scikit-learn's bundled 8×8 digits (1797 images), 2× nearest upsampling to 16×16."""
    images, target = digits_arrays()
    x = torch.from_numpy(images.astype(np.float32) / 16.0).unsqueeze(1)
    x = x.repeat_interleave(2, dim=2).repeat_interleave(2, dim=3)
    y = torch.from_numpy(target)
    perm = torch.from_numpy(np.random.default_rng(seed).permutation(len(y)))
    n_test = int(round(len(y) * test_fraction))
    te, tr = perm[:n_test], perm[n_test:]
    return Dataset(
        "digits", x[tr], y[tr], x[te], y[te], num_classes=10, source="sklearn.datasets.load_digits"
    )


# ---------------------------------------------------------------------------------------------- the registry
DATASETS: Registry[Callable[..., Dataset]] = Registry("dataset", "silofl.datasets")
"""Every data set by name. An entry's object is its loader,
``load(data_dir, *, image_size, max_bag_size, seed) -> Dataset`` (a plug-in takes ``**_`` for the options it
ignores); its metadata (:data:`DATASET_META`) says what the configuration may ask of it."""

DATASET_META = {
    "images": "inputs are images (C×H×W): feature stages and image augmentation apply",
    "pooled": "load_dataset returns a pooled train/test split to partition among clients",
    "site_data": "per-site sources (--site-data, one file or folder per site) are read by its `sites` loader",
    "schema": "it takes a collaboration's schema (--schema), and needs one",
    "seeded": "its train/test split depends on the data seed (compare keeps one load per seed)",
    "description": "one line for help texts and docs",
    "task": "what its targets are: 'classification' (class indices) or 'segmentation' (H×W masks)",
}
DEFAULTS = {
    "images": True,
    "pooled": True,
    "site_data": False,
    "schema": False,
    "seeded": False,
    "description": "",
    "task": "classification",
}


def register_dataset(name: str, loader: Callable[..., Dataset] | None = None, **meta: Any) -> Any:
    """Register a data set's loader under ``name`` (decorator or direct), with the metadata keys of
    :data:`DATASET_META` (unnamed ones take :data:`DEFAULTS`)::

        @register_dataset("mydata", images=False, description="my clinic's rows")
        def load(data_dir=None, **_):
            return Dataset("mydata", x_train, y_train, x_test, y_test, num_classes=2, source="…")

    A ``sites`` entry, ``sites(paths, *, schema, image_size, test_data, test_fraction, seed) -> SiteSources``,
    reads per-site sources (``site_data`` is then true)."""
    unknown = set(meta) - set(DATASET_META) - {"sites", "how_to_get"}
    if unknown:
        raise ValueError(
            f"unknown dataset metadata {sorted(unknown)}; known: {', '.join(DATASET_META)}, sites"
        )
    full = {**DEFAULTS, "site_data": "sites" in meta, **meta}
    return DATASETS.register(name, loader, **full) if loader is not None else DATASETS.register(name, **full)


def dataset_names() -> tuple[str, ...]:
    """Every registered data set, built-ins first (the CLI's choices)."""
    return DATASETS.names()


def dataset_meta(name: str) -> dict[str, Any]:
    """The metadata of data set ``name`` (:data:`DATASET_META`); ConfigError naming the choices if unknown."""
    return {**DEFAULTS, **DATASETS.entry(name).meta}


def _idx(name: str) -> Callable[..., Dataset]:
    def load(data_dir=None, **_: Any) -> Dataset:
        return load_idx_dataset(name, data_dir)

    load.__qualname__ = f"load_{name.replace('-', '_')}"
    return load


def _tables_of_sites(paths, *, schema=None, image_size=32, test_data=None, test_fraction=0.2, seed=0):
    from silofl.data.sites import load_site_tables

    if not schema:
        raise ConfigError(
            "dataset 'table' needs --schema FILE.yaml (feature names and types, target, levels, bounds)"
        )
    return load_site_tables(schema, paths, test_data, test_fraction, seed)


def _images_of_sites(paths, *, schema=None, image_size=32, test_data=None, test_fraction=0.2, seed=0):
    from silofl.data.sites import load_site_images

    return load_site_images(paths, image_size, test_data, test_fraction, seed)


def _table(data_dir=None, **_: Any) -> Dataset:
    raise ConfigError(
        "dataset 'table' is read per site: give --site-data (one CSV or Parquet file per site) and --schema"
    )


def _cifar10(data_dir=None, **_: Any) -> Dataset:
    return load_cifar10(data_dir)


def _digits(data_dir=None, **_: Any) -> Dataset:
    return load_digits_dataset()


def _npz(data_dir=None, **_: Any) -> Dataset:
    return load_npz(data_dir)


def _folder(data_dir=None, *, image_size: int = 32, seed: int = 0, **_: Any) -> Dataset:
    return load_image_folder(data_dir, image_size=image_size, seed=seed)


def _bags(data_dir=None, *, max_bag_size: int = 64, seed: int = 0, **_: Any) -> Dataset:
    return load_bags(data_dir, max_bag_size=max_bag_size, seed=seed)


register_dataset("fashion-mnist", _idx("fashion-mnist"), description="Fashion-MNIST (28×28 grey, 10 classes)")
register_dataset("mnist", _idx("mnist"), description="MNIST (28×28 grey, 10 classes)")
register_dataset("cifar10", _cifar10, description="CIFAR-10 (32×32 colour, 10 classes)")
register_dataset("digits", _digits, description="scikit-learn's bundled 8×8 digits, upsampled to 16×16")
register_dataset("npz", _npz, description="a .npz with x_train, y_train, x_test, y_test (--data-dir)")
register_dataset(
    "folder",
    _folder,
    sites=_images_of_sites,
    seeded=True,
    description="an image folder, a sub-folder per class (--data-dir), or one per site",
)
register_dataset(
    "bags",
    _bags,
    images=False,
    seeded=True,
    description="bags of instance features (multiple-instance learning, --data-dir)",
)
register_dataset(
    "table",
    _table,
    images=False,
    pooled=False,
    schema=True,
    sites=_tables_of_sites,
    description="one CSV or Parquet file per site (--site-data) and a schema (--schema)",
)


def _segmentation(data_dir=None, **_: Any) -> Dataset:
    raise ConfigError(
        "dataset 'segmentation' is read per site: give --site-data (one folder with images/ and masks/, or "
        "one .npz with x and y, per site); `python -m silofl.data.segmentation OUT` writes generated sites"
    )


def _segmentation_sites(paths, *, schema=None, image_size=32, test_data=None, test_fraction=0.2, seed=0):
    from silofl.data.segmentation import load_segmentation_sites

    return load_segmentation_sites(paths, image_size, test_data, test_fraction, seed)


register_dataset(
    "segmentation",
    _segmentation,
    pooled=False,
    sites=_segmentation_sites,
    task="segmentation",
    description="2-D images with binary masks, one folder (images/, masks/) or .npz per site (--site-data)",
)


def load_dataset(
    name: str, data_dir=None, *, image_size: int = 32, max_bag_size: int = 64, seed: int = 0
) -> Dataset:
    """Load data set ``name`` (searched as the module doc says) through :data:`DATASETS`; ConfigError naming
    the choices if there is no such data set, DataError if it is missing or unreadable."""
    return DATASETS.get(name)(data_dir, image_size=image_size, max_bag_size=max_bag_size, seed=seed)


def load_sites(
    name: str,
    paths: list[str],
    *,
    schema: str | None = None,
    image_size: int = 32,
    test_data: str | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
):
    """Per-site sources (:class:`silofl.data.sites.SiteSources`) of data set ``name``, by its ``sites``
    loader; ConfigError if it reads no per-site sources."""
    sites = dataset_meta(name).get("sites")
    if sites is None:
        takers = " or ".join(n for n in DATASETS.names() if dataset_meta(n)["site_data"])
        raise ConfigError(f"--site-data takes {takers} sources, not dataset {name!r}")
    return sites(
        paths,
        schema=schema,
        image_size=image_size,
        test_data=test_data,
        test_fraction=test_fraction,
        seed=seed,
    )
