"""Data a hospital would bring: an image folder tree, and bags of feature vectors by site.

**Image folder** (``dataset: folder``, ``data_dir`` = the root): ``root/train/<class>/*.png|jpg|…``
and ``root/test/<class>/…``; or only ``root/<class>/…``, then a seeded 80/20 split. Class names are
the sorted sub-folder names; images are resized to ``image_size``² (bilinear), grey if every image
is, RGB otherwise, and scaled to [-1, 1] per channel with the public constants mean 0.5 and std 0.5
(not the training images' own mean and std: pooled over the clients, those were a statistic of every
site's images that no site may see).

**Bags** (``dataset: bags``, ``data_dir`` = an ``.npz``): one bag per slide, for multiple-instance
models (DeepSet). Arrays: ``features`` (instances × d), ``bag`` (instance → bag id 0…B-1),
``labels`` (B), ``sites`` (B, the institution of each bag; optional) and optional ``split``
(B, "train"/"test"; else a seeded 80/20 split within every site). Bags are padded (or
deterministically subsampled) to ``max_bag_size`` instances, with a last mask column (1 = real
instance). With ``partition: site`` every client is one site; its held-out bags are its *internal*
test set, and the bags of sites that train no client form the shared *external* test set.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from silofl.core.errors import DataError
from silofl.data.types import Dataset

PUBLIC_MEAN, PUBLIC_STD = 0.5, 0.5  # pixels in [0, 1] → [-1, 1]: public constants, no statistic of any site
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".gif"}


def _class_dirs(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir())


def _files(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)


def image_tree(
    data_dir,
    classes: list[str] | None = None,
    seed: int = 0,
    test_fraction: float = 0.2,
    what: str = "image folder",
) -> tuple[list[str], list[tuple[Path, int]], list[tuple[Path, int]]]:
    """(classes, training items, test items) of an image tree ``ROOT/<class>/…`` (seeded split) or
    ``ROOT/train/<class>/…`` + ``ROOT/test/<class>/…``; items are (file, class index). ``classes``: the
    class list agreed by the collaboration (a folder may lack some); else the tree's sorted sub-folders."""
    if not data_dir or not Path(data_dir).is_dir():
        raise DataError(
            f"{what} {str(data_dir)!r} not found; pass a folder ROOT with ROOT/<class>/ images "
            "(or ROOT/train/<class>/ and ROOT/test/<class>/)"
        )
    root = Path(data_dir)
    split_dirs = (root / "train").is_dir() and (root / "test").is_dir()
    train_root = root / "train" if split_dirs else root
    own = [d.name for d in _class_dirs(train_root)]
    if classes is None:
        classes = own
        if len(classes) < 2:
            raise DataError(f"{train_root} needs at least two class sub-folders, found {classes}")
    else:
        stray = sorted(set(own) - set(classes))
        if stray:
            raise DataError(
                f"{train_root}: class folder {stray[0]!r} is not one of the classes {', '.join(classes)}"
            )
    if split_dirs:
        test_classes = [d.name for d in _class_dirs(root / "test")]
        if not set(test_classes) <= set(classes):
            raise DataError(
                f"test classes {sorted(set(test_classes) - set(classes))} have no training folder"
            )

    def gather(base: Path) -> list[tuple[Path, int]]:
        items = []
        for k, c in enumerate(classes):
            if (base / c).is_dir():
                items += [(f, k) for f in _files(base / c)]
        return items

    train_items = gather(train_root)
    if split_dirs:
        test_items = gather(root / "test")
    else:
        perm = np.random.default_rng(seed).permutation(len(train_items))
        n_test = max(1, int(round(len(train_items) * test_fraction)))
        test_items = [train_items[i] for i in perm[:n_test]]
        train_items = [train_items[i] for i in sorted(perm[n_test:])]
    if not train_items or not test_items:
        raise DataError(
            f"no images ({', '.join(sorted(IMAGE_SUFFIXES))}) found under {root} (or too few to hold "
            "some out for testing)"
        )
    return list(classes), train_items, test_items


def image_mode(files: list[Path]) -> str:
    """ "L" when every image is grey, else "RGB"."""
    from PIL import Image, UnidentifiedImageError

    for f in files:
        try:
            with Image.open(f) as im:
                if im.mode not in ("L", "1", "I;16", "I"):
                    return "RGB"
        except (UnidentifiedImageError, OSError) as e:
            raise DataError(f"cannot read image {f}: {e}") from None
    return "L"


def read_images(files: list[Path], image_size: int, mode: str) -> np.ndarray:
    """Images as float32 N×C×H×W in [0, 1]: converted to ``mode`` ("L" or "RGB"), resized (bilinear) to
    ``image_size``², pixel values / 255. The one reader of training, test and new images."""
    from PIL import Image, UnidentifiedImageError

    arrs = []
    for f in files:
        try:
            with Image.open(f) as im:
                arrs.append(
                    np.asarray(
                        im.convert(mode).resize((image_size, image_size), Image.Resampling.BILINEAR),
                        dtype=np.float32,
                    )
                )
        except (UnidentifiedImageError, OSError) as e:
            raise DataError(f"cannot read image {f}: {e}") from None
    arr = np.stack(arrs) / 255.0
    return arr[:, None] if mode == "L" else np.ascontiguousarray(arr.transpose(0, 3, 1, 2))


