"""The README's between-institutions commands that need no running SuperLink, exactly as written (read from
README.md, tests/readme.py): the coordinator's `deploy certs`, and at each of the three sites the example names
(hospital-a, -b, -c) `site init` on its own table (hospital_a.csv … with the collaboration's schema.yaml) and `site
pin` with the three cards. `site init … --data hospital_a.csv --schema schema.yaml` ended in a traceback before
(`TypeError: object of type 'NoneType' has no len()`: the split seed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from tests import readme

DEPLOY = "Deploying between institutions"
SITES = ("a", "b", "c")


def _per_site(args: list[str], x: str) -> list[str]:
    """A site's command as the README shows it for hospital-a, for site ``x``."""
    return [a.replace("site-a", f"site-{x}")
            .replace("hospital_a.csv", f"hospital_{x}.csv") if a != "hospital-a" else f"hospital-{x}" for a in args]


@pytest.mark.slow
def test_the_readme_site_init_pin_and_certs_commands_as_written(tmp_path):
    from silofl.experiments.tabular import write_sites

    schema, paths = write_sites(tmp_path / "penguins")  # one island's penguins per hospital, the schema they share
    shutil.copy(schema, tmp_path / "schema.yaml")
    for x, p in zip(SITES, paths, strict=True):
        (pd.read_parquet(p) if p.suffix == ".parquet" else pd.read_csv(p)).to_csv(tmp_path / f"hospital_{x}.csv",
                                                                                    index=False)
    env = {**os.environ, "SILOFL_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1", "COLUMNS": "200"}

    def silofl(args):
        r = subprocess.run([sys.executable, "-m", "silofl.cli.main", *args], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and "Traceback" not in r.stderr, f"silofl {' '.join(args)}\n{r.stdout}\n{r.stderr}"
        return r

    cmds = {tuple(readme.argv(c)[:2]): readme.argv(c) for c in readme.commands(DEPLOY)}
    silofl(cmds[("deploy", "certs")])
    assert (tmp_path / "coord" / "pki" / "ca.crt").is_file()
    # the coordinator gives coord/pki/ca.crt and coord/pki/coordinator.json to every site (the README's comment)
    shutil.copy(tmp_path / "coord" / "pki" / "coordinator.json", tmp_path / "coordinator.json")
    for x in SITES:
        silofl(_per_site(cmds[("site", "init")], x))
        shutil.copy(tmp_path / f"site-{x}" / "keys" / "public.json", tmp_path / f"hospital-{x}.json")  # sent around
    for x in SITES:
        silofl(_per_site(cmds[("site", "pin")], x))
        fed = json.loads((tmp_path / f"site-{x}" / "federation.json").read_text())
        assert [c["name"] for c in fed["sites"]] == ["hospital-a", "hospital-b", "hospital-c"]
        assert fed.get("coordinator"), "the coordinator's key is pinned"
    site = json.loads((tmp_path / "site-b" / "site.json").read_text())
    assert site["name"] == "hospital-b" and site["lifetime_epsilon"] == 8 and site["private_model"] == "tabmlp"
    assert site["data"].endswith("hospital_b.csv") and site["schema"].endswith("schema.yaml")
