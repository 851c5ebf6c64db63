"""Every command of the README's tables, predict/export and PubSub-ML (broker) sections runs as written, read
from the docs pages they moved to (docs/howto/, tests/readme.py), with the files it names generated for the
test in its working folder; the between-institutions section runs in
tests/deploy/test_readme_site_commands.py. A command added to these sections without a way to run it fails
test_every_readme_command_has_a_runner at once. A command runs with its argv as written through the
command-line app in the test's process (typer's CliRunner); one that serves (`pubsub serve`) runs as a process
of its own."""

from __future__ import annotations

import csv
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests import readme
from tests.helpers import silofl_here

# (file, title): the sections moved from the README into the docs site's how-tos (issue 27)
TABLES, PREDICT, PUBSUB, DEPLOY = readme.TABLES, readme.PREDICT, readme.PUBSUB, readme.DEPLOY

# how each command is run: "run" (to completion, exit 0), "serve" (started in the background, stopped at the
# end), "each site" (run once per site of the example, the site's name put in), "site-serve" (both)
RUNNERS = {
    ("pubsub", "serve"): "serve",
    ("deploy", "superlink"): "serve",
    ("site", "run"): "site-serve",
    ("site", "init"): "each site",
    ("pubsub", "enroll"): "each site",
    ("pubsub", "register"): "each site",
    ("pubsub", "publish"): "run",
    ("pubsub", "subscribe"): "run",
    ("pubsub", "list"): "run",
    ("pubsub", "customize"): "run",
    ("pubsub", "stream"): "run",
    ("pubsub", "cert"): "run",
    ("run",): "run",
    ("predict",): "run",
    ("export",): "run",
    ("deploy", "certs"): "run",
    ("site", "pin"): "each site",
    ("deploy", "register"): "run",
    ("deploy", "start"): "run",
    ("deploy", "local"): "run",
}

# the one kind of change a test makes to a README command: options appended (the CLI takes an option's last
# value) where the command as written runs for minutes; nothing is removed or replaced
APPENDED = {  # the start of a command's arguments → what is appended
    ("run", "--method", "fedavg", "--dataset", "folder"): [
        "--rounds",
        "10",
    ],  # the default 300 rounds: ~3 minutes
}


def appended(args: list[str]) -> list[str]:
    """``args`` with the options APPENDED to its command, if any."""
    for prefix, extra in APPENDED.items():
        if tuple(args[: len(prefix)]) == prefix:
            return [*args, *extra]
    return args


# the between-institutions section: every command run as written by tests/deploy/test_readme_site_commands.py
# (its variable COORD set to localhost; `deploy start` with --rounds 2 appended), in the order it knows
DEPLOY_AS_WRITTEN = {
    ("deploy", "certs"),
    ("deploy", "superlink"),
    ("site", "init"),
    ("site", "pin"),
    ("deploy", "register"),
    ("site", "run"),
    ("deploy", "start"),
    ("deploy", "local"),
}
# the shell variables a section may set, and the test that sets them for this machine
VARIABLES = {DEPLOY: {"COORD"}, PUBSUB: {"BROKER"}}


def runner(command: str) -> str:
    args = shlex.split(command)[1:]  # the command's name (variables not expanded)
    for n in (2, 1):
        if tuple(args[:n]) in RUNNERS:
            return RUNNERS[tuple(args[:n])]
    raise KeyError(
        f"no runner for the README command {command!r}: add one to tests/cli/test_readme_commands.py"
    )


def test_every_readme_command_has_a_runner():
    """Fast: the covered sections exist, hold commands, and each command is one these tests know how to
    run."""
    for title in (TABLES, PREDICT, PUBSUB, DEPLOY):
        cmds = readme.commands(title)
        assert cmds, title
        for c in cmds:
            assert c.startswith("silofl "), c
            runner(c)
    ours = ("tests/cli/test_readme_commands.py", "tests/deploy/test_readme_site_commands.py")
    assert {w for w, t in readme.SECTIONS.items() if t.startswith(ours)} == {TABLES, PREDICT, PUBSUB, DEPLOY}
    every = [shlex.split(c)[1:] for t in (TABLES, PREDICT, PUBSUB, DEPLOY) for c in readme.commands(t)]
    for c in readme.commands(DEPLOY):
        assert tuple(shlex.split(c)[1:3]) in DEPLOY_AS_WRITTEN, c
    for title in (
        TABLES,
        PREDICT,
        PUBSUB,
        DEPLOY,
    ):  # a variable no test sets would leave a command unexpanded
        assert set(readme.variables(title)) == VARIABLES.get(title, set()), title
    for prefix in APPENDED:  # an override names a command the README has, and only appends
        assert any(tuple(a[: len(prefix)]) == prefix for a in every), prefix


