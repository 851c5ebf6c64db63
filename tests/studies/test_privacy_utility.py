"""The privacy-utility study's rows for FedPer, FedRep and FedBN (issue 29): their configurations are valid
runs on the heads their labels name, with FedAvg's recipe, next to FedAvg on the same head; the study plans
exactly their jobs when asked for them, carries the other rows over, and measures personalisation against
that same-head reference seed by seed. Nothing here trains."""

from pathlib import Path

import pytest

from silofl.fl.methods.fedrep import head_steps
from silofl.runner.config import RunConfig, _all_option_fields
from studies import privacy_utility as pu

REPO = Path(__file__).resolve().parents[2]
ROWS = {label: (method, fixed, grid) for label, method, fixed, grid in pu.BODY_HEAD_SCATTER}
FEDAVG = {label: fixed for label, method, fixed, grid in pu.METHODS_SCATTER}["FedAvg"]


def test_the_body_head_rows_are_valid_runs_on_the_heads_their_labels_name():
    assert set(ROWS) == {
        "FedAvg (scattercnn)",
        "FedPer (scattercnn)",
        "FedRep (scattercnn)",
        "FedBN (scattercnn-gn)",
    }
    assert set(ROWS) <= set(pu.PERSONALIZED_LABELS)  # in the scatter stage's tables
    assert set(pu.PERSONAL_DP) == set(ROWS) - {pu.FEDAVG_CNN}
    for label, (method, fixed, grid) in ROWS.items():
        assert label == f"{label.split()[0]} ({fixed['proxy_model']})"
        assert method == label.split()[0].lower()
        # FedAvg's recipe: only the head (and FedRep's two steps a round) differ
        extra = {"proxy_model", "local_steps", "fedrep_head_share"}
        assert {k: v for k, v in fixed.items() if k not in extra} == {
            k: v for k, v in FEDAVG.items() if k != "local_steps"
        }
        assert grid == {"rounds": [50], "lr": pu.CNN_LR} and len(pu.CNN_LR) == 2
        data = {
            **pu.BASE,
            **pu.SCATTER_HEADS,
            **fixed,
            **{k: v[0] for k, v in grid.items()},
            "method": method,
            "seed": 0,
            "target_epsilon": 3.0,
            "eval_split": "validation",
            "out": "unused",
        }
        cfg = RunConfig.from_dict(data, strict=False).resolve()
        own = set(cfg.options.field_names()) | set(RunConfig.common_fields())
        assert set(data) - own <= {"private_model"}, label  # nothing the row sets is dropped
        assert set(data) <= own | set(_all_option_fields())
        assert cfg.options.proxy_model == fixed["proxy_model"] and cfg.combine == "weights"
    # FedRep's round has a head phase and a body phase (one step a round would leave the head untrained)
    _, rep, _ = ROWS["FedRep (scattercnn)"]
    assert head_steps(rep["local_steps"], rep["fedrep_head_share"]) == 1 == rep["local_steps"] - 1
    assert head_steps(1, 0.2) == 0
    assert "not in this stage" not in pu.FEATURE_TEXT["scatter"]
    assert "`scattercnn-gn`" in pu.FEATURE_TEXT["scatter"]


def test_asking_for_the_new_rows_plans_their_tuning_and_final_runs_only():
    todo = pu.jobs([0, 1], ("scatter",), pu.BUDGETS, tuple(ROWS))
    tuned = {(j[1], j[5]) for j in todo if j[0] == "tuned"}
    final = {(j[1], j[5], j[6]) for j in todo if j[0] == "final"}
    assert {j[0] for j in todo} == {"tuned", "final"}  # no going-alone, ceiling or PubSub-ML runs
    assert tuned == {(label, eps) for label in ROWS for eps in pu.BUDGETS}
    assert all(j[6] == pu.TUNE_SEED for j in todo if j[0] == "tuned")
    assert final == {(label, eps, 1) for label in ROWS for eps in pu.BUDGETS}
    # each in its own folder (the label's slug), next to the earlier rows'
    folders = {pu._folder(Path("r"), j).parts[2] for j in todo}
    assert folders == {
        "fedavg--scattercnn",
        "fedper--scattercnn",
        "fedrep--scattercnn",
        "fedbn--scattercnn-gn",
    }


