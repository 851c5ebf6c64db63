"""The decision report (runner.decision_report): figures, paired gains and a verdict that follows them."""

import numpy as np
import pytest
import torch

from silofl.runner.decision_report import HeldOut, decide, markdown, site_decision, verdict


def _logits(y: torch.Tensor, right: float, seed: int) -> torch.Tensor:
    """Two-class logits that predict ``y`` on a fraction ``right`` of the rows (the rest flipped)."""
    g = torch.Generator().manual_seed(seed)
    flip = torch.rand(len(y), generator=g) > right
    pred = torch.where(flip, 1 - y, y)
    return torch.nn.functional.one_hot(pred, 2).float() * 3 + 0.1 * torch.rand(len(y), 2, generator=g)


def _row(mine: float, alone: float, n: int = 400, eps: float | None = 3.0):
    y = torch.randint(0, 2, (n,), generator=torch.Generator().manual_seed(0))
    sets = {"internal": HeldOut(y, None, "own"), "external": HeldOut(y, None, "common")}
    models = {"proxy": {s: _logits(y, mine, 1) for s in sets}}
    refs = {"alone": {s: _logits(y, alone, 2) for s in sets}}
    privacy = {"epsilon": eps, "delta": 1e-5, "threat": "against the server"}
    return site_decision("north", "accuracy", sets, models, refs, privacy, seed=0)


def test_a_clear_gain_is_stated_with_its_interval_and_budget():
    row = _row(0.9, 0.6)
    g = row["models"]["proxy"]["gain"]["internal"]
    assert g["low"] > 0 and g["estimate"] == pytest.approx(
        row["models"]["proxy"]["internal"]["estimate"] - row["reference"]["internal"]["figure"]["estimate"]
    )
    v = row["verdict"]
    assert v.startswith("on your own patients: +") and "shared DP model" in v
    assert f"[{g['low']:+.3f}, {g['high']:+.3f}]" in v and "ε = 3.00 against the server" in v


def test_no_clear_gain_says_so():
    row = _row(0.71, 0.70)
    g = row["models"]["proxy"]["gain"]["internal"]
    assert g["low"] < 0 < g["high"]
    assert row["verdict"].startswith("no gain on your own patients at this budget")


def test_a_clear_loss_says_going_alone_is_better():
    row = _row(0.55, 0.9)
    assert row["models"]["proxy"]["gain"]["internal"]["high"] < 0
    assert row["verdict"].startswith("a loss on your own patients")


def test_verdict_follows_the_numbers_it_is_given():
    """The verdict reads only the row's numbers: change them and it changes."""
    row = _row(0.9, 0.6)
    row["models"]["proxy"]["gain"]["internal"].update(estimate=0.01, low=-0.02, high=0.04)
    assert verdict(row, "accuracy").startswith("no gain")
    row["models"]["proxy"]["gain"]["internal"].update(estimate=-0.1, low=-0.2, high=-0.05)
    assert verdict(row, "accuracy").startswith("a loss")
    row["reference"] = {}
    assert "no going-alone reference" in verdict(row, "accuracy")


def test_lower_is_better_metrics_turn_the_difference_into_a_gain():
    y = torch.randint(0, 2, (300,), generator=torch.Generator().manual_seed(3))
    good = torch.nn.functional.one_hot(y, 2).float() * 2.0  # confident and right: small ECE
    bad = torch.nn.functional.one_hot(1 - y, 2).float() * 2.0  # confident and wrong: large ECE
    sets = {"internal": HeldOut(y, None, "own")}
    row = site_decision("a", "ece", sets, {"private": {"internal": good}}, {"alone": {"internal": bad}}, {})
    g = row["models"]["private"]["gain"]["internal"]
    assert g["estimate"] > 0 and g["low"] > 0


def test_the_stronger_reference_is_the_one_compared_with():
    y = torch.randint(0, 2, (300,), generator=torch.Generator().manual_seed(0))
    sets = {"internal": HeldOut(y, None, "own")}
    refs = {"weak": {"internal": _logits(y, 0.6, 2)}, "strong": {"internal": _logits(y, 0.8, 3)}}
    row = site_decision("a", "accuracy", sets, {"proxy": {"internal": _logits(y, 0.7, 1)}}, refs, {})
    assert row["reference"]["internal"]["name"] == "strong"


def test_persons_are_resampled_whole_and_few_rows_are_labelled():
    y = torch.randint(0, 2, (12,), generator=torch.Generator().manual_seed(0))
    sets = {"internal": HeldOut(y, np.arange(12) // 2, "own persons")}
    row = site_decision("a", "accuracy", sets, {"proxy": {"internal": _logits(y, 0.8, 1)}}, {}, {})
    fig = row["models"]["proxy"]["internal"]
    assert fig["unit"] == "persons" and fig["units"] == 6
    assert fig["low"] is None and "fewer than 20" in fig["note"]


def test_report_has_each_site_its_verdict_and_the_mean():
    d = decide([_row(0.9, 0.6), {**_row(0.6, 0.9), "site": "south"}], "accuracy", ["a note"])
    md = markdown(d)
    assert "| north | shared DP model |" in md and "| south | shared DP model |" in md
    assert "- **north**: on your own patients" in md and "- **south**: a loss" in md
    m = d["mean_over_sites"]["proxy"]
    assert m["gain_internal"] == pytest.approx(
        np.mean([r["models"]["proxy"]["gain"]["internal"]["estimate"] for r in d["rows"]])
    )


def test_a_large_held_out_set_gets_fewer_resamples_recorded():
    from silofl.runner.decision_report import resamples_for

    assert resamples_for(300) == 1000 and resamples_for(10_000) == 200 and resamples_for(4_000) == 500
    y = torch.randint(0, 2, (5000,), generator=torch.Generator().manual_seed(0))
    row = site_decision(
        "a",
        "accuracy",
        {"external": HeldOut(y, None, "big")},
        {"proxy": {"external": _logits(y, 0.8, 1)}},
        {},
        {},
    )
    assert row["models"]["proxy"]["external"]["resamples"] == 400


@pytest.mark.parametrize("n", [12, 1, 0])
def test_too_few_held_out_rows_give_a_labelled_fallback_and_no_verdict(n):
    """Fewer held-out rows than an interval needs (or none): the figures without an interval, the reason
    stated in the row, the table and the verdict — never an interval, never a gain called sure."""
    y = torch.tensor([0, 1] * 6)[:n]
    sets = {"internal": HeldOut(y, None, "own")}
    row = site_decision(
        "tiny",
        "auroc",
        sets,
        {"proxy": {"internal": _logits(y, 0.9, 1)}},
        {"alone": {"internal": _logits(y, 0.5, 2)}},
        {},
    )
    fig = row["models"]["proxy"]["internal"]
    assert fig["low"] is None and fig["high"] is None and f"{n} held-out rows, fewer than 20" in fig["note"]
    assert row["fallback"].startswith(
        f"no interval on the site's own held-out set: {n} held-out rows, too few"
    )
    assert row["verdict"].startswith(f"no verdict on your own patients: {n} held-out rows")
    md = markdown(decide([row], "auroc"))
    assert (
        f"(no interval: {n} held-out rows, fewer than 20)" in md
        and "[" not in md.split("## Verdicts")[0].split("|---|")[-1]
    )
