"""The multi-site segmentation loader and generator (silofl.data.segmentation): layouts, masks, refusals."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from silofl.core.errors import DataError
from silofl.data.segmentation import generate_images, generate_sites, load_segmentation_sites, read_site


@pytest.mark.parametrize("fmt", ["png", "npy", "npz"])
def test_generated_sites_read_back_exactly(tmp_path, fmt):
    paths = generate_sites(tmp_path / "d", sites=2, per_site=5, size=12, seed=3, fmt=fmt)
    for k, p in enumerate(paths):
        x, y, names = read_site(p)
        ref_x, ref_y = generate_images(5, 12, np.random.default_rng([3, k]), site=k)
        assert x.shape == (5, 12, 12, 1) and y.shape == (5, 12, 12) and len(names) == 5
        assert np.array_equal(y, ref_y) and np.allclose(x[..., 0], ref_x / 255.0)
    src = load_segmentation_sites(paths, image_size=8, test_fraction=0.4, seed=0)
    assert src.classes == ["background", "foreground"] and src.input_shape == (1, 8, 8)
    assert [len(t[1]) for t in src.parts] == [3, 3] and src.parts[0][1].shape == (3, 8, 8)
    assert set(src.external[0][1].unique().tolist()) <= {0, 1} and len(src.external[0][1]) == 4


def test_generated_sites_differ_and_hold_empty_masks():
    rng = np.random.default_rng(0)
    a, ma = generate_images(200, 16, rng, site=0)
    b, mb = generate_images(200, 16, np.random.default_rng(0), site=1)
    assert abs(float(a[ma == 0].mean()) - float(b[mb == 0].mean())) > 15  # background intensity shifts
    empty = (ma.reshape(200, -1).sum(1) == 0).mean()
    assert 0.03 < empty < 0.2


def _site(root, names_img, names_mask, mask_values=(0, 255), size=(6, 6), mask_size=None):
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    for n in names_img:
        Image.fromarray(np.zeros(size, dtype=np.uint8)).save(root / "images" / f"{n}.png")
    for n in names_mask:
        m = np.full(mask_size or size, mask_values[0], dtype=np.uint8)
        m[0, 0] = mask_values[1]
        Image.fromarray(m).save(root / "masks" / f"{n}.png")
    return root


def test_refusals_name_the_problem(tmp_path):
    cases = {
        "names do not match": _site(tmp_path / "a", ["x1", "x2"], ["x1", "x3"]),
        "not binary": _site(tmp_path / "b", ["x1"], ["x1"], mask_values=(0, 70)),
        "differ in size": _site(tmp_path / "c", ["x1"], ["x1"], mask_size=(5, 6)),
        "no images": _site(tmp_path / "d", [], []),
    }
    (tmp_path / "e").mkdir()
    cases["images/ and masks/"] = tmp_path / "e"
    np.savez(tmp_path / "f.npz", x=np.zeros((3, 4, 4), np.uint8))
    cases["lacks array 'y'"] = tmp_path / "f.npz"
    np.savez(tmp_path / "g.npz", x=np.zeros((3, 4, 4), np.uint8), y=np.zeros((3, 4, 5), np.uint8))
    cases["differ in shape"] = tmp_path / "g.npz"
    cases["not found"] = tmp_path / "missing"
    for message, path in cases.items():
        with pytest.raises(DataError, match=message):
            read_site(path)
    assert "(values 0, 70)" in str(pytest.raises(DataError, read_site, tmp_path / "b").value)


def test_generator_refuses_a_used_folder(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "keep").write_text("x")
    with pytest.raises(DataError, match="not empty"):
        generate_sites(tmp_path / "d")
    assert [p.name for p in (tmp_path / "d").iterdir()] == ["keep"]


def test_integer_label_masks_are_read_as_classes_and_the_run_takes_the_largest_label(tmp_path):
    from silofl.data.segmentation import class_names

    a = _site(tmp_path / "a", ["x1"], ["x1"], mask_values=(0, 2))  # labels 0, 2 (class 1 absent here)
    m = read_site(a)[1]
    assert m.dtype == np.int64 and set(np.unique(m).tolist()) == {0, 2}
    assert set(np.unique(read_site(_site(tmp_path / "b", ["x1"], ["x1"], mask_values=(0, 255)))[1])) == {0, 1}
    np.savez(tmp_path / "c.npz", x=np.zeros((2, 6, 6), np.uint8), y=np.full((2, 6, 6), 3, np.uint8))
    np.savez(tmp_path / "d.npz", x=np.zeros((2, 6, 6), np.uint8), y=np.full((2, 6, 6), -1, np.int8))
    with pytest.raises(DataError, match="nor integer labels 0 … 63 .values -1"):
        read_site(tmp_path / "d.npz")
    np.savez(tmp_path / "e.npz", x=np.zeros((2, 6, 6), np.uint8), y=np.full((2, 6, 6), 0.5))
    with pytest.raises(DataError, match="values 0.5"):
        read_site(tmp_path / "e.npz")
    src = load_segmentation_sites(
        [str(tmp_path / "c.npz"), str(tmp_path / "c.npz")], image_size=6, test_fraction=0.5
    )
    assert src.classes == class_names(4) == ["background", "class1", "class2", "class3"]
    assert int(src.parts[0][1].max()) == 3
    assert class_names(2) == ["background", "foreground"]
    paths = generate_sites(tmp_path / "gen", sites=2, per_site=6, size=16, classes=3)
    labels = set(np.unique(read_site(paths[0])[1]).tolist()) | set(np.unique(read_site(paths[1])[1]).tolist())
    assert labels == {0, 1, 2}
    with pytest.raises(DataError, match="classes must lie in 2"):
        generate_sites(tmp_path / "gen2", classes=1)
    assert not (tmp_path / "gen2").exists()
