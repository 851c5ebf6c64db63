"""The decision report of a run (silofl.runner.decision): held-out sets that never train, going alone on the
same rows, a row per site written into the run folder."""

import json

import numpy as np
import pytest
import torch

from silofl.models import ModelSpec, build_model, save_model
from silofl.runner.config import RunConfig
from silofl.runner.data import prepare_split
from silofl.runner.decision import held_out_sets, logistic_reference, report, skewed_internal
from tests.data.test_person_tables import person_frame
from tests.data.test_tables import write_csv, write_schema


def _table_run(tmp_path, sites=None, split_seed=11, unit="one person", **options):
    """A FedAvg table run's config, split, saved (untrained) global models and summary: by default two sites
    of persons (``id_column``), AUROC; ``sites`` (CSV paths) and ``options`` override."""
    if sites is None:
        sites = [str(write_csv(tmp_path, person_frame(60, s), f"h{s}.csv")) for s in (0, 1)]
        options = {"id_column": "patient_id", "metric": "auroc", **options}
    cfg = RunConfig.from_dict(
        dict(
            method="fedavg",
            dataset="table",
            schema=str(write_schema(tmp_path)),
            site_data=sites,
            test_fraction=0.3,
            split_seed=split_seed,
            proxy_model="logreg",
            target_epsilon=3.0,
            delta=1e-3,
            out=str(tmp_path / "r"),
            **options,
        )
    ).resolve()
    split = prepare_split(cfg, torch.device("cpu"))
    out = tmp_path / "r"
    for k, (x, _) in enumerate(split.parts):
        spec = ModelSpec("logreg", tuple(x.shape[1:]), 2)
        save_model(build_model("logreg", spec.input_shape, 2), spec, out / "models" / f"client{k}_global")
    summary = {
        "final": {"per_client": [{"client": k, "epsilon": 2.5} for k in range(2)]},
        "privacy": {"formal_guarantee": True, "unit": unit},
        "data_split_seed": split_seed,
        "sites_trained": 2,
    }
    return cfg, split, summary, out


def test_no_person_is_in_both_training_and_the_internal_test(tmp_path):
    cfg, split, _, _ = _table_run(tmp_path)
    held = held_out_sets(cfg, split, 11)
    for k, (x, _) in enumerate(split.parts):
        # age is the person's number (person_frame), one affine map per site: a person's rows share a value
        trained = set(np.round(x[:, 0].numpy(), 5))
        hx, _, persons, label = held[k]["internal"]
        assert persons is not None and "persons" in label
        assert not trained & set(np.round(hx[:, 0].numpy(), 5))
        assert len(np.unique(persons)) < len(persons)  # several rows per held-out person


def test_the_logistic_reference_never_reads_the_held_out_labels(tmp_path):
    cfg, split, _, _ = _table_run(tmp_path)
    held = held_out_sets(cfg, split, 11)[0]
    a = logistic_reference(*split.parts[0], held, 2)
    shuffled = {s: (x, y[torch.randperm(len(y))], p, lab) for s, (x, y, p, lab) in held.items()}
    b = logistic_reference(*split.parts[0], shuffled, 2)
    assert a is not None and all(torch.equal(a[s], b[s]) for s in held)


def test_a_run_folder_gets_its_decision(tmp_path):
    cfg, split, summary, out = _table_run(tmp_path)
    d = report(cfg, split, summary, out)
    saved = json.loads((out / "decision.json").read_text())
    assert saved["metric"] == "auroc" and len(saved["rows"]) == 2
    row = saved["rows"][0]
    assert row["models"]["global"]["internal"]["unit"] == "persons"
    assert row["reference"]["internal"]["name"] == "scikit-learn logistic regression"
    assert row["epsilon"] == 2.5 and "against the server" in row["threat"]
    assert row["verdict"] and d == saved
    assert "## Verdicts" in (out / "report.md").read_text()


def test_a_benchmarks_internal_set_has_the_sites_label_mix():
    y_train = torch.tensor([0] * 80 + [1] * 20)
    y_test = torch.tensor([0, 1, 2] * 100)
    rows = skewed_internal(y_train, y_test, seed=5, k=0)
    picked = y_test[torch.as_tensor(rows)]
    assert len(set(rows.tolist())) == len(rows) and 2 not in picked.tolist()
    assert (picked == 0).float().mean().item() == pytest.approx(0.8)
    assert np.array_equal(rows, skewed_internal(y_train, y_test, seed=5, k=0))  # the run and going alone


def test_a_site_with_few_held_out_rows_gets_a_labelled_fallback(tmp_path):
    """A site holding out 6 rows (20 × 0.3) gets its figures without an interval and the reason, the other
    (120 rows, 36 held out) its intervals; no traceback."""
    from tests.data.test_tables import site_frame

    sites = [str(write_csv(tmp_path, site_frame(n, seed=n), f"s{n}.csv")) for n in (20, 120)]
    cfg, split, summary, out = _table_run(tmp_path, sites, split_seed=3, unit="one row", metric="accuracy")
    d = report(cfg, split, summary, out)
    assert d is not None
    small, large = d["rows"]
    assert small["sets"]["internal"]["rows"] == 6
    assert small["fallback"] == (
        "no interval on the site's own held-out set: 6 held-out rows, too few for a bootstrap interval "
        "(at least 20)"
    )
    assert small["models"]["global"]["internal"]["low"] is None and small["verdict"].startswith("no verdict")
    assert "fallback" not in large and large["models"]["global"]["internal"]["low"] is not None
    assert "(no interval: 6 held-out rows, fewer than 20)" in (out / "report.md").read_text()


def test_the_logistic_reference_serves_a_site_that_lacks_a_class():
    """A site with two of three classes (the penguins' Biscoe island has no Chinstrap) gets a reference; the
    class it lacks gets no probability."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(60, 3, generator=g)
    y = torch.where(x[:, 0] > 0, 2, 0)
    held = {"internal": (x[:10], y[:10], None, "")}
    ref = logistic_reference(x, y, held, 3)
    assert ref is not None and torch.all(ref["internal"][:, 1] < -1e8)