def load_image_folder(data_dir, image_size: int = 32, seed: int = 0, test_fraction: float = 0.2):
    """An image folder tree (see the module doc) as a Dataset scaled by public constants."""
    classes, train_items, test_items = image_tree(data_dir, seed=seed, test_fraction=test_fraction)
    mode = image_mode([f for f, _ in train_items + test_items])
    x_tr = torch.from_numpy(read_images([f for f, _ in train_items], image_size, mode))
    x_te = torch.from_numpy(read_images([f for f, _ in test_items], image_size, mode))
    channels = x_tr.shape[1]
    mean = torch.full((1, channels, 1, 1), PUBLIC_MEAN, dtype=x_tr.dtype)
    std = torch.full((1, channels, 1, 1), PUBLIC_STD, dtype=x_tr.dtype)
    return Dataset(
        name="folder",
        x_train=(x_tr - mean) / std,
        y_train=torch.tensor([k for _, k in train_items]),
        x_test=(x_te - mean) / std,
        y_test=torch.tensor([k for _, k in test_items]),
        num_classes=len(classes),
        source=str(data_dir),
        class_names=classes,
        preprocessing={
            "format": "silofl.preprocessing/1",
            "kind": "image",
            "image_size": image_size,
            "mode": mode,
            "mean": mean.flatten().tolist(),
            "std": std.flatten().tolist(),
            "classes": classes,
            "rows": len(train_items),
            "site": "",
            "site_statistics": [],
        },
    )


def load_bags(data_dir, max_bag_size: int = 64, seed: int = 0, test_fraction: float = 0.2):
    """Bags of feature vectors (one per slide) from an ``.npz`` (see the module doc)."""
    p = Path(data_dir) if data_dir else None
    if p is not None and p.is_dir():
        p = p / "bags.npz"
    if p is None or not p.is_file():
        raise DataError(
            f"bag data not found at {data_dir!r}; pass --data-dir FILE.npz with arrays features, bag, "
            "labels[, sites, split] (HDF5: convert to .npz; h5py is not a dependency)"
        )
    try:
        with np.load(p, allow_pickle=False) as z:
            feats, bag, labels = z["features"], z["bag"].astype(np.int64), z["labels"].astype(np.int64)
            sites = z["sites"] if "sites" in z else np.zeros(len(labels), dtype=np.int64)
            split = z["split"] if "split" in z else None
    except KeyError as e:
        raise DataError(
            f"{p} lacks array {e}; it needs features, bag, labels (optional: sites, split)"
        ) from None
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read {p}: {e}") from None
    B = len(labels)
    if feats.ndim != 2 or len(bag) != len(feats):
        raise DataError(
            f"{p}: features must be instances × d and bag one id per instance, got {feats.shape} and "
            f"{bag.shape}"
        )
    if bag.min() < 0 or bag.max() >= B or len(sites) != B:
        raise DataError(f"{p}: bag ids must lie in 0…{B - 1} (one label and one site per bag)")
    if not np.isfinite(feats).all():
        raise DataError(f"{p}: features contain NaN or infinite values")
    rng = np.random.default_rng(seed)
    d = feats.shape[1]
    x = np.zeros((B, max_bag_size, d + 1), dtype=np.float32)
    order = np.argsort(bag, kind="stable")
    starts = np.searchsorted(bag[order], np.arange(B + 1))
    for b in range(B):
        rows = order[starts[b] : starts[b + 1]]
        if len(rows) == 0:
            raise DataError(f"{p}: bag {b} has no instances")
        if len(rows) > max_bag_size:
            rows = np.sort(rng.choice(rows, max_bag_size, replace=False))
        x[b, : len(rows), :d] = feats[rows]
        x[b, : len(rows), d] = 1.0
    sites = np.asarray([str(s) for s in sites])
    if split is not None:
        is_test = np.asarray([str(s) == "test" for s in split])
    else:
        is_test = np.zeros(B, dtype=bool)
        for s in np.unique(sites):
            idx = np.flatnonzero(sites == s)
            n_test = int(round(len(idx) * test_fraction))
            is_test[rng.permutation(idx)[:n_test]] = True
    xt, yt = torch.from_numpy(x), torch.from_numpy(labels)
    tr, te = np.flatnonzero(~is_test), np.flatnonzero(is_test)
    return Dataset(
        name="bags",
        x_train=xt[tr],
        y_train=yt[tr],
        x_test=xt[te],
        y_test=yt[te],
        num_classes=int(labels.max()) + 1,
        source=str(p),
        groups=sites[tr],
        test_groups=sites[te],
    )


def site_split(data, n_clients: int) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray, list[str]]:
    """Clients = the ``n_clients`` largest sites: (train idx per client, internal test idx per client,
    external test idx, site names). External = test bags of the sites no client trains on, or every
    test bag when all sites train."""
    if data.groups is None:
        raise DataError(
            f"partition 'site' needs data with a site per example (bags with 'sites'); {data.name} has none"
        )
    names, counts = np.unique(data.groups, return_counts=True)
    if len(names) < n_clients:
        raise DataError(
            f"partition 'site' with {n_clients} clients, but the data has only {len(names)} sites: "
            f"{', '.join(names)}"
        )
    chosen = [names[i] for i in sorted(range(len(names)), key=lambda i: (-counts[i], names[i]))[:n_clients]]
    train = [np.flatnonzero(data.groups == s) for s in chosen]
    internal = [np.flatnonzero(data.test_groups == s) for s in chosen]
    external = np.flatnonzero(~np.isin(data.test_groups, chosen))
    if len(external) == 0:
        external = np.arange(len(data.y_test))
    return train, internal, external, [str(s) for s in chosen]
