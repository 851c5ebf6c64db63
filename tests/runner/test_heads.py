"""A model that does not answer the data's targets is refused before anything trains (one line, exit 2)."""

from typer.testing import CliRunner

from silofl.cli.main import app
from silofl.data.segmentation import generate_sites


def test_a_segmentation_data_set_with_a_classification_head_is_refused(tmp_path):
    """It used to fail in the first round with a RuntimeError traceback from the loss."""
    sites = generate_sites(tmp_path / "sites", sites=2, per_site=12, size=32, seed=0)
    out = tmp_path / "r"
    res = CliRunner().invoke(
        app,
        [
            "run",
            "--method",
            "fedavg",
            "--dataset",
            "segmentation",
            "--site-data",
            ",".join(sites),
            "--proxy-model",
            "mlp",
            "--rounds",
            "1",
            "--batch-size",
            "4",
            "--target-epsilon",
            "8",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 2, res.output
    line = " ".join(res.output.split())
    assert "--proxy-model mlp: dataset segmentation has masks" in line and "unet" in line
    assert "Traceback" not in res.output and not out.exists()
