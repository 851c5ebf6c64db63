"""Multi-site 2-D segmentation data: images with masks, one source per site (``dataset: segmentation``).

``--site-data A,B,…`` names one source per site; each is either

* a **folder** with ``images/`` and ``masks/`` holding files of the same names (stem), images as PNG (any
  format Pillow reads) or ``.npy`` (H×W or H×W×C), masks as PNG or ``.npy`` (H×W) — the pairs are matched by
  name; or
* an **npz file** with ``x`` (N×H×W or N×H×W×C: uint8 0–255 or float) and ``y`` (N×H×W): one file per site.
  The seed paper's published code reads the prostate volumes (NIfTI) itself and slices them; this is the 2-D
  slice layout silofl accepts for such data once sliced (``np.savez(site.npz, x=slices, y=masks)``).

A mask is binary — its values are {0, 1} or {0, 255} (foreground 1 after reading) — or holds integer labels
0 … C−1 (0 the background; at most :data:`MAX_CLASSES` classes): the classes of a run are 0 … the largest
label any site's (or the test set's) masks hold, at least two (background and foreground). Images are resized
(bilinear) and masks (nearest) to ``--image-size``; uint8 images are scaled by 1/255, float ones taken as
they are. Each site holds out a seeded ``--test-fraction`` of its images as its internal test set, fits its
own per-channel mean and std on its training images (a statistic that stays at the site, as for image
folders), and sees the shared test set (``--test-data`` in the same layout, else the union of the sites'
held-out images: a simulation figure) through its own preprocessing.

Bad input is refused before anything is written, with one line naming the file: an empty or missing
folder, image and mask names that do not match, shapes that differ, a non-binary mask, a non-finite image,
a mask that is neither binary nor integer labels 0 … C−1, more than :data:`MAX_IMAGES` images or an image
above :data:`MAX_SIDE` pixels a side.

:func:`generate_sites` writes generated sites with known masks (noisy images with elliptic objects whose
masks are exact; sites differ in intensity, contrast, noise and object size) for tests, presets and
tutorials — nothing is downloaded. ``python -m silofl.data.segmentation OUT --sites 3`` writes them.
"""

from __future__ import annotations

import argparse
import zipfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from silofl.core.errors import DataError

MAX_IMAGES = 200_000  # per site
MAX_SIDE = 4096  # pixels a side of one image
MAX_NPZ_BYTES = 8 << 30  # uncompressed bytes of one array of a site's npz
CLASSES = ["background", "foreground"]
MAX_CLASSES = 64  # labels 0 … 63 in a multi-class mask (the model's per-pixel outputs)
ARRAY_SUFFIXES = {".npy"}


# ------------------------------------------------------------------------------------------------- reading
def _read_image_file(path: Path) -> np.ndarray:
    """One image (H, W) or (H, W, C) as stored (uint8 or float)."""
    if path.suffix.lower() == ".npy":
        try:
            with open(path, "rb") as f:
                version = np.lib.format.read_magic(f)
                read_header = (
                    np.lib.format.read_array_header_1_0
                    if version == (1, 0)
                    else np.lib.format.read_array_header_2_0
                )
                shape, _, dtype = read_header(f)
        except (OSError, ValueError) as e:
            raise DataError(f"cannot read {path}: {e}") from None
        if len(shape) not in (2, 3) or max(shape[:2], default=0) > MAX_SIDE or dtype.hasobject:
            raise DataError(
                f"{path}: expected an H×W or H×W×C array of at most {MAX_SIDE} a side, got {shape}"
            )
        try:
            return np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise DataError(f"cannot read {path}: {e}") from None
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            if max(im.size) > MAX_SIDE:
                raise DataError(f"{path}: {im.size[0]}×{im.size[1]} pixels, more than {MAX_SIDE} a side")
            if im.mode in ("L", "1", "P", "I;16", "I", "F"):
                return np.asarray(im.convert("L") if im.mode in ("1", "P") else im)
            return np.asarray(im.convert("RGB"))
    except (UnidentifiedImageError, OSError) as e:
        raise DataError(f"cannot read image {path}: {e}") from None


