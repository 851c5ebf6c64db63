"""Tables with several rows per person: --id-column splits by person and gives each training row its person;
without it a repeated id-like column is flagged; bad id columns are one-line errors (exit 2, nothing
written)."""

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from silofl.cli.main import app
from silofl.core.errors import ConfigError, DataError
from silofl.data.sites import holdout_groups, load_site_tables
from silofl.runner.config import RunConfig
from tests.data.test_tables import SCHEMA, site_frame, write_csv, write_schema


def person_frame(persons=30, seed=0):
    """1–4 rows per person; ``age`` is the person's number (so a split can be read back from the inputs)."""
    rng = np.random.default_rng(seed)
    k = rng.integers(1, 5, persons)
    pid = np.repeat(np.arange(persons), k)
    df = site_frame(len(pid), seed)
    return df.assign(patient_id=[f"p{i}" for i in pid], age=pid.astype(float) + 1).sample(
        frac=1.0, random_state=seed
    )


def test_the_group_holdout_never_splits_a_person():
    persons = np.random.default_rng(1).integers(0, 40, 300)
    persons = np.unique(persons, return_inverse=True)[1]
    tr, te = holdout_groups(persons, 0.25, 0, 3, "x")
    assert not set(persons[tr]) & set(persons[te])
    assert len(set(persons[te])) == round(0.25 * (persons.max() + 1))
    assert sorted(np.concatenate([tr, te])) == list(range(300))


def test_id_column_holds_out_whole_persons_and_numbers_each_sites_training_persons(tmp_path):
    a, b = person_frame(30, 0), person_frame(25, 1)
    paths = [str(write_csv(tmp_path, a, "a.csv")), str(write_csv(tmp_path, b, "b.csv"))]
    src = load_site_tables(str(write_schema(tmp_path)), paths, id_column="patient_id")
    assert src.unit_warning is None and src.persons is not None
    for df, (x_tr, _), (x_te, _), persons in zip((a, b), src.parts, src.internal, src.persons, strict=True):
        age_tr, age_te = (
            set(x_tr[:, 0].round(decimals=5).tolist()),
            set(x_te[:, 0].round(decimals=5).tolist()),
        )
        assert age_tr and age_te and not age_tr & age_te  # no person on both sides
        assert len(persons) == len(x_tr) and persons.max() + 1 == len(age_tr)
        for p in range(persons.max() + 1):  # a training person's rows: one person number, one age
            assert len(set(x_tr[persons == p, 0].tolist())) == 1
        assert len(x_tr) + len(x_te) == len(df)


def test_a_repeated_id_column_is_flagged_and_a_unique_one_is_not(tmp_path):
    schema = str(write_schema(tmp_path))
    once = [str(write_csv(tmp_path, site_frame(30, s), f"u{s}.csv")) for s in (0, 1)]
    assert load_site_tables(schema, once).unit_warning is None  # one row per patient_id: a row is a person
    rep = [str(write_csv(tmp_path, person_frame(20, s), f"r{s}.csv")) for s in (0, 1)]
    w = load_site_tables(schema, rep).unit_warning
    k = max(int(person_frame(20, s).patient_id.value_counts().max()) for s in (0, 1))
    assert w["column"] == "patient_id" and w["max_rows_per_value"] == k and w["epsilon_unit"] == "row"
    assert f"about {k}·ε" in w["message"] and "--id-column patient_id" in w["message"]


def test_a_missing_or_incomplete_id_column_is_one_line(tmp_path):
    schema = str(write_schema(tmp_path, {**SCHEMA, "ignore": ["patient_id", "person"]}))
    df = person_frame(12)
    with pytest.raises(DataError, match="a.csv: no id column 'person'"):
        load_site_tables(schema, [str(write_csv(tmp_path, df, "a.csv"))], id_column="person")
    holes = df.assign(patient_id=df.patient_id.where(np.arange(len(df)) != 2, ""))
    with pytest.raises(DataError, match="the id column 'patient_id' is empty in row 3"):
        load_site_tables(schema, [str(write_csv(tmp_path, holes, "b.csv"))], id_column="patient_id")


def test_an_id_column_that_is_a_feature_is_refused(tmp_path):
    p = str(write_csv(tmp_path, person_frame(12)))
    with pytest.raises(DataError, match="is a feature or the target"):
        load_site_tables(str(write_schema(tmp_path)), [p], id_column="age")


@pytest.mark.parametrize(
    "options, message",
    [
        ({"dataset": "digits", "id_column": "pid"}, "--id-column names a column of a table"),
        (
            {
                "dataset": "table",
                "schema": "s.yaml",
                "site_data": ["a.csv"],
                "id_column": "pid",
                "method": "dp-fedavg",
            },
            "client-level DP",
        ),
    ],
)
def test_id_column_on_other_data_or_client_level_methods_is_refused(options, message):
    with pytest.raises(ConfigError, match=message):
        RunConfig.from_dict(options).resolve()


@pytest.mark.slow
def test_the_cli_refuses_a_missing_id_column_with_exit_2_and_writes_nothing(tmp_path):
    good = write_csv(tmp_path, person_frame(20), "a.csv")
    r = CliRunner().invoke(
        app,
        [
            "run",
            "--method",
            "fedavg",
            "--dataset",
            "table",
            "--schema",
            str(write_schema(tmp_path)),
            "--site-data",
            f"{good},{good}",
            "--id-column",
            "person",
            "--proxy-model",
            "logreg",
            "--rounds",
            "1",
            "--quiet",
            "--out",
            str(tmp_path / "run"),
        ],
    )
    assert r.exit_code == 2 and "a.csv: no id column 'person'" in r.output, r.output
    assert "Traceback" not in r.output and not (tmp_path / "run" / "summary.json").exists()
    assert pd.read_csv(good).shape[0] > 0
