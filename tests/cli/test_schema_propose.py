"""``silofl schema propose``: a schema from one file that reads that file, its bounds flagged as the file's
own."""

import yaml
from typer.testing import CliRunner

from silofl.cli.main import app
from silofl.data.schema import Schema, read_table
from tests.data.test_tables import site_frame, write_csv


def test_a_proposed_schema_reads_its_own_file_and_flags_its_bounds(tmp_path):
    df = site_frame(30).assign(patient_id=[f"id{i}" for i in range(30)])
    df["dose"] = df["dose"].astype(object)
    df.loc[3, "dose"] = ""
    p = write_csv(tmp_path, df)
    p.write_bytes("\ufeff".encode() + p.read_bytes())  # as Excel exports it
    out = tmp_path / "schema.yaml"
    r = CliRunner().invoke(app, ["schema", "propose", str(p), "--target", "outcome", "--out", str(out)])
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert "this file's own minimum and maximum" in text
    s = yaml.safe_load(text)
    assert s["target"] == {"name": "outcome", "levels": ["no", "yes"]}
    assert s["features"]["age"]["type"] == "numeric" and s["features"]["ward"]["levels"] == ["a", "b", "c"]
    assert s["features"]["dose"]["missing"] == "impute" and s["ignore"] == ["patient_id"]
    raw, y, _ = Schema.load(out).check(read_table(p), str(p))
    assert raw.shape == (30, 3) and len(y) == 30
    again = CliRunner().invoke(app, ["schema", "propose", str(p), "--out", str(out)])
    assert again.exit_code == 2 and "never overwritten" in again.output


def test_an_absent_target_is_one_line_and_exit_2(tmp_path):
    p = write_csv(tmp_path, site_frame(5))
    r = CliRunner().invoke(app, ["schema", "propose", str(p), "--target", "species"])
    assert r.exit_code == 2 and "no column 'species' to take as the target" in " ".join(r.output.split())