def _binary_mask(m: np.ndarray, what: str, ndim: int = 2) -> np.ndarray:
    """A mask as int64 class indices: binary ({0, 1}, or {0, 255} → {0, 1}) or integer labels 0 … C−1
    (C ≤ :data:`MAX_CLASSES`); a DataError naming the values else."""
    if ndim == 2 and m.ndim == 3 and m.shape[-1] == 1:
        m = m[..., 0]
    if m.ndim != ndim:
        raise DataError(f"{what}: a mask must be H×W, got shape {m.shape}")
    values = np.unique(m)
    if set(values.tolist()) <= {0, 1}:
        return m.astype(np.int64)
    if set(values.tolist()) <= {0, 255}:
        return (m == 255).astype(np.int64)
    v = values.astype(np.float64)
    if bool(np.all(np.isfinite(v) & (v == np.round(v)) & (v >= 0) & (v < MAX_CLASSES))):
        return m.astype(np.int64)  # integer labels 0 … C−1: a multi-class mask
    shown = ", ".join(f"{x:g}" for x in v[:6])
    raise DataError(
        f"{what}: the mask is not binary (0/1 or 0/255) nor integer labels 0 … {MAX_CLASSES - 1} (values "
        f"{shown}{', …' if len(values) > 6 else ''})"
    )


def class_names(classes: int) -> list[str]:
    """The class names of a run with ``classes`` mask labels: background and foreground for two, else
    background, class1, … (the label values)."""
    return list(CLASSES) if classes <= 2 else ["background", *(f"class{c}" for c in range(1, classes))]


def _images_to_tensor(arrs: list[np.ndarray], what: str) -> tuple[np.ndarray, bool]:
    """(N, H, W, C) float32 of images of one shape, whether they were uint8 (then still 0–255)."""
    shapes = {a.shape for a in arrs}
    if len(shapes) != 1:
        raise DataError(f"{what}: the images differ in shape ({', '.join(str(s) for s in sorted(shapes))})")
    x = np.stack(arrs)
    if x.ndim == 3:
        x = x[..., None]
    is_uint8 = x.dtype == np.uint8
    x = x.astype(np.float32)
    if not np.isfinite(x).all():
        raise DataError(f"{what}: an image holds NaN or infinite values")
    return x, is_uint8


