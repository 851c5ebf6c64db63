"""The site's privacy ledger cannot be edited or rolled back unnoticed, and the spend is recomputed from it —
never from a number in a checkpoint (finding 6: editing a checkpoint's step count let a site train past its
budget while reporting less)."""

import json
import os
import stat

import pytest

from silofl.core.errors import SiloflError
from silofl.privacy import epsilon_of
from silofl.privacy.ledger import Ledger, LedgerTampered
from silofl.runner.loop import run as simulate


def filled(tmp_path, n=4):
    led = Ledger(tmp_path / "site")
    for i in range(n):
        led.record_steps("r", 1.0, 0.25, 4, round=i + 1)
    return led


def lines(led):
    return led.path.read_text().splitlines()


def test_the_key_is_private_and_a_clean_ledger_reopens_with_the_same_spend(tmp_path):
    led = filled(tmp_path)
    assert stat.S_IMODE(os.stat(tmp_path / "site/site.key").st_mode) == 0o600
    again = Ledger(tmp_path / "site")
    assert again.history() == [(1.0, 0.25, 4)] * 4 and again.head == led.head


@pytest.mark.parametrize("attack", ["edit", "delete", "insert", "reorder", "foreign-key"])
def test_an_edited_ledger_refuses_to_open(tmp_path, attack):
    led = filled(tmp_path)
    rows = lines(led)
    if attack == "edit":
        e = json.loads(rows[2])
        e["steps"] = 1
        rows[2] = json.dumps(e, sort_keys=True, separators=(",", ":"))
    elif attack == "delete":
        del rows[1]
    elif attack == "insert":
        rows.insert(1, rows[1])
    elif attack == "reorder":
        rows[1], rows[2] = rows[2], rows[1]
    else:
        (tmp_path / "site/site.key").write_text(
            os.urandom(32).hex()
        )  # re-keyed to forge the MACs: still refused
    led.path.write_text("\n".join(rows) + "\n")
    with pytest.raises(LedgerTampered):
        Ledger(tmp_path / "site")


def test_a_truncated_ledger_is_refused_against_a_head_it_once_had(tmp_path):
    led = filled(tmp_path)
    head = led.head
    led.path.write_text("\n".join(lines(led)[:2]) + "\n")
    shorter = Ledger(tmp_path / "site")  # a valid chain of two entries …
    with pytest.raises(LedgerTampered, match="rolled back"):
        shorter.check_head(head)  # … but older than a head a checkpoint recorded


@pytest.mark.slow
def test_editing_a_checkpoints_step_count_does_not_roll_the_spend_back(tiny_cfg, tmp_path):
    """The attack: run 2 rounds with checkpoints, edit client 0's recorded steps from 8 to 1, resume with a
    budget of exactly 4 rounds. Before: the site trained past its budget and reported fewer steps. Now: the
    ledger says 8 steps ran, the site trains 2 more rounds, leaves, and reports 16 steps, within its
    budget."""
    target = 1.0001 * epsilon_of("rdp", ((1.0, 0.25, 16),), 1e-3)
    cfg = tiny_cfg.replace(
        rounds=2, checkpoint_every=1, target_epsilon=target, calibrate_noise=False, out=str(tmp_path / "r")
    )
    simulate(cfg, progress=False)
    node = tmp_path / "r/checkpoint/round2/node0.json"
    state = json.loads(node.read_text())
    acc = next(v for k, v in state["state"]["__dict__"] if k == "accountant")
    hist = next(v for k, v in acc["__dict__"] if k == "history")
    assert hist["__list__"][0]["__list__"][2] == 8
    hist["__list__"][0]["__list__"][2] = 1
    node.write_text(json.dumps(state))
    s = simulate(cfg.replace(rounds=10), progress=False, resume=True)
    a0 = s["accounting"][0]
    assert a0["steps"] == 16 and a0["epsilon"] <= target and s["final"]["per_client"][0]["left_at"] == 5


@pytest.mark.slow
def test_a_tampered_ledger_stops_the_resume_with_a_clear_error(tiny_cfg, tmp_path):
    from typer.testing import CliRunner

    from silofl.cli.main import app

    cfg = tiny_cfg.replace(rounds=2, checkpoint_every=1, out=str(tmp_path / "r"))
    simulate(cfg, progress=False)
    path = tmp_path / "r/sites/client1/ledger.jsonl"
    path.write_text(path.read_text().replace('"steps":4', '"steps":1', 1))
    with pytest.raises(SiloflError, match="fails its MAC"):
        simulate(cfg.replace(rounds=3), progress=False, resume=True)
    (tmp_path / "c.yaml").write_text(cfg.to_yaml())
    res = CliRunner().invoke(
        app, ["run", "--config", str(tmp_path / "c.yaml"), "--rounds", "3", "--resume", "--quiet"]
    )
    assert res.exit_code == 2 and "ledger" in res.output and "Traceback" not in res.output
