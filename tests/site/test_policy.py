"""A site's own privacy policy (silofl.site.policy): signed into its folder, checked against every run plan
before the first step, never set or widened by anyone but the site."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from silofl.cli.main import app
from silofl.core.errors import ConfigError
from silofl.runner.config import RunConfig
from silofl.runner.plan import check_site_policies, given, policy_request
from silofl.site.folder import SiteConfig, SiteFolder, with_site_folders
from silofl.site.policy import (
    POLICY_FILE,
    PlanRequest,
    PolicyRefused,
    SitePolicy,
    load_policy,
    policy_changes,
    save_policy,
)

runner = CliRunner()


def req(**kw) -> PlanRequest:
    """A plan the default policy accepts (example-level DP-SGD), with ``kw`` changed."""
    base = dict(method="proxyfl", unit="row", placement="local", noise_multiplier=1.0, rounds=10)
    return PlanRequest(**{**base, "features": "none", "seeded": False, **kw})


def secure(**kw) -> PlanRequest:
    base = dict(method="dp-fedavg", unit="hospital", placement="secure", secure_noise=1.0)
    return req(**{**base, "secure_min_survivors": 4, "sample_size": 6, **kw})


def site(tmp_path, name="a", **cfg) -> SiteFolder:
    return SiteFolder.create(
        tmp_path / name, SiteConfig(name=name, data=None, lifetime_epsilon=5.0, lifetime_delta=1e-5, **cfg)
    )


# every switch: the default policy refuses the plan naming the switch, the switch set accepts it
SWITCHES = [
    (req(placement="server", unit="hospital"), "--trust-server-noise", dict(trust_server_noise=True)),
    (req(placement="none", unit="none"), "--allow-placement none", dict(placements=(["none"], []))),
    (req(placement="local"), "--allow-placement local", None),
    (req(unit="person"), "--allow-unit person", None),
    (req(non_formal=True), "--allow-non-formal", dict(allow_non_formal=True)),
    (req(seeded=True), "--allow-research-seed", dict(allow_research_seed=True)),
    (req(rounds=50), "--max-rounds", None),
    (req(noise_multiplier=0.3), "--min-sigma", None),
    (req(features="myfeat"), "--allow-feature myfeat", dict(features=["myfeat"])),
    (secure(sample_size=2, secure_min_survivors=2), "--min-survivors", dict(min_survivors=2, colluders=0)),
    (secure(sample_size=4, secure_min_survivors=2), "--min-survivors", dict(min_survivors=2, colluders=0)),
    (secure(secure_noise=0.5), "--min-noise", dict(limits=dict(clear=True))),
]
NARROW = {  # the policies the refusals above meet where the default accepts the plan
    "--allow-placement local": dict(placements=([], ["local"])),
    "--allow-unit person": dict(units=([], ["person"])),
    "--max-rounds": dict(limits=dict(max_rounds=20)),
    "--min-sigma": dict(limits=dict(min_sigma=0.5)),
    "--min-noise": dict(limits=dict(min_noise=0.8)),
}


@pytest.mark.parametrize("plan,switch,allow", SWITCHES, ids=[s for _, s, _ in SWITCHES])
def test_each_switch_refuses_by_default_and_allows_when_set(plan, switch, allow):
    base = policy_changes(SitePolicy(), **NARROW[switch]) if switch in NARROW else SitePolicy()
    with pytest.raises(PolicyRefused) as e:
        base.check(plan)
    assert switch.split()[0] in str(e.value) and "\n" not in str(e.value), str(e.value)
    if allow is not None:
        policy_changes(base, **allow).check(plan)
    else:
        SitePolicy().check(plan)  # the default accepts it


def test_the_defaults_are_the_safe_ones():
    p = SitePolicy()
    SitePolicy().check(req())  # example-level DP-SGD
    SitePolicy().check(secure())
    assert not p.trust_server_noise and "none" not in p.placements and p.backbones == ()
    # at least 3, at least colluders + 2, at least half the sample
    assert [p.survivors_floor(n) for n in (None, 2, 6, 7, 10)] == [3, 3, 3, 4, 5]
    assert p.replace(colluders=3).survivors_floor(None) == 5


def test_the_survivors_floor_counts_the_colluders_and_the_sample():
    p = SitePolicy()
    with pytest.raises(PolicyRefused, match="3 parties, fewer than this site's survivors floor 4"):
        p.replace(colluders=2).check(secure(sample_size=3, secure_min_survivors=3))
    with pytest.raises(PolicyRefused, match="minimum survivors 4 is below this site's floor 5"):
        p.check(secure(sample_size=10, secure_min_survivors=4))
    with pytest.raises(PolicyRefused, match="minimum survivors none"):
        p.check(secure(secure_min_survivors=None))
    p.check(secure(sample_size=10, secure_min_survivors=5))


def test_a_backbone_is_only_a_name_the_site_registered(tmp_path):
    p = SitePolicy(backbones=(("resnet", str(tmp_path / "mine")),))
    assert p.backbone_dir("resnet") == str(tmp_path / "mine")
    p.check(req(features="backbone:resnet"))
    (tmp_path / "there").mkdir()
    said = set()
    for asked in (str(tmp_path / "there"), str(tmp_path / "absent"), "../x", "~/there"):
        with pytest.raises(PolicyRefused) as e:
            p.check(req(features=f"backbone:{asked}"))
        said.add(str(e.value))
    assert len(said) == 1 and "a path from a run is never opened" in said.pop()  # nothing says what exists
    with pytest.raises(PolicyRefused, match="'other' is not registered"):
        p.check(req(features="backbone:other"))


def test_policy_json_is_signed_0600_and_loaded_back(tmp_path):
    f = site(tmp_path)
    path = f.path / POLICY_FILE
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert f.policy == SitePolicy()
    changed = policy_changes(f.policy, trust_server_noise=True, colluders=2, backbones=({"rn": "/b/rn"}, []))
    save_policy(f, changed)
    assert SiteFolder.load(f.path).policy == changed
    d = json.loads(path.read_text())
    assert set(d) == {"format", "site", "key", "policy", "signature"} and d["key"] == f.key_id


@pytest.mark.parametrize(
    "tamper",
    [
        lambda d: d["policy"].update(trust_server_noise=True),  # widened by hand: the signature fails
        lambda d: d["policy"].update(min_survivors=2),
        lambda d: d.update(signature="00" * 64),
        lambda d: d.update(site="b"),
        lambda d: d.update(key="11" * 32),
        lambda d: d.pop("signature"),
    ],
)
def test_a_tampered_policy_refuses_the_site_in_one_line(tmp_path, tamper):
    f = site(tmp_path)
    path = f.path / POLICY_FILE
    d = json.loads(path.read_text())
    tamper(d)
    path.write_text(json.dumps(d))
    with pytest.raises(ConfigError) as e:
        SiteFolder.load(f.path).policy  # noqa: B018
    assert "refuse" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "bad,field",
    [
        ({"extra": 1}, "unknown field"),
        ({"min_survivors": 1}, "min_survivors"),
        ({"min_survivors": True}, "min_survivors"),
        ({"colluders": -1}, "colluders"),
        ({"placements": ["server"]}, "placements"),
        ({"units": ["everything"]}, "units"),
        ({"min_sigma": "1"}, "min_sigma"),
        ({"survivor_fraction": 2.0}, "survivor_fraction"),
        ({"backbones": {"rn": "relative/dir"}}, "backbone"),
        ({"backbones": {"../x": "/abs"}}, "backbone"),
        ({"trust_server_noise": 1}, "trust_server_noise"),
    ],
)
def test_a_validly_signed_policy_outside_the_schema_is_refused(tmp_path, bad, field):
    from silofl.site.policy import SIGN_LABEL, read_signed

    f = site(tmp_path)
    path = f.path / POLICY_FILE
    d = json.loads(path.read_text())
    d.pop("signature")
    d["policy"].update(bad)
    from silofl.privacy.ledger import canonical_json

    d["signature"] = f.signing_key().sign(SIGN_LABEL + canonical_json(d)).hex()
    path.write_text(json.dumps(d))
    with pytest.raises(ConfigError, match=field):
        read_signed(path, f.name, f.key_id)


def test_an_oversized_or_linked_policy_is_refused_before_it_is_parsed(tmp_path):
    f = site(tmp_path)
    path = f.path / POLICY_FILE
    path.write_text(" " * (65 << 10))
    with pytest.raises(ConfigError, match="larger than"):
        f.policy  # noqa: B018
    path.unlink()
    os.symlink(tmp_path / "elsewhere.json", path)
    with pytest.raises(ConfigError, match="not a plain file"):
        f.policy  # noqa: B018


def test_an_old_folder_gets_its_policy_from_site_json_and_site_json_only_narrows(tmp_path):
    f = site(tmp_path, allow_research_seed=True, allow_non_formal=True, secagg_min_survivors=5)
    (f.path / POLICY_FILE).unlink()  # a folder made before policies
    p = load_policy(f)
    assert (p.allow_research_seed, p.allow_non_formal, p.min_survivors) == (True, True, 5)
    assert "none" in p.placements and (f.path / POLICY_FILE).is_file()
    sj = f.path / "site.json"
    d = json.loads(sj.read_text())
    sj.write_text(json.dumps({**d, "allow_research_seed": False, "secagg_min_survivors": 7}))
    narrowed = load_policy(f)
    assert (narrowed.allow_research_seed, narrowed.min_survivors) == (False, 7) and narrowed.notes
    save_policy(f, policy_changes(narrowed, allow_research_seed=True))  # the command keeps the copy in step
    assert load_policy(f).allow_research_seed and json.loads(sj.read_text())["allow_research_seed"] is True
    sj.write_text(json.dumps({**json.loads(sj.read_text()), "allow_non_formal": False}))
    assert "none" not in load_policy(f).placements  # site.json's old refusal of no-DP runs still holds
    f2 = site(tmp_path, "b")  # a hand edit of site.json never widens
    d = json.loads((f2.path / "site.json").read_text())
    (f2.path / "site.json").write_text(json.dumps({**d, "allow_research_seed": True}))
    assert not load_policy(f2).allow_research_seed


def test_the_run_plan_names_placement_unit_and_secure_sums():
    def of(**kw):
        return policy_request(RunConfig.from_dict(dict(dataset="digits", **kw)).resolve(), 0)

    r = of(method="dp-fedavg", clients=4)
    assert (r.placement, r.unit, r.secure_min_survivors) == ("server", "hospital", None)
    r = of(method="dp-fedavg", clients=6, secure_aggregation=True, privacy_unit="subclient")
    assert (r.placement, r.unit, r.secure_min_survivors, r.sample_size) == ("secure", "subclient", 5, 6)
    r = of(method="proxyfl", seed=3)
    assert (r.placement, r.unit, r.seeded, r.non_formal) == ("local", "row", True, False)
    assert of(method="proxyfl", privacy="paper").non_formal
    r = of(method="fedavg", privacy="off", secure_aggregation=True, clients=3)
    assert (r.placement, r.unit, r.noise_multiplier) == ("none", "none", None)
    assert of(method="fedavg", secure_aggregation=True, clients=3).placement == "local"  # its own full noise


def test_a_simulated_run_with_site_folders_refuses_the_same_plans(tmp_path, tiny_cfg):
    folders = {k: site(tmp_path, f"s{k}") for k in range(2)}
    hook = with_site_folders(folders)
    cfg = tiny_cfg.replace(method="dp-fedavg", clients=2, noise_multiplier=1.0, proxy_model="mlp").resolve()
    with pytest.raises(PolicyRefused, match="site s0 refuses the run: .*--trust-server-noise"):
        check_site_policies(hook, given(cfg))
    save_policy(folders[0], policy_changes(folders[0].policy, trust_server_noise=True))
    with pytest.raises(PolicyRefused, match="site s1 refuses"):
        check_site_policies(hook, given(cfg))
    check_site_policies(hook, given(tiny_cfg.resolve()))  # DP-SGD: both accept


def test_site_policy_command_edits_shows_and_refuses_bad_input(tmp_path):
    f = site(tmp_path)
    path = f.path / POLICY_FILE
    res = runner.invoke(app, ["site", "policy", str(f.path), "--trust-server-noise", "--colluders", "2"])
    assert res.exit_code == 0, res.output
    assert "server (trust-server-noise)" in res.output and "colluders assumed 2" in res.output
    p = SiteFolder.load(f.path).policy
    assert p.trust_server_noise and p.colluders == 2 and p.survivors_floor(None) == 4
    before = path.read_bytes()
    for bad in (
        ["--allow-placement", "server"],
        ["--min-survivors", "1"],
        ["--allow-unit", "everything"],
        ["--register-backbone", "rn"],
        ["--register-backbone", f"rn={tmp_path / 'no-such'}"],
        ["--min-sigma", "nan"],
    ):
        res = runner.invoke(app, ["site", "policy", str(f.path), *bad])
        assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, (bad, res.output)
        assert path.read_bytes() == before, bad
    res = runner.invoke(app, ["site", "policy", str(f.path)])
    assert res.exit_code == 0 and path.read_bytes() == before


@pytest.mark.parametrize(
    "args,said",
    [
        (["--secure-aggregation", "--clients", "2"], "at least 3 sites"),
        (["--secagg-bits", "24"], "--secagg-bits only apply with --secure-aggregation"),
        (["--secagg-min-survivors", "3"], "only apply with --secure-aggregation"),
    ],
)
def test_secure_aggregation_flags_are_checked_up_front(tmp_path, args, said):
    out = tmp_path / "run"
    base = ["run", "--method", "dp-fedavg", "--dataset", "digits", "--rounds", "1", "--out", str(out)]
    res = runner.invoke(app, [*base, *args])
    assert res.exit_code == 2 and said in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert not out.exists()
    with pytest.raises(ConfigError, match="at least 3 sites"):
        RunConfig.from_dict(
            dict(method="fml", dataset="digits", clients=2, secure_aggregation=True)
        ).resolve()


def test_the_secure_floor_counts_the_round_sample():
    from silofl.fl.exchange.client_level import SecureFloor

    f = SecureFloor(None, 3, 10.0, 1e-5, survivor_fraction=0.5, colluders=1)
    assert [f.floor(n) for n in (2, 3, 6, 8, 9)] == [3, 3, 3, 4, 5]


def test_a_registered_backbone_is_named_by_the_coordinator_and_found_by_the_site(tmp_path):
    from silofl.deploy.site import SiteWorker
    from tests.features.test_bad_input import make_backbone

    f = site(tmp_path)
    (tmp_path / "bb").mkdir()
    make_backbone(tmp_path / "bb")
    res = runner.invoke(app, ["site", "policy", str(f.path), "--register-backbone", f"rn={tmp_path / 'bb'}"])
    assert res.exit_code == 0 and "backbones rn" in res.output, res.output
    asked = dict(method="fedavg", dataset="digits", features="backbone:rn", data_at_sites=True)
    RunConfig.from_dict(asked).resolve()  # the coordinator names it and reads no path of its own
    with pytest.raises(ConfigError, match="not found"):
        RunConfig.from_dict({**asked, "data_at_sites": False}).resolve()
    w = SiteWorker.__new__(SiteWorker)  # the site's own check, without its data or federation
    w.folder, w.cfg = f.path, f.config
    assert w._planned(RunConfig.from_dict(asked).to_dict(), 0).features == f"backbone:{tmp_path / 'bb'}"
    with pytest.raises(PolicyRefused, match="site a refuses the run: the run names its backbone by a path"):
        w._planned({**RunConfig.from_dict(asked).to_dict(), "features": f"backbone:{tmp_path / 'bb'}"}, 0)
