"""The broker keeps each publishing site's last signed ledger head and refuses a publish that presents an
older one (issue 25, item 6, the broker's part): a site folder put back to an earlier copy (its ledger rolled
back) cannot publish again as if its later releases had not happened."""

from __future__ import annotations

import shutil

import pytest
from typer.testing import CliRunner

from silofl.cli.main import app
from silofl.privacy.ledger import GENESIS, Ledger
from silofl.pubsub.broker import Broker
from tests.cli.test_readme_commands import _breast_cancer_files


@pytest.mark.slow
def test_the_broker_keeps_the_signed_ledger_head_and_refuses_a_rolled_back_site(tmp_path):
    _breast_cancer_files(tmp_path)
    site, broker = tmp_path / "site-a", tmp_path / "broker"

    def publish(data="a.csv"):
        return CliRunner().invoke(
            app,
            [
                "pubsub",
                "publish",
                "--broker",
                str(broker),
                "--site",
                "a",
                "--data",
                str(tmp_path / data),
                "--schema",
                str(tmp_path / "a.yaml"),
                "--epsilon",
                "0.5",
                "--lifetime-epsilon",
                "10",
                "--site-dir",
                str(site),
            ],
        )

    assert publish().exit_code == 0
    entries = Ledger(site / "ledger").entries
    kept = Broker(broker).publisher("a")["ledger_head"]
    release = next(e for e in reversed(entries) if e["kind"] == "release")
    assert kept == {
        "entries": release["seq"],
        "mac": entries[release["seq"] - 1]["mac"] if release["seq"] else GENESIS,
    }
    shutil.copytree(site, tmp_path / "site-a-copy")  # the site's folder as it was after its first release
    assert publish("a_stream.csv").exit_code == 0
    later = Broker(broker).publisher("a")["ledger_head"]
    assert later["entries"] > kept["entries"]
    shutil.rmtree(site)
    shutil.copytree(tmp_path / "site-a-copy", site)  # rolled back: its second release forgotten
    before = Broker(broker).models()
    res = publish("a_stream.csv")
    assert res.exit_code == 2 and "rolled-back ledger" in res.output, res.output
    assert Broker(broker).models() == before and Broker(broker).publisher("a")["ledger_head"] == later
