"""Bad table input, found at once: a UTF-8 byte-order mark, every schema mismatch in one line, a test file
that shares a person with a site."""

import pytest

from silofl.core.errors import DataError
from silofl.data.schema import Schema, read_table
from silofl.data.sites import load_site_tables
from tests.data.test_person_tables import person_frame
from tests.data.test_tables import SCHEMA, site_frame, write_csv, write_schema


def test_a_utf8_bom_is_read_as_a_bom(tmp_path):
    """Excel's default CSV export starts with a byte-order mark; it used to stick to the first column's name
    ("column 'patient_id' missing")."""
    p = tmp_path / "excel.csv"
    p.write_bytes("\ufeff".encode() + site_frame(6).to_csv(index=False).encode())
    df = read_table(p)
    assert list(df.columns)[0] == "patient_id"
    raw, y, _ = Schema.from_dict(SCHEMA).check(df, str(p))
    assert raw.shape == (6, 3) and len(y) == 6


def test_every_mismatch_is_named_in_one_line(tmp_path):
    df = site_frame(8).drop(columns=["age", "dose"]).assign(island="x", height=1.0)
    df.loc[2, "ward"] = "zz"
    p = write_csv(tmp_path, df)
    with pytest.raises(DataError) as e:
        Schema.from_dict(SCHEMA).check(read_table(p), str(p))
    msg = str(e.value)
    assert "\n" not in msg and "4 mismatches with the schema" in msg
    for part in (
        "column 'age' of the schema is missing",
        "column 'dose' of the schema is missing",
        "columns 'island', 'height' are not in the schema",
        "column 'ward' has value 'zz' in row 3",
    ):
        assert part in msg


def test_a_test_file_with_a_training_person_is_refused(tmp_path):
    sites = [str(write_csv(tmp_path, person_frame(30, s), f"h{s}.csv")) for s in (0, 1)]
    test = write_csv(tmp_path, person_frame(5, 9), "test.csv")  # ids p0 … p4: persons of both sites
    with pytest.raises(DataError, match=r"test.csv: person .p0. \(and 4 more\) of the id column also has"):
        load_site_tables(str(write_schema(tmp_path)), sites, str(test), 0.3, 0, "patient_id")


def test_a_test_file_with_other_columns_names_them(tmp_path):
    sites = [str(write_csv(tmp_path, site_frame(30, s), f"h{s}.csv")) for s in (0, 1)]
    test = write_csv(tmp_path, site_frame(10, 9).drop(columns="dose").assign(bmi=22.0), "test.csv")
    with pytest.raises(DataError) as e:
        load_site_tables(str(write_schema(tmp_path)), sites, str(test), 0.3, 0)
    msg = str(e.value)
    assert "test.csv: 2 mismatches" in msg and "'dose' of the schema is missing" in msg and "'bmi'" in msg


def _yaml_blocks(path):
    import re

    import yaml

    from tests.readme import ROOT

    text = (ROOT / path).read_text()
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.S)]


@pytest.mark.parametrize("page", ["README.md", "docs/howto/own-data.md"])
def test_the_pages_penguin_schema_reads_the_real_penguin_files(tmp_path, page):
    """The schema the page shows is the one its table run reads the real penguins with (it used to fail on
    'island', then on 'bill_depth_mm')."""
    pytest.importorskip("palmerpenguins")
    from studies.tabular import write_sites

    _, files = write_sites(tmp_path)
    (block,) = [b for b in _yaml_blocks(page) if b.get("target", {}).get("name") == "species"]
    schema = Schema.from_dict(block)
    for f in files:
        raw, y, _ = schema.check(read_table(f), str(f))
        assert len(y) > 40 and raw.shape[1] == len(block["features"])