def read_site(source: str | Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(images N×H×W×C float32 in [0, 1] for uint8 inputs, masks N×H×W int64 in {0, 1}, names) of one site's
    folder or npz file (see the module doc); DataError naming the problem."""
    p = Path(source)
    if p.is_file() and p.suffix == ".npz":
        return _read_npz(p)
    if not p.is_dir():
        raise DataError(
            f"segmentation source {str(source)!r} not found: give a folder with images/ and masks/, or an "
            ".npz file with x and y"
        )
    img_dir, mask_dir = p / "images", p / "masks"
    if not img_dir.is_dir() or not mask_dir.is_dir():
        raise DataError(f"{p}: a site folder holds images/ and masks/ (files of the same names)")
    from silofl.data.formats import IMAGE_SUFFIXES

    suffixes = IMAGE_SUFFIXES | ARRAY_SUFFIXES

    def listing(d: Path) -> dict[str, Path]:
        out: dict[str, Path] = {}
        for f in sorted(d.iterdir()):
            if f.is_file() and f.suffix.lower() in suffixes:
                if f.stem in out:
                    raise DataError(f"{d}: two files are named {f.stem} ({out[f.stem].name}, {f.name})")
                out[f.stem] = f
                if len(out) > MAX_IMAGES:
                    raise DataError(f"{d}: more than {MAX_IMAGES} images in one site")
        return out

    images, masks = listing(img_dir), listing(mask_dir)
    if not images:
        raise DataError(f"{img_dir}: no images (PNG, JPEG, … or .npy)")
    if set(images) != set(masks):
        only_i, only_m = sorted(set(images) - set(masks)), sorted(set(masks) - set(images))
        detail = "; ".join(
            s
            for s in (
                f"images without a mask: {', '.join(only_i[:3])}{' …' if len(only_i) > 3 else ''}"
                if only_i
                else "",
                f"masks without an image: {', '.join(only_m[:3])}{' …' if len(only_m) > 3 else ''}"
                if only_m
                else "",
            )
            if s
        )
        raise DataError(f"{p}: image and mask names do not match ({detail})")
    names = sorted(images)
    xs, ys = [], []
    for n in names:
        img = _read_image_file(images[n])
        m = _binary_mask(_read_image_file(masks[n]), str(masks[n]))
        if img.shape[:2] != m.shape:
            raise DataError(f"{images[n]}: image {img.shape[:2]} and mask {m.shape} differ in size")
        xs.append(img)
        ys.append(m)
    x, is_uint8 = _images_to_tensor(xs, str(img_dir))
    return (x / 255.0 if is_uint8 else x), np.stack(ys), names


def read_inputs(source: str | Path) -> tuple[list[np.ndarray], list[np.ndarray] | None, list[str]]:
    """New images for prediction, each H×W×C float32 at its own size ([0, 1] for uint8 ones), their masks when
    the source has them, and names: a site folder (``images/``, optional ``masks/``), a folder of images or
    .npy arrays, or an npz with ``x`` (optional ``y``)."""
    p = Path(source)
    if p.is_file() and p.suffix == ".npz":
        try:
            with np.load(p, allow_pickle=False) as z:
                has_y = "y" in z.files
        except (OSError, ValueError) as e:
            raise DataError(f"cannot read {p}: {e}") from None
        if has_y:
            x, y, names = _read_npz(p)
            return list(x), list(y), names
        try:
            with np.load(p, allow_pickle=False) as z:
                x = z["x"]
        except (KeyError, OSError, ValueError) as e:
            raise DataError(f"cannot read {p}: {e}") from None
        if x.ndim not in (3, 4) or len(x) == 0 or len(x) > MAX_IMAGES or max(x.shape[1:3]) > MAX_SIDE:
            raise DataError(f"{p}: x must be N×H×W or N×H×W×C with 1 … {MAX_IMAGES} images, got {x.shape}")
        imgs, is_uint8 = _images_to_tensor(list(x), str(p))
        return list(imgs / 255.0 if is_uint8 else imgs), None, [f"{i:06d}" for i in range(len(x))]
    if p.is_dir() and (p / "images").is_dir() and (p / "masks").is_dir():
        x, y, names = read_site(p)
        return list(x), list(y), names
    d = p / "images" if (p / "images").is_dir() else p
    if not d.is_dir():
        raise DataError(f"{source} not found: give a folder of images, a site folder or an .npz")
    from silofl.data.formats import IMAGE_SUFFIXES

    files = sorted(
        f for f in d.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES | ARRAY_SUFFIXES
    )
    if not files:
        raise DataError(f"{d}: no images (PNG, JPEG, … or .npy)")
    if len(files) > MAX_IMAGES:
        raise DataError(f"{d}: more than {MAX_IMAGES} images")
    out = []
    for f in files:
        a = _read_image_file(f)
        a = a[..., None] if a.ndim == 2 else a
        x, is_uint8 = _images_to_tensor([a], str(f))
        out.append((x / 255.0 if is_uint8 else x)[0])
    return out, None, [f.stem for f in files]


def _read_npz(p: Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    try:
        with zipfile.ZipFile(p) as zf:
            infos = {i.filename: i for i in zf.infolist()}
    except (OSError, zipfile.BadZipFile) as e:
        raise DataError(f"cannot read {p}: {e}") from None
    for key in ("x", "y"):
        info = infos.get(f"{key}.npy")
        if info is None:
            raise DataError(f"{p} lacks array {key!r}; a site's npz holds x (N×H×W[×C]) and y (N×H×W)")
        if info.file_size > MAX_NPZ_BYTES:
            raise DataError(f"{p}: array {key} is {info.file_size} bytes, more than {MAX_NPZ_BYTES}")
    try:
        with np.load(p, allow_pickle=False) as z:
            x, y = z["x"], z["y"]
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read {p}: {e}") from None
    if x.ndim not in (3, 4) or y.ndim != 3:
        raise DataError(f"{p}: x must be N×H×W or N×H×W×C and y N×H×W, got {x.shape} and {y.shape}")
    if len(x) == 0:
        raise DataError(f"{p}: no images")
    if len(x) > MAX_IMAGES or max(x.shape[1:3]) > MAX_SIDE:
        raise DataError(
            f"{p}: at most {MAX_IMAGES} images of at most {MAX_SIDE} pixels a side, got {x.shape}"
        )
    if x.shape[:3] != y.shape:
        raise DataError(f"{p}: images {x.shape[:3]} and masks {y.shape} differ in shape")
    if x.dtype.kind not in "uif" or y.dtype.kind not in "uifb":
        raise DataError(f"{p}: x and y must be numeric arrays, got {x.dtype} and {y.dtype}")
    masks = _binary_mask(y, str(p), ndim=3)
    imgs, is_uint8 = _images_to_tensor(list(x), str(p))
    return (imgs / 255.0 if is_uint8 else imgs), masks, [f"{i:06d}" for i in range(len(x))]


def to_tensors(x: np.ndarray, y: np.ndarray, image_size: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(images N×C×S×S, masks N×S×S) resized to ``image_size`` (images bilinear, masks nearest)."""
    xt = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))
    yt = torch.from_numpy(y).long()
    if image_size and tuple(xt.shape[-2:]) != (image_size, image_size):
        xt = F.interpolate(xt, size=(image_size, image_size), mode="bilinear", align_corners=False)
        yt = F.interpolate(yt[:, None].float(), size=(image_size, image_size), mode="nearest")[:, 0].long()
    return xt.contiguous(), yt.contiguous()