def test_the_other_rows_are_carried_over_from_the_documents_csv():
    csv = REPO / "docs" / "data" / "privacy_utility.csv"
    carried = pu.carried_rows(csv, ("scatter",), tuple(ROWS))
    labels = {(r["features"], r["label"]) for r in carried}
    assert ("scatter", "FedAvg") in labels and ("scatter", "APFL") in labels and ("none", "FedAvg") in labels
    assert not {label for _, label in labels} & set(ROWS)


def _row(label, seed, eps, test, **accs):
    head = "global_acc" if label == pu.FEDAVG_CNN else "private_acc"
    return {
        "label": label,
        "seed": seed,
        "budget": eps,
        "features": "scatter",
        "headline": head,
        "test": test,
        "accs": {head: test, **accs},
    }


def test_personalisation_is_measured_against_fedavg_on_the_same_head_seed_by_seed():
    rows = [
        _row(pu.FEDAVG_CNN, 0, 3.0, 0.60),
        _row(pu.FEDAVG_CNN, 1, 3.0, 0.70),
        _row("FedPer (scattercnn)", 0, 3.0, 0.50),
        _row("FedPer (scattercnn)", 1, 3.0, 0.65),
        _row("FedBN (scattercnn-gn)", 0, 3.0, 0.62),
        _row("FedBN (scattercnn-gn)", 2, 3.0, 0.99),  # no reference on seed 2: not counted
    ]
    lines = pu._personal_section(pu._Rows(rows), "scatter")
    cells = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines if ln.startswith("| F")]
    table = {c[0]: c[1:] for c in cells}
    assert table["FedPer (scattercnn)"] == ["—", "-0.075 ± 0.025", "—"]
    assert table["FedBN (scattercnn-gn)"] == ["—", "+0.020", "—"]
    assert "FedRep (scattercnn)" not in table
    assert pu._personal_section(pu._Rows(rows[2:]), "scatter") == []  # no reference, no section


@pytest.mark.slow
def test_the_document_counts_a_personal_dp_model_as_a_site_model(tmp_path):
    """document() on made-up rows of the scatter stage: FedBN's personal (DP) model is the best site model
    where it is the highest, the personalisation table is there, and the stage's text names the heads."""
    alone = [
        {**_row(pu.OWN, s, None, 0.70), "headline": "own_acc", "accs": {"own_acc": 0.70}} for s in (0, 1)
    ]
    rows = alone + [
        _row(pu.FEDAVG_CNN, s, eps, 0.60, combined_acc=0.65) for s in (0, 1) for eps in pu.BUDGETS
    ]
    rows += [_row("FedBN (scattercnn-gn)", s, eps, 0.72 + s / 100) for s in (0, 1) for eps in pu.BUDGETS]
    for r in rows:
        r.update(epsilon=r["budget"], sigma=None, settings={"lr": 3.0}, rounds=50)
    doc = tmp_path / "docs" / "privacy_utility.md"
    doc.parent.mkdir()
    (tmp_path / "root").mkdir()
    text = pu.document(
        rows, tmp_path / "root", doc, [0, 1], "python -m studies.privacy_utility", ("scatter",)
    )
    summary = text.split("## Does collaborating pay?")[1].split("\n\n")[1]
    assert summary.count("0.725 (FedBN (scattercnn-gn), private) | +0.025 ± 0.005 |") == 3
    assert "0.600 (FedAvg (scattercnn), global) | -0.100 ± 0.000 |" in summary
    assert "| FedBN (scattercnn-gn) | +0.125 ± 0.005 | +0.125 ± 0.005 | +0.125 ± 0.005 |" in text
    assert "`scattercnn-gn`" in text and "not in this stage" not in text
    assert (tmp_path / "docs" / "privacy_utility.png").is_file()
