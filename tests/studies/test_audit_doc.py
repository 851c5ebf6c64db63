"""docs/audit.md's generator on made-up audit.json files: the table, the side-by-side ε and the
paper/strict verdict."""

import json

from studies import audit_doc as doc


def fake(mode, sigma, eps, bound, canary_auc, mia_auc):
    attacks = {
        k: {
            "auc": mia_auc,
            "tpr_at_0.1%_fpr": 0.0,
            "tpr_at_1%_fpr": 0.02,
            "balanced_accuracy": 0.5,
            "members": 1000,
            "nonmembers": 1000,
        }
        for k in doc.ATTACKS
    }
    return {
        "kind": "example-level",
        "method": "proxyfl",
        "privacy_mode": mode,
        "noise_multiplier": sigma,
        "epsilon_accountant": eps,
        "delta": 1e-5,
        "formal_guarantee": mode == "strict",
        "rounds": 100,
        "epsilon_lower_bound": bound,
        "seed": 0,
        "bound": {
            "score": "final",
            "k_pos": 5,
            "k_neg": 5,
            "guesses": 10,
            "correct": 7,
            "max_auditable_epsilon": 5.0,
            "canary_auc": {"final": canary_auc, "rounds": 0.5},
            "candidates": [],
        },
        "canaries": {"m": 1000, "included": 500, "excluded": 500, "audited_site": 0, "releases_scored": 100},
        "membership_inference": {"targets": {"proxy": {"model": "mlp", "attacks": attacks}}},
        "accuracy": {"proxy_acc": {"mean": 0.5, "std": 0.1}},
        "command": f"silofl audit --privacy {mode}",
        "seconds": {"total": 60.0},
    }


def write(tmp_path, name, a):
    (tmp_path / name).mkdir()
    (tmp_path / name / "audit.json").write_text(json.dumps(a))


def test_doc_from_audits(tmp_path, monkeypatch, capsys):
    write(tmp_path, "s", fake("strict", 2.0, 8.0, 0.1, 0.52, 0.50))
    write(tmp_path, "p", fake("paper", 2.0, 8.0, 0.2, 0.53, 0.51))
    monkeypatch.setattr(doc, "DOCS", tmp_path / "docs")
    doc.main([str(tmp_path)])
    md = capsys.readouterr().out
    assert md.startswith("# What the shared artifacts leak") and "bash bench/audit_study.sh" in md
    assert "did not leak measurably more" in md
    assert "| s | 8.000 | 0.100 |" in md and "silofl audit --privacy paper" in md
    assert (tmp_path / "docs" / "audit.png").is_file()
    data = json.loads((tmp_path / "docs" / "data" / "audit.json").read_text())
    assert [r["audit"] for r in data["rows"]] == ["s", "p"]


def test_a_clear_difference_is_called_measurable(tmp_path, monkeypatch, capsys):
    write(tmp_path, "s", fake("strict", 2.0, 8.0, 0.1, 0.52, 0.50))
    write(tmp_path, "p", fake("paper", 2.0, 8.0, 1.5, 0.75, 0.60))
    monkeypatch.setattr(doc, "DOCS", tmp_path / "docs")
    doc.main([str(tmp_path)])
    assert "paper mode leaked measurably more than strict mode" in capsys.readouterr().out


def test_a_blind_no_dp_control_is_called_out(tmp_path, monkeypatch, capsys):
    write(tmp_path, "s", fake("strict", 2.0, 8.0, 0.0, 0.52, 0.50))
    write(tmp_path, "p", fake("paper", 2.0, 8.0, 0.0, 0.52, 0.50))
    off = fake("off", None, None, 0.0, 0.51, 0.50)
    write(tmp_path, "off", off)
    monkeypatch.setattr(doc, "DOCS", tmp_path / "docs")
    doc.main([str(tmp_path)])
    md = capsys.readouterr().out
    assert "This audit has no power on the released proxy" in md
    assert "control (off) also gives a bound of 0" in md and "No power on proxyfl's releases" in md


def test_a_no_dp_control_that_leaks_is_not_called_blind(tmp_path, monkeypatch, capsys):
    write(tmp_path, "s", fake("strict", 2.0, 8.0, 0.0, 0.52, 0.50))
    write(tmp_path, "p", fake("paper", 2.0, 8.0, 0.0, 0.52, 0.50))
    write(tmp_path, "off", fake("off", None, None, 1.2, 0.80, 0.60))
    monkeypatch.setattr(doc, "DOCS", tmp_path / "docs")
    doc.main([str(tmp_path)])
    md = capsys.readouterr().out
    assert "no power" not in md.lower()