def load_segmentation_sites(
    paths: list[str],
    image_size: int = 32,
    test_path: str | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
):
    """Every site's images and masks (see the module doc) as :class:`silofl.data.sites.SiteSources`."""
    from silofl.data.preprocessing import ImagePreprocessing
    from silofl.data.sites import SiteSources, holdout, site_names

    names = site_names([p.removesuffix(".npz") for p in paths])
    read = [to_tensors(*read_site(p)[:2], image_size) for p in paths]
    channels = {x.shape[1] for x, _ in read}
    if len(channels) != 1:
        raise DataError(f"the sites' images differ in channels ({sorted(channels)}): all grey or all colour")
    mode = "L" if channels == {1} else "RGB"
    if channels - {1, 3}:
        raise DataError(f"images must have 1 or 3 channels, got {sorted(channels)}")
    ext = to_tensors(*read_site(test_path)[:2], image_size) if test_path else None
    if ext is not None and ext[0].shape[1] != next(iter(channels)):
        raise DataError(f"{test_path}: its images have {ext[0].shape[1]} channels, the sites' {channels}")
    # the classes: 0 … the largest label of any mask (binary masks: background and foreground)
    largest = max(int(y.max()) if y.numel() else 0 for _, y in [*read, *([ext] if ext is not None else [])])
    names_c = class_names(max(2, largest + 1))
    preps, parts, internal, held = [], [], [], []
    for k, (x, y) in enumerate(read):
        tr, te = holdout(len(y), test_fraction, seed, k, paths[k])
        tr_t, te_t = torch.from_numpy(tr), torch.from_numpy(te)
        prep = ImagePreprocessing.fit(x[tr_t], image_size, mode, names_c, site=names[k])
        preps.append(prep)
        parts.append((prep.transform(x[tr_t]), y[tr_t]))
        internal.append((prep.transform(x[te_t]), y[te_t]))
        held.append((x[te_t], y[te_t]))
    if ext is None:
        ext = (torch.cat([h[0] for h in held]), torch.cat([h[1] for h in held]))
        test_set = (
            "the union of the sites' held-out images (a simulation figure: each site's own held-out images "
            "are its internal test set; no site trains on another's images)"
        )
    else:
        test_set = f"external: {test_path} (no site trains on it)"
    external = [(prep.transform(ext[0]), ext[1]) for prep in preps]
    return SiteSources(
        names,
        parts,
        internal,
        external,
        list(preps),
        names_c,
        preps[0].input_shape,
        test_set,
        list(paths),
        [0] * len(paths),
    )


