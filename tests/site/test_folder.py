"""One site folder, one budget: PubSub-ML releases, deployed runs and simulations charge the same ledger, and
folders of both earlier formats are converted in place (or refused in one line, left as they were)."""

from __future__ import annotations

import json
import os

import pytest

from silofl.core.errors import BudgetExhausted, ConfigError
from silofl.privacy.ledger import Ledger, lifetime_of
from silofl.site.folder import BACKUP, FORMAT, SiteConfig, SiteFolder, migrate


def snapshot(folder):
    """Every file under ``folder`` with its bytes (what a refused conversion must leave untouched)."""

    def head(p):
        with open(p, "rb") as f:
            return f.read(1 << 20)

    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns, head(p))
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def pubsub_v1(folder, name="a", lifetime=(10.0, 1e-4), releases=((1.0, 1e-6, ("r1", "r2")),), sign=True):
    """A folder as PubSub-ML wrote it before this format: site.json silofl.site/1, site.key + ledger.jsonl and
    a hex sign.key at the top; returns the old ledger."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    folder.mkdir(parents=True)
    (folder / "site.json").write_text(
        json.dumps(
            {"format": "silofl.site/1", "name": name, "lifetime": list(lifetime) if lifetime else None}
        )
        + "\n"
    )
    led = Ledger(folder)
    for eps, dlt, ids in releases:
        led.record_release({led.record_digest(i) for i in ids}, eps, dlt, what="pubsub-model")
    if sign:
        (folder / "sign.key").write_text(os.urandom(32).hex())
        key = Ed25519PrivateKey.from_private_bytes(bytes.fromhex((folder / "sign.key").read_text()))
        return led, key
    return led, None


def deploy_v1(folder, name="a", lifetime=(8.0, 1e-3)):
    """A folder as `silofl site init` wrote it before this format (format 1, keys/, ledger/)."""
    f = SiteFolder.create(
        folder,
        SiteConfig(
            name=name, data="data.safetensors", lifetime_epsilon=lifetime[0], lifetime_delta=lifetime[1]
        ),
    )
    d = json.loads((folder / "site.json").read_text())
    (folder / "site.json").write_text(json.dumps({**d, "format": 1}, indent=1) + "\n")
    return f


def test_a_pubsub_folder_is_converted_in_place_with_its_ledger_and_key(tmp_path):
    from silofl.deploy.pki import public_raw

    folder = tmp_path / "a"
    old, key = pubsub_v1(folder, releases=((1.0, 1e-6, ("r1", "r2")), (0.5, 1e-6, ("r2", "r3"))))
    old.cancel_release(old.record_release({old.record_digest("r9")}, 5.0, 0.0), "refused by the broker")
    before = old.spent({old.record_digest(i) for i in ("r2",)})
    f = SiteFolder.open(folder, "a")
    assert json.loads((folder / "site.json").read_text())["format"] == FORMAT
    assert json.loads((folder / BACKUP).read_text())["format"] == "silofl.site/1"
    assert not (folder / "ledger.jsonl").exists() and (folder / "ledger.jsonl.v1.bak").is_file()
    assert (folder / "keys" / "public.json").is_file() and (folder / "ledger" / "ledger.jsonl").is_file()
    assert f.lifetime == (10.0, 1e-4)
    # the same key: the old records' digests still compose with new releases of the same records
    assert f.ledger.spent({f.ledger.record_digest("r2")}) == before == (1.5, 2e-6)
    assert f.ledger.spent() == (1.5, 2e-6)  # the cancelled release still does not count
    assert f.key_id == public_raw(key.public_key()).hex()  # the broker's registered key signs on
    assert [e["kind"] for e in f.ledger.entries][:2] == ["genesis", "budget"]
    assert migrate(folder) is None  # once


def test_a_deploy_folder_is_converted_and_keeps_its_chain(tmp_path):
    folder = tmp_path / "a"
    deploy_v1(folder)
    head = Ledger(folder / "ledger").head
    assert "deployment format 1" in migrate(folder)
    assert SiteConfig.load(folder).data == "data.safetensors"
    assert Ledger(folder / "ledger").head == head  # the coordinator's kept head still matches
    assert json.loads((folder / BACKUP).read_text())["format"] == 1


def test_a_folder_holding_both_ledgers_gets_one_budget_that_adds_up(tmp_path):
    folder = tmp_path / "a"
    deploy_v1(folder, lifetime=(8.0, 1e-3))
    Ledger(folder / "ledger").record_steps("run1", 1.0, 0.01, 100)  # a deployed run trained
    other, _ = pubsub_v1(tmp_path / "pubsub", releases=((2.0, 1e-6, ("r1",)), (1.0, 1e-6, ("r2",))))
    for name in ("ledger.jsonl", "site.key", "sign.key"):  # PubSub-ML's files beside deployment's
        (tmp_path / "pubsub" / name).replace(folder / name)
    f = SiteFolder.load(folder)
    assert f.ledger.history() == [(1.0, 0.01, 100)]
    # another key: the most any old record spent (r1: ε 2) counts for every record
    assert f.outside_training()["released"] == pytest.approx((2.0, 1e-6))
    assert f.training_budget() == pytest.approx((6.0, 1e-3 - 1e-6))
    assert f.ledger.spent({f.ledger.record_digest("anything")}) == pytest.approx((2.0, 1e-6))
    assert (folder / "ledger.v1.bak" / "ledger.jsonl").is_file() and (
        folder / "ledger.jsonl.v1.bak"
    ).is_file()


@pytest.mark.parametrize(
    "case",
    [
        "huge",
        "deep",
        "not-object",
        "format",
        "name",
        "lifetime",
        "tampered",
        "symlink",
        "oversized-ledger",
        "no-key",
        "bad-sign-key",
        "malformed-entry",
        "keys-beside",
    ],
)
def test_a_corrupt_or_hostile_folder_is_refused_in_one_line_and_left_as_it_was(tmp_path, case):
    folder = tmp_path / "a"
    pubsub_v1(folder)
    site = folder / "site.json"
    if case == "huge":
        site.write_text(json.dumps({"format": "silofl.site/1", "name": "a", "pad": "x" * (1 << 20)}))
    elif case == "deep":
        site.write_text("[" * 50_000 + "]" * 50_000)
    elif case == "not-object":
        site.write_text("[1, 2]")
    elif case == "format":
        site.write_text(json.dumps({"format": "silofl.site/99", "name": "a"}))
    elif case == "name":
        site.write_text(json.dumps({"format": "silofl.site/1", "name": "../evil", "lifetime": [1, 1e-5]}))
    elif case == "lifetime":
        site.write_text(
            json.dumps({"format": "silofl.site/1", "name": "a", "lifetime": [float("inf"), 1e-5]})
        )
    elif case == "tampered":
        lines = (folder / "ledger.jsonl").read_text().splitlines()
        (folder / "ledger.jsonl").write_text(json.dumps({**json.loads(lines[0]), "epsilon": 0.0}) + "\n")
    elif case == "symlink":
        (folder / "ledger.jsonl").replace(tmp_path / "elsewhere.jsonl")
        (folder / "ledger.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")
    elif case == "oversized-ledger":
        with open(folder / "ledger.jsonl", "r+b") as f:
            f.truncate(300 << 20)  # sparse: refused by its size before it is read
    elif case == "no-key":
        (folder / "site.key").unlink()
    elif case == "bad-sign-key":
        (folder / "sign.key").write_text("not a key")
    elif case == "malformed-entry":  # a well-chained entry (the key is there) whose fields would not count
        led = Ledger(folder)
        led.append("release", records="all of them", epsilon=-1, delta=0)
    elif case == "keys-beside":
        (folder / "keys").mkdir()
    before = snapshot(folder)
    with pytest.raises(ConfigError) as e:
        SiteFolder.open(folder, "a")
    assert "\n" not in str(e.value) and len(str(e.value)) < 600
    assert snapshot(folder) == before and not (folder / ".migrating").exists()


def test_a_conversion_that_stopped_midway_starts_again(tmp_path):
    folder = tmp_path / "a"
    pubsub_v1(folder)
    (folder / ".migrating" / "keys").mkdir(parents=True)  # staged, never moved into place
    f = SiteFolder.open(folder, "a")
    assert f.ledger.spent() == (1.0, 1e-6) and not (folder / ".migrating").exists()


@pytest.mark.slow  # the accountant (Opacus) — seconds
def test_a_release_counts_what_training_spent_and_the_refusal_says_so(tmp_path):
    f = SiteFolder.open(tmp_path / "a", "a", (8.0, 1e-4))
    assert f.require_release(["r1"], 7.0, 1e-6)[1] == (0.0, 0.0)
    f.ledger.record_steps("run1", 1.0, 0.05, 400)  # a deployed or simulated run's DP-SGD rounds, same ledger
    trained = f.trained_epsilon(1e-4 - 1e-6)
    assert 1.0 < trained < 7.0
    digests, before = f.require_release(["r1"], 8.0 - trained - 0.01, 1e-6)
    assert before[0] == pytest.approx(trained)
    with pytest.raises(BudgetExhausted, match="lifetime budget ε=8") as e:
        f.require_release(["r1"], 8.0 - trained + 0.01, 1e-6)
    assert "\n" not in str(e.value)


def test_the_lifetime_budget_is_set_once_and_changed_by_a_ledger_entry(tmp_path):
    f = SiteFolder.open(tmp_path / "a", "a", (3.0, 1e-4))
    with pytest.raises(ConfigError, match="set once"):
        SiteFolder.open(tmp_path / "a", "a", (30.0, 1e-4))
    with pytest.raises(ConfigError, match="no lifetime privacy budget"):
        SiteFolder.open(tmp_path / "b", "b")
    assert not (tmp_path / "b").exists()
    f.set_lifetime(5.0, 1e-4, "the board raised it")
    assert lifetime_of(Ledger(tmp_path / "a" / "ledger")) == (5.0, 1e-4)
    assert SiteFolder.open(tmp_path / "a", "a", (5.0, 1e-4)).lifetime == (5.0, 1e-4)
    assert json.loads((tmp_path / "a" / "site.json").read_text())["lifetime_epsilon"] == 5.0
