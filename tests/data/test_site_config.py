"""Per-site sources in the run config and on the command line: defaults, refusals, one-line errors."""

import pytest
from typer.testing import CliRunner

from silofl.cli.main import app
from silofl.core.errors import ConfigError
from silofl.runner.config import RunConfig
from tests.data.test_tables import site_frame, write_csv, write_schema

runner = CliRunner()


def test_site_data_sets_one_client_per_site_and_partition_site():
    cfg = RunConfig.from_dict(
        {"dataset": "table", "schema": "s.yaml", "site_data": "a.csv, b.parquet"}
    ).resolve()
    assert cfg.site_data == ["a.csv", "b.parquet"] and cfg.clients == 2 and cfg.partition == "site"


@pytest.mark.parametrize(
    "options, message",
    [
        ({"dataset": "table", "site_data": ["a.csv"]}, "needs --schema"),
        ({"dataset": "table", "schema": "s.yaml"}, "needs --site-data"),
        ({"dataset": "digits", "schema": "s.yaml"}, "--schema applies to dataset 'table'"),
        (
            {"dataset": "digits", "site_data": ["a", "b"]},
            "--site-data takes per-site sources of .folder. or .table.",
        ),
        (
            {"dataset": "table", "schema": "s.yaml", "site_data": ["a.csv", "b.csv"], "clients": 3},
            "names 2 sites but clients is 3",
        ),
        (
            {"dataset": "table", "schema": "s.yaml", "site_data": ["a.csv", "b.csv"], "partition": "iid"},
            "partition must be 'site'",
        ),
        ({"dataset": "digits", "test_data": "t.csv"}, "--test-data goes with --site-data"),
        (
            {"dataset": "table", "schema": "s.yaml", "site_data": ["a.csv"], "test_fraction": 1.0},
            "test_fraction must lie in",
        ),
    ],
)
def test_inconsistent_sources_are_refused(options, message):
    with pytest.raises(ConfigError, match=message):
        RunConfig.from_dict(options).resolve()


def test_a_bad_site_file_stops_the_run_with_one_line_and_writes_nothing(tmp_path):
    good = write_csv(tmp_path, site_frame(30), "a.csv")
    bad = write_csv(tmp_path, site_frame(30).assign(age=200.0), "b.csv")
    r = runner.invoke(
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
            f"{good},{bad}",
            "--proxy-model",
            "logreg",
            "--rounds",
            "1",
            "--quiet",
            "--out",
            str(tmp_path / "run"),
        ],
    )
    assert (
        r.exit_code == 2 and "b.csv: column 'age' has 200 in row 1, outside its declared bounds" in r.output
    )
    assert "Traceback" not in r.output and not (tmp_path / "run" / "summary.json").exists()
    r = runner.invoke(
        app,
        [
            "run",
            "--method",
            "proxyfl",
            "--dataset",
            "table",
            "--schema",
            str(write_schema(tmp_path)),
            "--site-data",
            f"{good},{good}",
            "--rounds",
            "1",
            "--defaults",
            "none",  # the bare defaults (a table's own recipe, proxyfl-table, gives tabmlp)
            "--quiet",
            "--out",
            str(tmp_path / "r2"),
        ],
    )
    assert (
        r.exit_code == 2 and "LeNet5 is a convolutional model for images" in r.output
    )  # the bare default private model
    assert "(table rows) use tabmlp, logreg" in r.output
