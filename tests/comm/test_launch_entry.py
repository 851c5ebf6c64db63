"""`silofl launch` parses its options once and starts every process with data — the run as
``RunConfig.to_dict()`` and the launch's options — never a `silofl run` command line to re-parse."""

import json

import click
import pytest
import typer.main

from silofl.auditing.entry import settings_from_data
from silofl.cli import main
from silofl.core.forking import Entry
from silofl.runner.config import RunConfig
from silofl.runner.entry import RankOptions

RUN = ["--method", "fedavg", "--dataset", "digits", "--clients", "3", "--rounds", "2", "--delta", "1e-3"]


def plan(command: str, args: list[str], processes: int = 2, check: bool = True) -> dict:
    """What `silofl launch` plans for ``command ARGS`` (``check``: as on machine 0, which checks them)."""
    launching = {"processes": processes, "check": check, "command": "silofl launch …"}
    ctx = click.Context(typer.main.get_command(main.app))
    main._plan_launch(ctx, command, args, launching)
    return launching


def flags_in(value) -> list[str]:
    """Every string in ``value`` that looks like a command-line flag."""
    if isinstance(value, dict):
        return [f for v in value.values() for f in flags_in(v)]
    if isinstance(value, list):
        return [f for v in value for f in flags_in(v)]
    return [value] if isinstance(value, str) and value.startswith("--") else []


def test_launched_processes_get_the_run_as_data(tmp_path):
    out = str(tmp_path / "run")
    launching = plan("run", [*RUN, "--lr", "0.05", "--peer-timeout", "60", "--quiet", "--out", out])
    entry = launching["entry"]
    assert isinstance(entry, Entry) and entry.target == "silofl.runner.entry:run_rank"
    assert Entry.from_json(entry.to_json()) == entry and not flags_in(json.loads(entry.to_json()))
    cfg = RunConfig.from_dict(entry.kwargs["config"])
    asked = {"method": "fedavg", "dataset": "digits", "clients": 3, "rounds": 2, "delta": 1e-3, "lr": 0.05}
    assert cfg == RunConfig.from_dict({**asked, "out": out})
    assert RankOptions.from_dict(entry.kwargs["engine"]) == RankOptions(peer_timeout_s=60.0, quiet=True)
    assert launching["preload"] == "silofl.runner.preload"
    assert not (tmp_path / "run").exists()  # planned, nothing run


def test_a_launched_audit_gets_its_settings_as_data(tmp_path):
    out = str(tmp_path / "audit")
    args = [*RUN, "--canaries", "50", "--canary-kind", "dirac", "--out", out]
    entry = plan("audit", args, check=False)["entry"]  # the audit's checks (its data) are the slow tests'
    assert entry.target == "silofl.auditing.entry:audit_rank" and not flags_in(json.loads(entry.to_json()))
    s = settings_from_data(entry.kwargs["settings"])
    assert (s.canaries, s.canary_kind) == (50, "dirac") and entry.kwargs["out"] == out
    assert entry.kwargs["command"] == "silofl launch …"  # recorded in the audit, never parsed


def test_a_bad_launched_option_is_refused_before_any_process(tmp_path):
    with pytest.raises(click.exceptions.Exit) as e:
        plan("run", [*RUN, "--out", str(tmp_path / "r")], processes=4)  # 4 processes for 3 clients
    assert e.value.exit_code == 2
    with pytest.raises(click.exceptions.Exit) as e:
        plan("run", [*RUN, "--rounds", "x"])
    assert e.value.exit_code == 2
