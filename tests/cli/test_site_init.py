"""`silofl site init --id-column COL`: the person id is part of the site's data declaration (site.json), so
every run samples and accounts by person; a table whose id-like column repeats, with no --id-column, gets the
warning simulated runs give (silofl.data.sites.repeated_id_warning) naming the column and what ε covers."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from silofl.cli.main import app
from silofl.deploy.site import load_local
from silofl.privacy.person import UnitWarning
from silofl.site.folder import SiteConfig
from tests.helpers import write_survival_sites

runner = CliRunner()


def _init(tmp_path, folder: str, schema, table, *extra):
    args = ["site", "init", str(tmp_path / folder), "--name", folder, "--data", table]
    return runner.invoke(app, [*args, "--schema", str(schema), "--lifetime-epsilon", "8", *extra])


def test_site_init_declares_the_id_column_and_warns_on_a_repeated_one_without_it(tmp_path):
    schema, tables, _ = write_survival_sites(tmp_path / "data", sites=1, rows=60, persons=True)
    r = _init(tmp_path, "a", schema, tables[0], "--id-column", "pid")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "a" / "site.json").read_text())["id_column"] == "pid"
    assert "privacy unit: person (column pid)" in r.output and "warning" not in r.output
    cfg = SiteConfig.load(tmp_path / "a")
    d = load_local(tmp_path / "a", cfg)  # every run of this site: its rows come with their persons
    assert d.id_column == "pid" and d.persons is not None and len(d.persons) == len(d.y)

    r = _init(tmp_path, "b", schema, tables[0])
    assert r.exit_code == 0, r.output
    said = UnitWarning("pid", 2, ["site0"]).message()  # what repeated_id_warning says of this table
    assert f"warning: site b: {said}" in r.output  # the simulated runs' own warning, word for word
    assert "column 'pid' looks like a person id" in said and "--id-column pid" in said
    assert "privacy unit: row" in r.output
    assert json.loads((tmp_path / "b" / "site.json").read_text())["id_column"] is None


def test_site_init_refuses_an_id_column_the_table_lacks_with_nothing_written(tmp_path):
    schema, tables, _ = write_survival_sites(tmp_path / "data", sites=1, rows=40)
    r = _init(tmp_path, "c", schema, tables[0], "--id-column", "patient")
    assert r.exit_code == 2 and "patient" in r.output and "Traceback" not in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / "c" / "site.json").exists()
