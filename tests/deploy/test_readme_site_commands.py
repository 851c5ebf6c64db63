"""The README's between-institutions commands, exactly as written (read from docs/howto/deploy.md,
tests/readme.py), with real processes on loopback: the coordinator's `deploy certs`, `deploy superlink` (kept
running), each of the three example sites' (hospital-a, -b, -c) `site init` on its own table (hospital_a.csv …
with the collaboration's schema.yaml), `site pin`, the coordinator's `deploy register`, every site's `site
run` (kept running) and `deploy start` — then `deploy local` as written (`.venv/bin/silofl`, run beside the
others: a Flower deployment mostly waits).

The short commands (certs, init, pin, register) run through the command-line app in the test's process
(typer's CliRunner, argv as written); the servers, the sites, `deploy start` and `deploy local` are processes
of their own.

The README names the coordinator `$COORD` (`COORD=coord.example.org`, set on every machine); here every
machine is this one, so the test sets COORD=localhost — the only value it changes. The SuperLink listens on
9092 as written. `deploy start` runs its 50 rounds as written; the plan the README states (σ 3: ε ≈ 6.1 at
most, within the sites' lifetime ε 8; σ 1: ≈ 30, refused) is checked from the accountant inputs (σ, q, steps)
each site reported.

`site init … --data hospital_a.csv --schema schema.yaml` ended in a traceback before (`TypeError: object of
type 'NoneType' has no len()`: the split seed), and `deploy start … --dataset table` was refused ("needs
--site-data") though the sites hold the data."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests import readme
from tests.helpers import silofl_here

DEPLOY = readme.DEPLOY  # (file, title): docs/howto/deploy.md since issue 27
SITES = ("a", "b", "c")
VARIABLES = {"COORD": "localhost"}  # the README's variables, as this machine sets them
PORT = 9092  # the README's SuperLink port, as written
# options appended to a command as written (nothing removed or replaced), and why
APPENDED: dict[tuple[str, str], list[str]] = {}


def _per_site(args: list[str], x: str) -> list[str]:
    """A site's command as the README shows it for hospital-a, for site ``x``."""
    return [
        a.replace("site-a", f"site-{x}").replace("hospital_a.csv", f"hospital_{x}.csv")
        if a != "hospital-a"
        else f"hospital-{x}"
        for a in args
    ]