# ---------------------------------------------------------------------------------------------- generating
def generate_images(
    n: int,
    size: int,
    rng: np.random.Generator,
    site: int = 0,
    empty_fraction: float = 0.1,
    classes: int = 2,
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` uint8 images (n, size, size) and their exact binary masks: Gaussian noise around a site's
    background intensity, one or two filled ellipses brighter by a site's contrast; site ``site`` shifts the
    intensity, contrast, noise and object size (site heterogeneity). A fraction ``empty_fraction`` of the
    images has no object (an empty mask). ``classes`` > 2: each ellipse has a label 1 … classes − 1 (drawn
    at random, a later ellipse over an earlier one) and a brightness rising with its label: label masks."""
    bg = 60.0 + 25.0 * (site % 4)
    contrast = 70.0 - 10.0 * (site % 3)
    noise = 18.0 + 6.0 * (site % 2)
    scale = 1.0 + 0.25 * ((site % 3) - 1)  # object radii ×0.75, ×1, ×1.25
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    imgs = np.empty((n, size, size), dtype=np.uint8)
    masks = np.zeros((n, size, size), dtype=np.uint8)
    for i in range(n):
        m = np.zeros((size, size), dtype=bool)
        labels = np.zeros((size, size), dtype=np.uint8)
        if rng.random() >= empty_fraction:
            for _ in range(1 + int(rng.random() < 0.3)):
                a, b = rng.uniform(0.12, 0.25, size=2) * size * scale
                cy, cx = rng.uniform(0.25, 0.75, size=2) * size
                t = rng.uniform(0, np.pi)
                dy, dx = yy - cy, xx - cx
                u, v = dx * np.cos(t) + dy * np.sin(t), -dx * np.sin(t) + dy * np.cos(t)
                inside = (u / a) ** 2 + (v / b) ** 2 <= 1.0
                m |= inside
                if classes > 2:  # binary runs draw nothing more: their images stay as they were
                    labels[inside] = int(rng.integers(1, classes))
        if classes > 2:
            masks[i] = labels
            img = bg + contrast * labels / (classes - 1) + rng.normal(0.0, noise, size=(size, size))
            imgs[i] = np.clip(np.rint(img), 0, 255).astype(np.uint8)
            continue
        img = bg + contrast * m + rng.normal(0.0, noise, size=(size, size))
        imgs[i] = np.clip(np.rint(img), 0, 255).astype(np.uint8)
        masks[i] = m
    return imgs, masks


def generate_sites(
    out: str | Path,
    sites: int = 3,
    per_site: int | list[int] = 60,
    size: int = 32,
    seed: int = 0,
    fmt: str = "png",
    classes: int = 2,
) -> list[str]:
    """Write ``sites`` generated sites under ``out`` (``site<k>/images`` + ``site<k>/masks`` as PNG or
    .npy, or ``site<k>.npz``) and return their paths, in site order; refuses an existing non-empty ``out``.
    ``classes`` > 2: label masks 0 … classes − 1 (PNG masks then hold the labels, not 0/255)."""
    root = Path(out)
    if fmt not in ("png", "npy", "npz"):
        raise DataError(f"format must be png, npy or npz, got {fmt!r}")
    if root.exists() and any(root.iterdir()):
        raise DataError(f"{root} exists and is not empty; choose a new folder")
    counts = per_site if isinstance(per_site, list) else [per_site] * sites
    if len(counts) != sites or min(counts) < 2:
        raise DataError(f"give at least 2 images for each of the {sites} sites, got {counts}")
    if not 2 <= classes <= MAX_CLASSES:
        raise DataError(f"classes must lie in 2 … {MAX_CLASSES}, got {classes}")
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in range(sites):
        x, y = generate_images(counts[k], size, np.random.default_rng([seed, k]), site=k, classes=classes)
        if fmt == "npz":
            p = root / f"site{k}.npz"
            np.savez_compressed(p, x=x, y=y)
        else:
            p = root / f"site{k}"
            (p / "images").mkdir(parents=True)
            (p / "masks").mkdir()
            for i in range(len(x)):
                if fmt == "npy":
                    np.save(p / "images" / f"{i:04d}.npy", x[i])
                    np.save(p / "masks" / f"{i:04d}.npy", y[i])
                else:
                    from PIL import Image

                    Image.fromarray(x[i]).save(p / "images" / f"{i:04d}.png")
                    Image.fromarray(y[i] * 255 if classes == 2 else y[i]).save(p / "masks" / f"{i:04d}.png")
        paths.append(str(p))
    return paths


def main(argv: list[str] | None = None) -> int:
    """``python -m silofl.data.segmentation OUT [--sites K] [--per-site N] [--size S] [--seed R] [--format]
    [--classes C]``: write generated sites and print their paths (comma-separated, for ``--site-data``)."""
    ap = argparse.ArgumentParser(prog="python -m silofl.data.segmentation", description=main.__doc__)
    ap.add_argument("out")
    ap.add_argument("--sites", type=int, default=3)
    ap.add_argument("--per-site", type=int, default=60)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--format", choices=("png", "npy", "npz"), default="png")
    ap.add_argument("--classes", type=int, default=2, help="mask labels 0 … C−1 (2: binary masks)")
    a = ap.parse_args(argv)
    try:
        print(",".join(generate_sites(a.out, a.sites, a.per_site, a.size, a.seed, a.format, a.classes)))
    except DataError as e:
        print(f"error: {e}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
