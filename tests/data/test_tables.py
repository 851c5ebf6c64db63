"""Schema-checked tables: every error a site's file can raise, preprocessing fitted per site, per-site
sources."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from silofl.core.errors import DataError
from silofl.data.preprocessing import TablePreprocessing, preprocessing_from_dict
from silofl.data.schema import Schema, read_table
from silofl.data.sites import load_site_tables

SCHEMA = {
    "target": {"name": "outcome", "levels": ["no", "yes"]},
    "features": {
        "age": {"type": "numeric", "bounds": [0, 120]},
        "dose": {"type": "numeric", "bounds": [0, 10], "missing": "impute"},
        "ward": {"type": "categorical", "levels": ["a", "b", "c"], "missing": "impute"},
    },
    "ignore": ["patient_id"],
}


def write_schema(tmp_path, schema=SCHEMA, name="schema.yaml"):
    import yaml

    p = tmp_path / name
    p.write_text(json.dumps(schema) if name.endswith(".json") else yaml.safe_dump(schema))
    return p


def site_frame(n=40, seed=0, shift=0.0):
    rng = np.random.default_rng(seed)
    age = np.clip(rng.normal(50 + shift, 15, n), 1, 119).round(1)
    dose = np.clip(rng.normal(4 + shift / 10, 2, n), 0, 10).round(2)
    ward = rng.choice(["a", "b", "c"], n)
    outcome = np.where(age + 5 * dose + rng.normal(0, 5, n) > 70, "yes", "no")
    return pd.DataFrame(
        {"patient_id": np.arange(n), "age": age, "dose": dose, "ward": ward, "outcome": outcome}
    )


def write_csv(tmp_path, df, name="site.csv"):
    p = tmp_path / name
    df.to_csv(p, index=False)
    return p


def check(tmp_path, df, schema=SCHEMA, name="site.csv"):
    s = Schema.from_dict(schema)
    p = write_csv(tmp_path, df, name)
    return s.check(read_table(p), str(p))


# ---------------------------------------------------------------------------------------------- every error
def test_a_valid_file_gives_the_raw_matrix(tmp_path):
    df = site_frame(5)
    raw, y, dropped = check(tmp_path, df)
    assert raw.shape == (5, 3) and dropped == 0
    assert np.allclose(raw[:, 0], df.age) and set(raw[:, 2]) <= {0.0, 1.0, 2.0}
    assert list(y) == [["no", "yes"].index(v) for v in df.outcome]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.drop(columns="age"), "column 'age' of the schema is missing"),
        (lambda d: d.drop(columns="outcome"), "column 'outcome' of the schema is missing"),
        (lambda d: d.assign(height=1.0), "column 'height' is not in the schema"),
        (
            lambda d: d.assign(age=d.age.astype(str).where(d.index != 3, "old")),
            "column 'age' is numeric in the schema but row 4 holds 'old'",
        ),
        (
            lambda d: d.assign(ward=d.ward.where(d.index != 2, "icu")),
            "column 'ward' has value 'icu' in row 3, not one of its levels",
        ),
        (
            lambda d: d.assign(outcome=d.outcome.where(d.index != 1, "maybe")),
            "column 'outcome' has value 'maybe' in row 2",
        ),
        (
            lambda d: d.assign(age=d.age.where(d.index != 0, 130.0)),
            r"column 'age' has 130 in row 1, outside its declared bounds \[0, 120\]",
        ),
        (
            lambda d: d.assign(age=d.age.where(d.index != 4, np.nan)),
            "column 'age' is empty in row 5 .*policy for it is 'error'",
        ),
        (
            lambda d: d.assign(outcome=d.outcome.where(d.index != 2, "")),
            "the target 'outcome' is empty in row 3",
        ),
        (lambda d: d.iloc[:0], "header but no data rows"),
    ],
)
def test_every_schema_error_is_one_clear_line(tmp_path, change, message):
    with pytest.raises(DataError, match=message) as e:
        check(tmp_path, change(site_frame(6)))
    assert "\n" not in str(e.value) and "site.csv" in str(e.value)


def test_file_level_errors(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        read_table(tmp_path / "nope.csv")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(DataError, match="empty"):
        read_table(tmp_path / "empty.csv")
    (tmp_path / "dup.csv").write_text("age,age,outcome\n1,2,yes\n")
    with pytest.raises(DataError, match="'age' appears twice"):
        read_table(tmp_path / "dup.csv")
    (tmp_path / "x.xlsx").write_text("?")
    with pytest.raises(DataError, match="unknown table format"):
        read_table(tmp_path / "x.xlsx")
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataError, match="not a readable Parquet file"):
        read_table(tmp_path / "bad.parquet")


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda s: s.pop("target"), "target must be a mapping"),
        (lambda s: s.update(target={"name": "outcome", "levels": ["yes"]}), "at least two levels"),
        (lambda s: s["features"].update(ward={"type": "categorical"}), "'ward' needs its levels"),
        (lambda s: s["features"].update(age={"type": "integer"}), "'age' has type 'integer'"),
        (
            lambda s: s["features"].update(age={"type": "numeric", "bounds": [5, 1]}),
            "bounds need finite low < high",
        ),
        (lambda s: s.update(missing="guess"), "missing must be one of"),
        (
            lambda s: s.update(scaling="bounds", features={"age": {"type": "numeric"}}),
            "scaling 'bounds' needs bounds",
        ),
        (lambda s: s.update(colour="red"), "unknown key"),
        (
            lambda s: s["features"].update(outcome={"type": "numeric", "bounds": [0, 1]}),
            "also declared as a feature",
        ),
    ],
)
def test_schema_file_errors(tmp_path, edit, message):
    bad = json.loads(json.dumps(SCHEMA))
    edit(bad)
    with pytest.raises(DataError, match=message):
        Schema.load(write_schema(tmp_path, bad))


def test_schema_yaml_json_and_not_yaml(tmp_path):
    assert Schema.load(write_schema(tmp_path)) == Schema.load(write_schema(tmp_path, name="s.json"))
    (tmp_path / "broken.yaml").write_text("target: [unclosed\n")
    with pytest.raises(DataError, match="not valid YAML"):
        Schema.load(tmp_path / "broken.yaml")
    with pytest.raises(DataError, match="not found"):
        Schema.load(tmp_path / "none.yaml")


def test_missing_values_drop_and_impute(tmp_path):
    schema = json.loads(json.dumps(SCHEMA))
    schema["features"]["age"]["missing"] = "drop"
    df = site_frame(6)
    df.loc[1, "age"] = np.nan
    df.loc[2, "dose"] = np.nan
    df.loc[3, "ward"] = "NA"
    raw, y, dropped = check(tmp_path, df, schema)
    assert dropped == 1 and raw.shape == (5, 3) and len(y) == 5
    assert np.isnan(raw[1, 1]) and np.isnan(raw[2, 2])  # kept as missing: the preprocessing fills them
    prep = TablePreprocessing.fit(Schema.from_dict(schema), raw, site="s")
    x = prep.transform(raw)
    assert torch.isfinite(x).all()
    assert torch.equal(x[2, 2:], torch.zeros(3))  # a missing category is all zeros
    observed = raw[~np.isnan(raw[:, 1]), 1]
    assert prep.fill[1] == pytest.approx(observed.mean())  # the site's own mean, and it says so
    assert prep.site_statistics == ["mean of dose (fill)"]


def test_parquet_equals_csv(tmp_path):
    df = site_frame(12)
    df.loc[4, "dose"] = np.nan
    df.loc[5, "ward"] = None
    df.to_parquet(tmp_path / "site.parquet", index=False)
    s = Schema.from_dict(SCHEMA)
    a = s.check(read_table(tmp_path / "site.parquet"), "p")
    b = check(tmp_path, df)
    assert np.array_equal(a[0], b[0], equal_nan=True) and np.array_equal(a[1], b[1])


# ---------------------------------------------------------------------------------------------- per site,
# never pooled
def test_public_scaling_is_the_same_at_every_site_and_site_scaling_is_each_sites_own(tmp_path):
    paths = [write_csv(tmp_path, site_frame(40, seed=k, shift=20 * k), f"h{k}.csv") for k in range(2)]
    pub = load_site_tables(str(write_schema(tmp_path)), [str(p) for p in paths], test_fraction=0.25)
    assert pub.names == ["h0", "h1"] and [len(y) for _, y in pub.parts] == [30, 30]
    assert [len(y) for _, y in pub.internal] == [10, 10]
    assert pub.preprocessing[0].center[:1] == pub.preprocessing[1].center[:1] == [60.0]  # bounds [0, 120]
    own = dict(SCHEMA, scaling="site")
    site = load_site_tables(
        str(write_schema(tmp_path, own, "own.yaml")), [str(p) for p in paths], test_fraction=0.25
    )
    for k, (x, _) in enumerate(site.parts):
        assert abs(float(x[:, 0].mean())) < 1e-5  # standardised with its own training rows' mean
        raw, _, _ = Schema.from_dict(own).check(read_table(paths[k]), "")
        keep = np.setdiff1d(np.arange(40), np.sort(np.random.default_rng([0, k]).permutation(40)[:10]))
        assert site.preprocessing[k].center[0] == pytest.approx(raw[keep, 0].mean())  # its own rows only
    assert site.preprocessing[0].center[0] != pytest.approx(site.preprocessing[1].center[0])
    # the shared test set is seen through each site's own preprocessing
    assert not torch.allclose(site.external[0][0], site.external[1][0])
    assert "union of the sites' held-out rows" in site.test_set


def test_an_external_test_file_and_a_bad_site_name_the_file(tmp_path):
    paths = [str(write_csv(tmp_path, site_frame(20, seed=k), f"s{k}.csv")) for k in range(2)]
    test = str(write_csv(tmp_path, site_frame(15, seed=9), "ext.csv"))
    src = load_site_tables(str(write_schema(tmp_path)), paths, test_path=test)
    assert all(len(y) == 15 for _, y in src.external) and "ext.csv" in src.test_set
    bad = site_frame(20).assign(ward="z")
    with pytest.raises(DataError, match=r"bad\.csv: column 'ward' has value 'z'"):
        load_site_tables(str(write_schema(tmp_path)), [paths[0], str(write_csv(tmp_path, bad, "bad.csv"))])
    with pytest.raises(DataError, match="too few"):
        load_site_tables(
            str(write_schema(tmp_path)), [paths[0], str(write_csv(tmp_path, site_frame(1), "one.csv"))]
        )


def test_preprocessing_round_trips_through_json_and_new_files_are_checked(tmp_path):
    raw, _, _ = check(tmp_path, site_frame(30))
    prep = TablePreprocessing.fit(Schema.from_dict(dict(SCHEMA, scaling="site")), raw, site="h")
    again = preprocessing_from_dict(json.loads(json.dumps(prep.to_dict())))
    assert torch.equal(prep.transform(raw), again.transform(raw))
    new = site_frame(4).drop(columns="outcome")
    x, y, ids = again.read(write_csv(tmp_path, new, "new.csv"))
    assert x.shape == (4, 3) and y is None and ids == ["1", "2", "3", "4"]
    with pytest.raises(DataError, match="not in the schema"):
        again.read(write_csv(tmp_path, new.assign(extra=1), "extra.csv"))
