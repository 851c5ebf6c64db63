"""`silofl tune` on per-site tables: every trial is scored on each site's validation rows, carved from its own
training rows (silofl.data.sites.validation_rows) — never its test rows nor --test-data —, selection on the DP
model's validation figure (the C-index for a survival target, the --metric headline otherwise); bad input is
one line, exit 2, nothing written."""

import json

import pytest
import yaml
from typer.testing import CliRunner

from silofl.cli.main import app
from silofl.experiments.tune import SITE_VALIDATION_NOTE, parse_grid, tune
from silofl.runner.config import RunConfig
from tests.helpers import write_survival_sites

runner = CliRunner()


def _tune_args(schema, sites, out, *extra):
    return [
        "tune",
        "--method",
        "fedavg",
        "--target-epsilon",
        "3",
        "--set",
        "dataset=table",
        "--set",
        f"schema={schema}",
        "--set",
        f"site_data={','.join(sites)}",
        "--set",
        "proxy_model=logreg",
        "--set",
        "rounds=3",
        "--set",
        "batch_size=20",
        "--set",
        "seed=1",
        "--out",
        str(out),
        *extra,
    ]


@pytest.mark.slow  # two DP trials on 3 × 120 survival rows, one on 2 × 150 classification rows: ~5 s
def test_tune_on_per_site_tables_selects_on_each_sites_validation_rows(tmp_path):
    schema, sites, _ = write_survival_sites(tmp_path / "data", sites=3, rows=120)
    bogus = tmp_path / "data" / "test.csv"
    bogus.write_text("not,a,table\n")  # --test-data: never read by a trial
    out = tmp_path / "t"
    r = runner.invoke(
        app, _tune_args(schema, sites, out, "--set", f"test_data={bogus}", "--grid", "lr=0.01,0.1")
    )
    assert r.exit_code == 0, r.output
    res = json.loads((out / "tune.json").read_text())
    assert res["metric"] == "c_index" and res["selection"] == "global_c_index"
    assert res["validation_split"].startswith("validation: 19, 19, 19 rows carved from the sites' own")
    assert res["validation_note"] == SITE_VALIDATION_NOTE
    scores = [t["validation"] for t in res["trials"]]
    assert all(0.0 < v < 1.0 for v in scores) and res["best"]["validation"] == max(scores)
    for i in range(2):  # each trial trained on 77 of a site's 96 training rows and scored on the other 19
        s = json.loads((out / "trials" / f"trial{i}" / "summary.json").read_text())
        assert s["test_set"] == res["validation_split"]
        assert (
            yaml.safe_load((out / "trials" / f"trial{i}" / "config.yaml").read_text())["eval_split"]
            == "validation"
        )
        assert s["final"]["global_c_index"]["mean"] == pytest.approx(scores[i])
        assert s["final"]["epsilon"]["mean"] <= 3.0 + 1e-9
    best = yaml.safe_load((out / "best.yaml").read_text())
    assert best["eval_split"] == "test" and best["fedavg"]["lr"] == res["best"]["settings"]["lr"]
    assert "private) training rows" in (out / "tune.md").read_text()

    # a classification table: the --metric headline (AUROC) on the sites' validation rows
    from tests.data.test_tables import SCHEMA, site_frame, write_schema

    cls = tmp_path / "cls"
    cls.mkdir()
    paths = []
    for k in range(2):
        p = cls / f"h{k}.csv"
        site_frame(150, seed=k, shift=5.0 * k).to_csv(p, index=False)
        paths.append(str(p))
    base = RunConfig.from_dict(
        dict(
            method="fedavg",
            dataset="table",
            schema=str(write_schema(cls, SCHEMA)),
            site_data=paths,
            proxy_model="logreg",
            rounds=2,
            batch_size=20,
            target_epsilon=3.0,
            metric="auroc",
            eval_split="validation",
            seed=2,
            out=str(tmp_path / "unused"),
        )
    )
    res2 = tune(base, parse_grid(["lr=0.05"]), tmp_path / "t2")
    assert res2["selection"] == "global_auroc" and res2["metric"] == "auroc"
    assert res2["validation_split"].startswith("validation: 24, 24 rows")  # 0.2 of 120 training rows each
    assert 0.0 <= res2["trials"][0]["validation"] <= 1.0


@pytest.mark.slow  # CLI invocations that refuse before any trial: < 1 s
def test_tune_on_too_small_sites_or_image_folders_is_one_line_and_writes_nothing(tmp_path):
    schema, sites, _ = write_survival_sites(tmp_path / "data", sites=2, rows=3)
    out = tmp_path / "t"
    r = runner.invoke(app, _tune_args(schema, sites, out, "--grid", "lr=0.01,0.1"))
    assert r.exit_code == 2 and "Traceback" not in r.output
    line = " ".join(r.output.split())
    assert "2 rows are too few" in line and "validation split" in line
    assert not out.exists()
    for d in ("a", "b"):
        (tmp_path / "img" / d / "x").mkdir(parents=True)
    r = runner.invoke(
        app,
        [
            "tune",
            "--target-epsilon",
            "3",
            "--set",
            "dataset=folder",
            "--set",
            f"site_data={tmp_path / 'img' / 'a'},{tmp_path / 'img' / 'b'}",
            "--grid",
            "lr=0.01",
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "per-site tables" in " ".join(r.output.split()) and not out.exists()
