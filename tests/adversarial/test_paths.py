"""Names that would escape a folder (path traversal) are refused before anything is written."""

import pytest
from typer.testing import CliRunner

from silofl.cli.main import app
from silofl.core.errors import ConfigError
from silofl.site.folder import SiteFolder

BAD = ["../evil", "a/b", "/abs", "..", ".", "", "x" * 65, "a\\b", "a\x00b"]


@pytest.mark.parametrize("name", BAD)
def test_a_site_folder_refuses_a_name_that_is_not_a_plain_name(name, tmp_path):
    with pytest.raises(ConfigError, match="site name"):
        SiteFolder.open(tmp_path / "sites" / "x", name, (1.0, 1e-5))
    assert not (tmp_path / "sites").exists()


def test_the_cli_refuses_traversing_site_names_in_one_line(tmp_path):
    data = tmp_path / "d.csv"
    data.write_text("a,y\n1,0\n2,1\n")
    r = CliRunner().invoke(
        app,
        [
            "site",
            "init",
            str(tmp_path / "s"),
            "--name",
            "../evil",
            "--data",
            str(data),
            "--lifetime-epsilon",
            "1",
        ],
    )
    assert r.exit_code == 2 and "site name" in r.output and not (tmp_path / "evil").exists()
    r = CliRunner().invoke(
        app,
        [
            "pubsub",
            "publish",
            "--broker",
            str(tmp_path / "b"),
            "--site",
            "../evil",
            "--data",
            str(data),
            "--schema",
            str(tmp_path / "none.json"),
            "--site-dir",
            str(tmp_path / "sd"),
        ],
    )
    assert r.exit_code == 2 and not (tmp_path / "evil").exists() and not (tmp_path / "sd").exists()


def test_a_step_name_is_never_a_path_or_an_arbitrary_attribute(tiny_cfg, tmp_path):
    from silofl.comm.messages import Message, pack, unpack
    from silofl.deploy.site import ERROR
    from tests.deploy.test_worker import Loopback, deployment, join

    cfg = tiny_cfg.replace(method="fedavg", clients=2, rounds=1, seed=0)
    _, workers, spec, _ = deployment(cfg, tmp_path)
    join(Loopback(workers), spec)
    for step in ("../../etc/passwd", "__init__", "handle", "_release"):
        got, msgs = unpack(workers[0].handle_frame(pack(step, {0: Message({"round": 1})})))
        assert got == ERROR and ("no step" in msgs[0].meta["error"] or "plain name" in msgs[0].meta["error"])
