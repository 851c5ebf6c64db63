"""The client-dp-seg preset (the seed's Table 1 on segmentation) plans on per-site segmentation data."""

from __future__ import annotations

import pytest

from silofl.data.segmentation import generate_sites
from silofl.experiments.compare import CompareConfig


@pytest.mark.slow  # ~2 s: ten variants, each checked against the sites' data
def test_the_preset_plans_every_variant_on_generated_sites(tmp_path):
    sites = generate_sites(tmp_path / "sites", sites=3, per_site=20, size=16, seed=0, fmt="npz")
    cfg = CompareConfig(
        methods=["dp-fedavg"],
        seeds=[0],
        preset="client-dp-seg",
        out=str(tmp_path / "report"),
        run={"dataset": "segmentation", "site_data": sites, "clients": 3, "batch_size": 4, "rounds": 2},
    )
    runs = cfg.plan()
    assert [r.variant for r in runs][:4] == [
        "no DP",
        "z=0.3 none",
        "z=0.3 adaptive hospital",
        "z=0.3 adaptive subclient",
    ]
    assert len(runs) == 10
    for r in runs:
        assert r.cfg.dataset == "segmentation" and r.cfg.metric == "dice"
        assert r.cfg.options.proxy_model == "unet"
    z = {(r.variant, r.cfg.noise_multiplier) for r in runs if r.variant != "no DP"}
    assert {n for _, n in z} == {0.3, 0.5, 0.7}
    units = {r.cfg.options.privacy_unit for r in runs if "adaptive" in r.variant}
    assert units == {"hospital", "subclient"}
    assert not (tmp_path / "report").exists()  # planning writes nothing
