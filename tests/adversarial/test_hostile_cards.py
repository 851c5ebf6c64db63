"""Hostile public cards (issue 41, "smaller holes"): a card named ``../../x`` made ``deploy register`` write
outside the coordinator's folder, and ``site pin`` took cards with non-hex or short keys (``site run`` then
died with a traceback). A card is now checked — a plain name, 64-hex-digit keys that load, one OpenSSH node
key line — before anything is written from it: one line, exit code 2, nothing written or overwritten."""

import json

import pytest
from typer.testing import CliRunner

from silofl.cli.main import app
from silofl.site.folder import make_site_keys


def card_file(tmp_path, name="good", **changes):
    folder = tmp_path / f"keys-{len(list(tmp_path.glob('keys-*')))}"
    folder.mkdir()
    card = {**make_site_keys(folder, "site"), "name": name, **changes}
    path = folder / "card.json"
    path.write_text(json.dumps(card))
    return path


def one_line_refusal(r, *words):
    errors = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert r.exit_code == 2 and len(errors) == 1 and "Traceback" not in r.output, r.output
    assert all(w in errors[0] for w in words), errors[0]


@pytest.mark.parametrize("name", ["../../x", "../x", "/abs", "a/b", ".hidden", "-x", "x" * 65, "ü"])
def test_deploy_register_refuses_a_card_whose_name_is_a_path(name, tmp_path):
    coord = tmp_path / "coord" / "deep"
    coord.mkdir(parents=True)
    bad = card_file(tmp_path, name)
    r = CliRunner().invoke(
        app,
        ["deploy", "register", str(coord), str(card_file(tmp_path)), str(bad), "--superlink", "127.0.0.1:1"],
    )
    one_line_refusal(r, "plain name")
    assert not list(tmp_path.rglob("*.pub")) or all(
        p.name == "node.pub" for p in tmp_path.rglob("*.pub")
    )  # no node key written anywhere (inside the folder or out of it)
    assert not (coord / "federation.json").exists()


BAD_KEYS = {
    "non-hex": {"sign": "zz" * 32},
    "short": {"seal": "ab" * 16},
    "uppercase": {"sign": "AB" * 32},
    "not a string": {"seal": 12345},
    "node key with a newline": {"node": "ecdsa-sha2-nistp384 AAAA\nssh-ed25519 BBBB"},
    "node key of another kind": {"node": "not-a-key AAAA"},
}


def site_folder(tmp_path):
    from silofl.deploy.site import SiteConfig, init_site

    folder = tmp_path / "s"
    init_site(folder, SiteConfig(name="site", data=None, lifetime_epsilon=1.0, lifetime_delta=1e-5))
    return folder


@pytest.mark.parametrize("bad", list(BAD_KEYS))
def test_site_pin_refuses_a_card_with_bad_keys_in_one_line(bad, tmp_path):
    folder = site_folder(tmp_path)
    own = folder / "keys" / "public.json"
    hostile = card_file(tmp_path, "other", **BAD_KEYS[bad])
    r = CliRunner().invoke(app, ["site", "pin", str(folder), str(own), str(hostile)])
    field = next(iter(BAD_KEYS[bad]))
    one_line_refusal(r, f"'{field}'")
    assert not (folder / "federation.json").exists()  # nothing pinned


def test_site_pin_refuses_a_coordinator_card_with_bad_keys_and_keeps_the_pinned_one(tmp_path):
    folder = site_folder(tmp_path)
    own = folder / "keys" / "public.json"
    assert CliRunner().invoke(app, ["site", "pin", str(folder), str(own)]).exit_code == 0
    before = (folder / "federation.json").read_text()
    coord = tmp_path / "coordinator.json"
    coord.write_text(json.dumps({"seal": "00" * 31, "sign": "ff" * 32}))
    r = CliRunner().invoke(app, ["site", "pin", str(folder), str(own), "--coordinator", str(coord)])
    one_line_refusal(r, "'seal'")
    assert (folder / "federation.json").read_text() == before
