"""--track tensorboard|mlflow DIR: each evaluated round's figures, labelled dp / public / nonprivate, and
the config, read back from the written event files and MLflow store and compared with the run's own
metrics.jsonl."""

import json

import pytest
import yaml
from typer.testing import CliRunner

from silofl.cli.main import app
from silofl.core.errors import ConfigError
from silofl.runner.config import RunConfig
from silofl.runner.loop import run
from silofl.runner.tracking import Tracker, label_of, scalars

FIGURES_OF_RECORD = ("round", "client")


def _cfg(tmp_path, track, **kw):
    return RunConfig.from_dict(
        dict(
            dataset="digits",
            clients=2,
            rounds=2,
            samples_per_client=100,
            batch_size=25,
            delta=1e-3,
            private_model="mlp",
            proxy_model="mlp",
            test_limit=100,
            out=str(tmp_path / "run"),
            track=track,
            **kw,
        )
    )


def _expected(out) -> dict[str, dict[int, float]]:
    """'<figure>/client<k>' -> {round: value} from the run folder's metrics.jsonl (every number of every
    record)."""
    want: dict[str, dict[int, float]] = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        for key, v in r.items():
            if key not in FIGURES_OF_RECORD and v is not None:
                want.setdefault(f"{key}/client{r['client']}", {})[r["round"]] = float(v)
    return want


def _by_figure(tags) -> dict[str, str]:
    """'<figure>/client<k>' -> the label prefix of its tag."""
    return {t.split("/", 1)[1]: t.split("/", 1)[0] for t in tags}


@pytest.mark.slow
def test_tensorboard_event_files_hold_every_figure_with_its_label(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # the YAML value path of the command line (--set track=[KIND, DIR]); the sites release their
    # non-private figures
    r = CliRunner().invoke(
        app,
        [
            "run",
            "--dataset",
            "digits",
            "--clients",
            "2",
            "--rounds",
            "2",
            "--samples-per-client",
            "100",
            "--batch-size",
            "25",
            "--delta",
            "1e-3",
            "--private-model",
            "mlp",
            "--proxy-model",
            "mlp",
            "--test-limit",
            "100",
            "--report-nonprivate",
            "--quiet",
            "--out",
            str(tmp_path / "run"),
            "--set",
            f"track=[tensorboard, {tmp_path / 'tb'}]",
        ],
    )
    assert r.exit_code == 0, r.output
    (logdir,) = (tmp_path / "tb").iterdir()
    assert logdir.name == "run"
    ea = EventAccumulator(str(logdir))
    ea.Reload()
    tags = ea.Tags()["scalars"]
    labels = _by_figure(tags)
    want = _expected(tmp_path / "run")
    assert set(labels) == set(want)  # every figure of metrics.jsonl, nothing else
    for tag in tags:
        got = {e.step: e.value for e in ea.Scalars(tag)}
        assert got == pytest.approx(want[tag.split("/", 1)[1]], rel=1e-6)  # event files hold float32
    # ProxyFL strict: the proxy is the DP release, the private model is not, ε and bytes are public
    assert labels["proxy_acc/client0"] == labels["proxy_auroc/client1"] == "dp"
    assert labels["private_acc/client0"] == labels["mean_grad_norm/client1"] == "nonprivate"
    assert (
        labels["epsilon/client0"]
        == labels["bytes_sent/client1"]
        == labels["examples_seen/client0"]
        == "public"
    )
    eps = {e.step: e.value for e in ea.Scalars("public/epsilon/client1")}
    assert eps[2] > eps[1] > 0
    text = ea.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    logged = yaml.safe_load(text.removeprefix("```yaml\n").removesuffix("```"))
    assert logged == yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())


@pytest.mark.slow
def test_mlflow_store_holds_the_history_and_params_and_no_unreleased_figure(tmp_path):
    from mlflow.tracking import MlflowClient

    from silofl.runner.tracking import MlflowTracker

    store = tmp_path / "ml"
    cfg = _cfg(tmp_path, ["mlflow", str(store)], report_nonprivate=False)
    run(cfg, progress=False)
    client = MlflowClient(tracking_uri=MlflowTracker.uri(store))
    (r,) = client.search_runs([client.get_experiment_by_name("silofl").experiment_id])
    assert (r.info.status, r.info.run_name, r.data.tags["silofl.method"]) == ("FINISHED", "run", "proxyfl")
    want = _expected(tmp_path / "run")
    assert set(_by_figure(r.data.metrics)) == set(want)
    for tag in r.data.metrics:
        hist = {m.step: m.value for m in client.get_metric_history(r.info.run_id, tag)}
        assert hist == pytest.approx(want[tag.split("/", 1)[1]])
    # the sites kept their non-private figures (in their own folders): none reached the tracker
    assert not [
        t for t in r.data.metrics if t.startswith("nonprivate/") or "private_acc" in t.replace("proxy", "")
    ]
    kept = json.loads((tmp_path / "run" / "sites" / "client0" / "metrics.jsonl").read_text().splitlines()[0])
    assert "private_acc" in kept and "private_acc/client0" not in want
    assert _by_figure(r.data.metrics)["proxy_acc/client0"] == "dp"
    params = r.data.params
    assert (params["method"], params["clients"], params["report_nonprivate"], params["proxy_model"]) == (
        "proxyfl",
        "2",
        "False",
        "mlp",
    )
    logged = client.download_artifacts(r.info.run_id, "config.yaml", str(tmp_path))
    assert yaml.safe_load(open(logged).read()) == yaml.safe_load(
        (tmp_path / "run" / "config.yaml").read_text()
    )


