"""Numerical safety as a privacy property (issue 41, "NaN reported as a result"): a person's squared gradient
norm summed over pairs of rows can dip below zero in float32 when the rows' gradients cancel — its root, the
clip factor, was NaN and the site's model NaN from then on, reported as a result. Squared norms are clamped at
zero before any root; a non-finite parameter, gradient or noise value stops the site's run with one line and
a non-zero exit."""

import json

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from silofl.cli.main import app
from silofl.core.errors import NonFiniteValue
from silofl.privacy.dpsgd import require_finite
from silofl.privacy.grad_sample import GhostClipper, VmapClipper, clip_factors
from tests.adversarial.test_person_deployed import person_args
from tests.data.test_tables import write_csv


def loss(logits, y):
    return nn.functional.cross_entropy(logits, y, reduction="none")


def cancelling(persons=2000, seed=0):
    """Two rows per person, the same large features and opposite labels: with a model near 0 the person's
    two gradients nearly cancel, and the pair sum of their squared norm rounds below zero in float32."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(persons, 16, generator=g) * 30
    x = a.repeat_interleave(2, 0)
    y = torch.tensor([0, 1]).repeat(persons)
    groups = torch.arange(persons).repeat_interleave(2)
    model = nn.Linear(16, 2)
    with torch.no_grad():
        model.weight.mul_(1e-4)
        model.bias.zero_()
    return model, x, y, groups


@pytest.mark.parametrize(("clipper", "persons"), [(GhostClipper, 2000), (VmapClipper, 200)])
def test_per_person_norms_that_cancel_in_float32_give_finite_clipped_sums(clipper, persons):
    model, x, y, groups = cancelling(persons)
    _, grads, sq = clipper(model).clipped_sum(x, loss, (y,), 1.0, groups=groups)
    assert bool((sq >= 0).all())
    assert all(bool(torch.isfinite(g).all()) for g in grads.values())


def test_a_negative_squared_norm_is_a_zero_norm_never_a_nan():
    c = clip_factors(torch.tensor([-1e-3, 0.0, 4.0]), 1.0)
    assert c.tolist() == pytest.approx([1.0, 1.0, 0.5], rel=1e-5)


def test_require_finite_names_the_first_non_finite_value():
    require_finite([("a", torch.ones(3)), ("b", None), ("c", torch.zeros(0))])
    with pytest.raises(NonFiniteValue, match="'b'|b is not finite"):
        require_finite([("a", torch.ones(3)), ("b", torch.tensor([1.0, float("nan")]))])
    with pytest.raises(NonFiniteValue, match="c is not finite"):
        require_finite([("a", torch.ones(3)), ("c", torch.tensor([float("inf")]))])


def cancelling_table(tmp_path):
    """A table of persons with two rows each, identical features and opposite labels."""
    import numpy as np
    import pandas as pd

    from tests.data.test_tables import site_frame

    paths = []
    for s in (0, 1):
        base = site_frame(30, s)
        df = pd.concat([base, base]).reset_index(drop=True)
        df["patient_id"] = [f"p{i}" for i in np.tile(np.arange(30), 2)]
        df["outcome"] = ["no"] * 30 + ["yes"] * 30
        paths.append(str(write_csv(tmp_path, df, f"c{s}.csv")))
    return paths


def person_run(tmp_path, out, *extra):
    args = ["run", *person_args(tmp_path, cancelling_table(tmp_path)), "--id-column", "patient_id"]
    args += ["--rounds", "3", "--out", str(tmp_path / out), *extra]
    return CliRunner().invoke(app, args)


@pytest.mark.slow
def test_a_person_level_run_on_cancelling_rows_stays_finite(tmp_path):
    r = person_run(tmp_path, "ok")
    assert r.exit_code == 0, r.output
    s = json.loads((tmp_path / "ok" / "summary.json").read_text())
    figures = [v for row in s["final"]["per_client"] for k, v in row.items() if k.endswith("_acc")]
    assert figures and all(v == v for v in figures)  # no NaN among the reported figures


@pytest.mark.slow
def test_a_forced_nan_stops_the_run_with_one_line_and_a_nonzero_exit(tmp_path, monkeypatch):
    from silofl.privacy.noise import NoiseSource

    real = NoiseSource.normal

    def poisoned(self, shape, std, dtype=torch.float32):
        out = real(self, shape, std, dtype)
        return out.flatten().index_fill(0, torch.tensor([0]), float("nan")).reshape(out.shape)

    monkeypatch.setattr(NoiseSource, "normal", poisoned)
    r = person_run(tmp_path, "nan")
    assert r.exit_code == 2
    errors = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "client 0, round 1" in errors[0] and "not finite" in errors[0], r.output
    assert "Traceback" not in r.output
    assert not (tmp_path / "nan" / "summary.json").exists()  # no table with a NaN in it