def _stop(p: subprocess.Popen, first: int = signal.SIGTERM) -> None:
    """Stop a process started in its own session, and its group: ``first``, then SIGKILL if it lingers."""
    for sig in (first, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(60)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.mark.slow
@pytest.mark.deploy
@pytest.mark.multiprocess
def test_the_readme_deployment_commands_as_written(tmp_path):
    from silofl.privacy.analysis import epsilon_of
    from studies.tabular import write_sites

    assert readme.variables(DEPLOY).keys() == VARIABLES.keys()
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", PORT))
        except OSError:
            pytest.fail(f"port {PORT}, the README's SuperLink port, is busy on this machine")
    cmds = {tuple(c.split()[1:3]): readme.argv(c, env=VARIABLES) for c in readme.commands(DEPLOY)}
    assert list(cmds) == [
        ("deploy", "certs"),
        ("deploy", "superlink"),
        ("site", "init"),
        ("site", "pin"),
        ("deploy", "register"),
        ("site", "run"),
        ("deploy", "start"),
        ("deploy", "local"),
    ]
    assert len(cmds) == len(readme.commands(DEPLOY)), "one command of each kind (the test runs each once)"
    env = {
        **os.environ,
        "SILOFL_NO_PROGRESS": "1",
        "OMP_NUM_THREADS": "1",
        "COLUMNS": "200",
        "PYTHONUNBUFFERED": "1",
    }
    cli = [sys.executable, "-m", "silofl.cli.main"]
    procs: list[tuple[subprocess.Popen, int]] = []
    logs = tmp_path / "logs"
    logs.mkdir()

    def start(name: str, cmd: list[str], cwd: Path, first: int = signal.SIGTERM) -> None:
        with open(logs / f"{name}.log", "wb") as log:
            procs.append(
                (
                    subprocess.Popen(
                        cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                    ),
                    first,
                )
            )

    def tails() -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in sorted(logs.iterdir())
        )

    def silofl(args: list[str], check: bool = True, here: bool = True) -> subprocess.CompletedProcess:
        """A command run to completion: ``here``, through the command-line app in this process (typer's
        CliRunner: a process each cost about 2 s of CPU importing torch), in ``tmp_path`` with ``env``;
        otherwise as a process of its own."""
        if here:
            r = silofl_here(args, tmp_path, env)
        else:
            r = subprocess.run(
                [*cli, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
            )
        assert not check or r.returncode == 0 and "Traceback" not in r.stderr, (
            f"silofl {' '.join(args)} → {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}\n{tails()}"
        )
        return r

    # the files the commands name: one island's penguins per hospital, the schema they share
    schema, paths = write_sites(tmp_path / "penguins")
    shutil.copy(schema, tmp_path / "schema.yaml")
    for x, p in zip(SITES, paths, strict=True):
        (pd.read_parquet(p) if p.suffix == ".parquet" else pd.read_csv(p)).to_csv(
            tmp_path / f"hospital_{x}.csv", index=False
        )
    one = tmp_path / "one-machine"  # `deploy local` as written: .venv/bin/silofl in its own working folder
    (one / ".venv").parent.mkdir()
    (one / ".venv").symlink_to(Path(sys.executable).parent.parent)
    assert (one / ".venv" / "bin" / "silofl").is_file(), "the console script silofl beside this Python"
    try:
        t0 = time.monotonic()
        start(
            "deploy-local", [".venv/bin/silofl", *cmds[("deploy", "local")]], one, signal.SIGINT
        )  # SIGINT: it
        # stops its SuperLink and sites
        silofl(cmds[("deploy", "certs")])
        assert (tmp_path / "coord" / "pki" / "ca.crt").is_file()
        start("superlink", [*cli, *cmds[("deploy", "superlink")]], tmp_path)
        # the coordinator gives coord/pki/ca.crt and coord/pki/coordinator.json to every site (the README's
        # comment)
        for f in ("ca.crt", "coordinator.json"):
            shutil.copy(tmp_path / "coord" / "pki" / f, tmp_path / f)
        for x in SITES:
            silofl(_per_site(cmds[("site", "init")], x))
            shutil.copy(
                tmp_path / f"site-{x}" / "keys" / "public.json", tmp_path / f"hospital-{x}.json"
            )  # sent around
        again = silofl(_per_site(cmds[("site", "init")], "a"), check=False)
        assert (
            again.returncode == 2 and "never overwritten" in again.stderr and "Traceback" not in again.stderr
        )
        for x in SITES:
            silofl(_per_site(cmds[("site", "pin")], x))
            fed = json.loads((tmp_path / f"site-{x}" / "federation.json").read_text())
            assert [c["name"] for c in fed["sites"]] == ["hospital-a", "hospital-b", "hospital-c"]
            assert fed.get("coordinator"), "the coordinator's key is pinned"
        site = json.loads((tmp_path / "site-b" / "site.json").read_text())
        assert (
            site["name"] == "hospital-b"
            and site["lifetime_epsilon"] == 8
            and site["private_model"] == "tabmlp"
        )
        assert site["data"].endswith("hospital_b.csv") and site["schema"].endswith("schema.yaml")
        deadline = time.monotonic() + 120
        while "SuperLink on" not in (logs / "superlink.log").read_text(
            errors="replace"
        ):  # it says so when up
            assert procs[1][0].poll() is None and time.monotonic() < deadline, tails()
            time.sleep(0.5)
        silofl(cmds[("deploy", "register")])
        for x in SITES:
            start(f"site-{x}", [*cli, *_per_site(cmds[("site", "run")], x)], tmp_path)
        t1 = time.monotonic()
        silofl([*cmds[("deploy", "start")], *APPENDED.get(("deploy", "start"), [])], here=False)
        t_start = time.monotonic() - t1

        out = tmp_path / "runs" / "hospitals"
        s = json.loads((out / "summary.json").read_text())
        cfg = yaml.safe_load((out / "config.yaml").read_text())
        assert (
            cfg["dataset"] == "table"
            and cfg["data_at_sites"]
            and not cfg["site_data"]
            and cfg["rounds"] == 50
        )
        assert s["rounds_run"] == 50 and s["sites"] == ["hospital-a", "hospital-b", "hospital-c"]
        assert s["engine"]["tls"] and s["engine"]["node_auth"] and s["engine"]["sealed"]
        assert s["privacy"]["formal_guarantee"] is True  # no seed: secret randomness at every site
        assert len(s["final"]["per_client"]) == 3 and all(r["epsilon"] > 0 for r in s["final"]["per_client"])
        for x in SITES:  # each site's spend is in its own ledger
            assert any((tmp_path / f"site-{x}" / "ledger").iterdir())
        # the README's 50 rounds, from what each site's accountant recorded
        plans = {}
        for sigma in (3.0, 1.0):
            plans[sigma] = [
                epsilon_of(cfg["accountant"], ((sigma, a["sample_rate"], a["steps"]),), a["delta"])
                for a in s["accounting"]
            ]
        assert all(a["noise_multiplier"] == 3.0 and a["delta"] == 1e-5 for a in s["accounting"]), s[
            "accounting"
        ]
        assert max(plans[3.0]) <= 6.15 < 8, plans  # "at most ε ≈ 6.1 … within the lifetime ε of 8"
        assert 25 < max(plans[1.0]) < 35, plans  # "at σ = 1 the smallest site would plan about ε 30"

        local = procs[0][0]
        local.wait(900)
        log = (logs / "deploy-local.log").read_text(errors="replace")
        assert local.returncode == 0 and "Traceback" not in log, log[-4000:]
        d = json.loads((one / "runs" / "deployed" / "summary.json").read_text())
        assert d["rounds_run"] == 5 and len(d["final"]["per_client"]) == 4 and d["engine"]["tls"]
        assert (one / "runs" / "deployed" / "metrics.jsonl").is_file()
        print(
            f"deploy start (50 rounds): {t_start:.0f} s; all, with deploy local beside: "
            f"{time.monotonic() - t0:.0f} s"
        )
    finally:
        for p, first in reversed(procs):
            _stop(p, first)