def test_scalars_label_every_number_by_the_sites_labels_then_the_runs():
    records = [
        {
            "round": 3,
            "client": 1,
            "active": True,
            "proxy_acc": 0.5,
            "private_acc": 0.7,
            "epsilon": 2.0,
            "delta": None,
            "note": "x",
            "xi": 0.1,
            "v": 4.0,
            "mystery": float("nan"),
        }
    ]
    labels = {1: {"proxy_acc": "dp", "private_acc": "non-private"}}
    assert scalars(records, labels) == {
        "public/active/client1": 1.0,
        "dp/proxy_acc/client1": 0.5,
        "nonprivate/private_acc/client1": 0.7,
        "public/epsilon/client1": 2.0,
        "nonprivate/xi/client1": 0.1,
        "dp/v/client1": 4.0,
    }
    assert label_of("unknown", {}) == "nonprivate"  # unlabelled: treated as non-private
    assert label_of("epsilon", {"epsilon": "weird"}) == "nonprivate"


@pytest.mark.parametrize(
    "track, msg",
    [
        (["wandb", "DIR"], "unknown tracker 'wandb' for --track; choose one of: tensorboard, mlflow"),
        (["tensorboard"], "option 'track' must be of type tuple[str, str]"),
        ("tensorboard", "option 'track' must be of type tuple[str, str]"),
        (["tensorboard", "FILE"], "--track tensorboard DIR {file} is a file, not a folder"),
    ],
)
def test_bad_track_is_one_line_error_and_writes_nothing(tmp_path, track, msg):
    f = tmp_path / "a-file"
    f.write_text("keep")
    track = [str(f) if t == "FILE" else t for t in track] if isinstance(track, list) else track
    with pytest.raises(ConfigError) as e:  # refused where the config is built, or when the run checks it
        run(_cfg(tmp_path, track), progress=False)
    assert str(e.value).startswith(msg.format(file=f)) and "\n" not in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"] and f.read_text() == "keep"


def test_track_from_yaml_and_set_is_a_pair(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({"dataset": "digits", "track": ["mlflow", str(tmp_path / "m")]}))
    cfg = RunConfig.from_yaml(p).resolve()
    assert cfg.track == ("mlflow", str(tmp_path / "m"))
    assert yaml.safe_load(cfg.to_yaml())["track"] == ["mlflow", str(tmp_path / "m")]
    assert RunConfig.from_dict(yaml.safe_load(cfg.to_yaml())).resolve() == cfg  # config.yaml round-trips
    assert not (tmp_path / "m").exists()  # validation writes nothing


def test_cli_refuses_an_unknown_tracker_with_exit_2(tmp_path):
    r = CliRunner().invoke(
        app,
        [
            "run",
            "--dataset",
            "digits",
            "--clients",
            "2",
            "--rounds",
            "1",
            "--quiet",
            "--out",
            str(tmp_path / "run"),
            "--set",
            f"track=[wandb, {tmp_path / 'w'}]",
        ],
    )
    assert r.exit_code == 2 and "unknown tracker 'wandb'" in r.output and "Traceback" not in r.output
    assert list(tmp_path.iterdir()) == []


class Flaky(Tracker):
    """A backend that breaks at round 2 (a full disk, a locked store)."""

    def __init__(self, where):
        super().__init__(where)
        self.logged, self.closed = [], False

    def _start(self, cfg):
        self.logged.append("config")

    def _log_round(self, rnd, records, labels):
        if rnd == 2:
            raise OSError("No space left on device")
        self.logged.append(rnd)

    def _close(self):
        self.closed = True


def test_a_backend_that_fails_mid_run_stops_tracking_with_one_warning_and_the_run_goes_on(tmp_path, caplog):
    t = Flaky(tmp_path)
    t.start(None)
    for rnd in (1, 2, 3):
        t.log_round(rnd, [{"round": rnd, "client": 0, "epsilon": 1.0}], {})
    t.finish({})
    t.close()
    assert t.logged == ["config", 1] and t.closed and t.failed == "OSError: No space left on device"
    warnings = [r.getMessage() for r in caplog.records if "tracking" in r.getMessage()]
    assert warnings == [
        f"tracking to {tmp_path} stopped: OSError: No space left on device (the run goes on; its folder "
        "has every figure)"
    ]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_labels_cross_the_process_boundary_of_a_torch_distributed_run(tmp_path):
    """Site 1 runs in process 1: its figures come with their labels in its evaluation reply; process 0
    tracks."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.helpers import launch_tiny

    out, tb = tmp_path / "d", tmp_path / "tb"
    res = launch_tiny(out, "--set", f"track=[tensorboard, {tb}]")
    assert res.returncode == 0, res.stderr[-3000:]
    (logdir,) = tb.iterdir()
    ea = EventAccumulator(str(logdir))
    ea.Reload()
    labels = _by_figure(ea.Tags()["scalars"])
    assert set(labels) == set(_expected(out))
    assert labels["proxy_acc/client1"] == "dp" and labels["examples_seen/client1"] == "public"
    # across processes sites keep their non-private figures by default: none reached the tracker
    assert "nonprivate" not in labels.values() and "private_acc/client1" not in labels