def fake_grad(name, mode, sigma, eps, snj_step, gauss_step, snj_rel=0.5):
    def b(snj, gauss):
        return {
            "snj": {
                "epsilon_lower_bound": snj,
                "correct": 90,
                "guesses": 100,
                "canary_auc": {"steps": 0.8},
                "candidates": [],
            },
            "gauss": {"epsilon_estimate": gauss, "mu_hat": 1.2, "mu_standard_error": 0.07, "mu_lower": 1.1},
        }

    return {
        "kind": "example-level",
        "method": "proxyfl",
        "privacy_mode": mode,
        "noise_multiplier": sigma,
        "epsilon_accountant": eps,
        "delta": 1e-5,
        "formal_guarantee": mode == "strict",
        "seed": 0,
        "steps": 120,
        "sample_rate": 0.25,
        "threat_model": "white-box per step",
        "epsilon_lower_bound": snj_step,
        "certifiable_epsilon_max": 5.78,
        "mu_sum_statistic_expected": 1.4 if sigma else None,
        "bounds": {"white-box per step": b(snj_step, gauss_step), "white-box per release": b(snj_rel, 1.0)},
        "canaries": {
            "m": 1000,
            "included": 500,
            "excluded": 500,
            "space": "gradient",
            "canary_kind": "dirac",
            "kind": "Dirac",
            "audited_site": 0,
            "releases_scored": 30,
        },
        "membership_inference": {"targets": {}},
        "accuracy": {},
        "command": f"silofl audit {name}",
        "seconds": {"total": 60.0},
    }


def test_gradient_rows_put_the_control_beside_every_dp_row(tmp_path, monkeypatch, capsys):
    write(tmp_path, "st8", fake_grad("st8", "strict", 1.96, 8.0, 2.3, 5.0))
    write(tmp_path, "pa8", fake_grad("pa8", "paper", 1.96, 8.0, 2.3, 5.0))
    write(tmp_path, "off", fake_grad("off", "off", None, None, 1.4, 5.5))
    (tmp_path / "SCALE").write_text("reduced\n")
    monkeypatch.setattr(doc, "DOCS", tmp_path / "docs")
    doc.main([str(tmp_path)])
    md = capsys.readouterr().out
    assert "Reduced scale (reduced)" in md and "bash bench/audit_study.sh reduced" in md
    row = next(line for line in md.splitlines() if line.startswith("| st8 |"))
    assert (
        "**2.300**" in row and "1.400 / 5.500 (off)" in row and "29%; 62%" in row
    )  # SNJ and Gaussian-pair, control
    assert "no SNJ bound and no Gaussian-pair estimate" in md
    assert "29% (st8)" in md and "reached by every" in md
    assert "did not differ measurably" in md and "worked figures could not be reproduced" in md
    data = json.loads((tmp_path / "docs" / "data" / "audit.json").read_text())
    assert data["scale"] == "reduced" and {r["audit"] for r in data["gradient_rows"]} == {"st8", "pa8", "off"}


def test_a_gradient_bound_above_the_accountant_is_reported():
    bad = dict(fake_grad("bad", "strict", 1.96, 2.0, 2.3, 5.0), _name="bad")
    text = doc.grad_findings([bad])
    assert (
        "a figure EXCEEDS the accountant's ε: bad (white-box per step, SNJ), bad (white-box per step, "
        "Gaussian-pair)" in text
    )
    # an estimate above the solve's cap (null in audit.json) exceeds an accountant ε below it; "> 700"
    inf = dict(fake_grad("inf", "strict", 1.96, 8.0, 2.3, None), _name="inf")
    inf["bounds"]["white-box per step"]["gauss"]["epsilon_estimate_unbounded"] = True
    text = doc.grad_findings([inf])
    assert "EXCEEDS the accountant's ε: inf (white-box per step, Gaussian-pair)" in text
    assert "SNJ 2.30 / Gaussian-pair > 700" in text
    inf["epsilon_accountant"] = 4898.0  # above the cap: "> 700" says nothing against it
    assert "no SNJ bound and no Gaussian-pair estimate" in doc.grad_findings([inf])