def test_the_extraction_joins_continued_lines_and_drops_comments():
    text = (
        "## S\n\n```bash\n.venv/bin/silofl run --a 1 \\\n  --b 'x|y'   # a comment\n# only a comment\n"
        "silofl list\n```\n\n## T\n```bash\nsilofl other\n```\n"
    )
    assert readme.commands("S", text) == ["silofl run --a 1 --b 'x|y'", "silofl list"]
    assert readme.argv("silofl x --broker https://broker.example.org:8443 --port 8443") == [
        "x",
        "--broker",
        "https://broker.example.org:8443",
        "--port",
        "8443",
    ]  # as written
    text = (
        '## V\n\n```bash\nCOORD=coord.example.org   # a host\nsilofl a --superlink "$COORD:9092" --host '
        "${COORD}\n```\n"
    )
    assert readme.variables("V", text) == {"COORD": "coord.example.org"}
    (c,) = readme.commands("V", text)
    assert readme.argv(c, env={"COORD": "localhost"}) == [
        "a",
        "--superlink",
        "localhost:9092",
        "--host",
        "localhost",
    ]
    with pytest.raises(KeyError):
        readme.argv(c)  # a variable the test does not set


ENV = {**os.environ, "SILOFL_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1", "COLUMNS": "200"}


def silofl(args: list[str], cwd: Path, env: dict) -> None:
    """``silofl ARGS`` run to completion (exit 0, no traceback) in ``cwd`` with ``env``, in this process
    (tests.helpers.silofl_here)."""
    r = silofl_here(args, cwd, env)
    assert r.returncode == 0 and "Traceback" not in r.stderr, (
        f"silofl {' '.join(args)} → {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    )


def _images(root: Path, rng: np.random.Generator, per_class: int = 6) -> None:
    """A small image folder ROOT/<class>/*.png (scikit-learn's digits 0-2, 8×8 grey)."""
    from PIL import Image
    from sklearn.datasets import load_digits

    d = load_digits()
    for c in (0, 1, 2):
        (root / str(c)).mkdir(parents=True)
        idx = rng.choice(np.flatnonzero(d.target == c), per_class, replace=False)
        for i in idx:
            Image.fromarray((d.images[i] * 16).astype(np.uint8)).save(root / str(c) / f"{i}.png")


@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_readme_tables_and_predict_export_commands_as_written(tmp_path):
    """The tables section (the penguin run on its three files, an image-folder run, a publish) and then the
    predict/export section on the runs it made — in one working folder, in the README's order."""
    from studies.tabular import write_sites

    write_sites(tmp_path)  # schema.yaml, biscoe.csv, dream.csv, torgersen.parquet: the files the README names
    shutil.copy(tmp_path / "dream.csv", tmp_path / "new_rows.csv")
    rng = np.random.default_rng(0)
    for name in ("hospA", "hospB", "new_images"):
        _images(tmp_path / name, rng)
    env = {**ENV, "SILOFL_HOME": str(tmp_path / "home")}
    done = []
    for title in (TABLES, PREDICT):
        for c in readme.commands(title):
            assert runner(c) == "run"
            t0 = time.perf_counter()
            silofl(appended(readme.argv(c)), tmp_path, env)
            done.append((c, round(time.perf_counter() - t0, 1)))
    print(done)
    s = json.loads((tmp_path / "runs" / "penguins" / "summary.json").read_text())
    assert s["rounds_run"] == 60 and len(s["final"]["per_client"]) == 3
    assert (tmp_path / "export" / "dream" / "model.onnx").is_file()
    rows = list(csv.DictReader(open(tmp_path / "preds.csv")))
    assert rows and "prediction" in rows[0]


def _breast_cancer_files(cwd: Path) -> None:
    """a.csv/b.csv (publishers, their own feature groups), s.csv (the subscriber), a_stream.csv, a.yaml/b.yaml
    (their schemas: the features' public bounds and the diagnosis labels)."""
    from sklearn.datasets import load_breast_cancer

    d = load_breast_cancer()
    names = [n.replace(" ", "_") for n in d.feature_names]
    parts = np.array_split(np.random.default_rng(0).permutation(len(d.data)), 4)
    groups = {
        "a": range(0, 15),
        "b": range(10, 30),
        "s": [*range(0, 5), *range(20, 25)],
        "a_stream": range(0, 15),
    }
    for (name, cols), rows in zip(groups.items(), parts, strict=True):
        with open(cwd / f"{name}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow([names[c] for c in cols] + ["diagnosis"])
            for r in rows:
                w.writerow([*d.data[r, list(cols)], ["malignant", "benign"][d.target[r]]])
    for name in ("a", "b"):
        feats = {
            names[c]: {"type": "numeric", "bounds": [0.0, float(np.ceil(d.data[:, c].max() * 1.5))]}
            for c in groups[name]
        }
        (cwd / f"{name}.yaml").write_text(
            json.dumps(
                {"target": {"name": "diagnosis", "levels": ["benign", "malignant"]}, "features": feats}
            )
        )


BROKER_PORT = 8443  # the README's, as written


def _listening(port: int) -> bool:
    """Whether something accepts connections on localhost:``port`` (the broker, once it serves)."""
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _port_is_free(port: int) -> None:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            pytest.fail(f"port {port}, the README's broker port, is busy on this machine")


@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_readme_pubsub_commands_as_written(tmp_path):
    """The PubSub-ML section: the folder broker's commands, then the service's (a test CA, `pubsub serve` in
    the background, enroll and register each site the commands name — a and s — publish, subscribe, customize,
    list). The README names the broker's host `$BROKER` (set on every machine); here every machine is this
    one: localhost."""
    _breast_cancer_files(tmp_path)
    env = {**ENV, "SILOFL_HOME": str(tmp_path / "home")}
    cmds = readme.commands(PUBSUB)
    service_at = next(i for i, c in enumerate(cmds) if c.startswith("silofl pubsub cert"))
    for c in cmds[:service_at]:  # the folder broker
        assert runner(c) == "run"
        silofl(appended(readme.argv(c)), tmp_path, env)
    rep = json.loads((tmp_path / "runs" / "cust" / "customization.json").read_text())
    assert len(rep["selected"]) == 2
    shutil.rmtree(
        tmp_path / "runs"
    )  # the service's publishers and subscriber start afresh, in their own home
    env = {**ENV, "SILOFL_HOME": str(tmp_path / "home2")}
    _port_is_free(BROKER_PORT)
    variables = {"BROKER": "localhost"}
    assert readme.variables(PUBSUB).keys() == variables.keys()
    named = [readme.argv(c, env=variables) for c in cmds[service_at:]]
    sites = sorted({a[a.index("--site") + 1] for a in named if "--site" in a})
    assert sites == ["a", "s"]
    procs = []
    try:
        for c in cmds[service_at:]:
            args, kind = readme.argv(c, env=variables), runner(c)
            if kind == "serve":
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "silofl.cli.main", *args],
                        cwd=tmp_path,
                        env=env,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )
                deadline = time.monotonic() + 120
                while not (tmp_path / "broker-state" / "admin.json").is_file() or not _listening(BROKER_PORT):
                    assert procs[-1].poll() is None and time.monotonic() < deadline
                    time.sleep(0.2)
            elif kind == "each site":  # once per site (the README shows site a)
                for site in sites:
                    silofl(
                        [
                            a.replace("a.request.json", f"{site}.request.json").replace(
                                "creds/a/", f"creds/{site}/"
                            )
                            if a != "a"
                            else site
                            for a in args
                        ],
                        tmp_path,
                        env,
                    )
            else:
                silofl(args, tmp_path, env)
        assert json.loads((tmp_path / "runs" / "cust" / "customization.json").read_text())["models_fetched"]
    finally:
        for p in procs:
            os.killpg(p.pid, 15)
            p.wait(30)