def test_rows_repeated_with_other_seeds_go_under_seeds(tmp_path, monkeypatch, capsys):
    """NAME-seedN folders repeat NAME with another seed: not in the main tables, side by side under Seeds,
    with the targets checked on every seed and their commands listed."""

    def seeded(name, seed, *args):
        return dict(fake_grad(name, *args), seed=seed)

    write(tmp_path, "st8", seeded("st8", 0, "strict", 1.96, 8.0, 2.3, 5.0))
    write(tmp_path, "st8-seed1", seeded("st8-seed1", 1, "strict", 1.96, 8.0, 2.0, 4.5))
    write(tmp_path, "st8-seed2", seeded("st8-seed2", 2, "strict", 1.96, 8.0, 2.5, 9.0))  # Gaussian above ε
    write(tmp_path, "off", seeded("off", 0, "off", None, None, 5.3, 5.5))
    write(tmp_path, "off-seed1", seeded("off-seed1", 1, "off", None, None, 0.9, 5.5))
    monkeypatch.setattr(doc, "DOCS", tmp_path / "docs")
    doc.main([str(tmp_path)])
    md = capsys.readouterr().out
    assert not any(line.startswith("| st8-seed") for line in md.splitlines())
    seeds = md[md.index("## Seeds") : md.index("## Does")]
    row = next(line for line in seeds.splitlines() if line.startswith("| st8 (0, 1, 2) |"))
    assert "0: **2.300** · 1: **2.000** · 2: **2.500**" in row and "0: 29% · 1: 25% · 2: 31%" in row
    assert "st8: 25% to 31% of the accountant's ε over seeds 0, 1, 2 — BELOW 27% on a seed." in seeds
    assert "No-DP control off: per-step SNJ bound 0.900 to 5.300 over seeds 0, 1 — NOT above 1" in seeds
    assert "EXCEEDS the accountant's ε: st8 seed 2 (white-box per step, Gaussian-pair)" in seeds
    assert "the rows under Seeds also 1 and 2" in md and "except the rows under Seeds (also 1 and 2)" in md
    assert "silofl audit st8-seed2" in md[md.index("## Commands") :]
    data = json.loads((tmp_path / "docs" / "data" / "audit.json").read_text())
    assert {r["audit"] for r in data["gradient_rows"]} == {"st8", "off"}
    by = {d["audit"]: [s["seed"] for s in d["seeds"]] for d in data["seeds"]}
    assert by == {"st8": [0, 1, 2], "off": [0, 1]}


def test_a_row_run_again_on_a_deployment_goes_under_engines(tmp_path, monkeypatch, capsys):
    """NAME-flower repeats NAME on a Flower deployment: under Engines, with whether the canary scores (the
    files) are the simulator's."""
    sim = dict(fake_grad("st8", "strict", 1.96, 8.0, 2.3, 5.0), engine={"name": "simulator (audited)"})
    fl = dict(
        fake_grad("st8-flower", "strict", 1.96, 8.0, 2.3, 5.0),
        engine={"name": "flower", "processes": 4, "tls": True, "node_auth": True, "sealed": True},
    )
    write(tmp_path, "st8", sim)
    write(tmp_path, "st8-flower", fl)
    write(tmp_path, "pa8", dict(fake_grad("pa8", "paper", 1.96, 8.0, 2.3, 5.0)))
    write(
        tmp_path,
        "pa8-flower",
        dict(fake_grad("pa8-flower", "paper", 1.96, 8.0, 2.3, 5.0), engine=fl["engine"]),
    )
    for name, text in (
        ("st8", "a\n1\n"),
        ("st8-flower", "a\n1\n"),
        ("pa8", "a\n1\n"),
        ("pa8-flower", "a\n2\n"),
    ):
        (tmp_path / name / "canary_scores.csv").write_text(text)
    monkeypatch.setattr(doc, "DOCS", tmp_path / "docs")
    doc.main([str(tmp_path)])
    md = capsys.readouterr().out
    engines = md[md.index("## Engines") : md.index("## Does")]
    assert "| st8-flower | flower | 8.000 | **2.300** |" in engines
    assert (
        "st8-flower (flower: tls, node_auth, sealed; 4 processes) against st8 (simulator): the same"
        in engines
    )
    assert (
        "pa8-flower (flower: tls, node_auth, sealed; 4 processes) against pa8 (simulator): the canary "
        "scores DIFFER" in engines
    )
    assert not any(line.startswith("| st8-flower") for line in md[: md.index("## Engines")].splitlines())
    data = json.loads((tmp_path / "docs" / "data" / "audit.json").read_text())
    assert {(d["audit"], d["same_scores"]) for d in data["engines"]} == {
        ("st8-flower", True),
        ("pa8-flower", False),
    }
