"""Workers forked from a preloaded fork server (silofl.core.forking) behave as the processes they replace:
Popen's exit codes (negative: the signal), their own environment, their output in their log, their own
session."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from silofl.core.forking import Entry, ForkedPopen, forking, run_entry


def _sleep() -> None:
    time.sleep(60)


GIVEN = {"run": {"method": "fedavg", "rounds": 2, "lr": 0.01}, "engine": {"peer_timeout_s": 60.0}}


def test_an_entry_is_data_not_a_command_line():
    entry = Entry("silofl.runner.entry:run_rank", {"config": {"method": "fedavg"}, "engine": {"quiet": True}})
    assert Entry.from_json(entry.to_json()) == entry
    assert json.loads(entry.to_json()) == {"target": entry.target, "kwargs": entry.kwargs}
    assert entry.command()[1:3] == ["-m", "silofl.core.forking"]  # one JSON argument, no flags
    with pytest.raises(ValueError):
        Entry("silofl.cli.main app", {})  # not module:function
    with pytest.raises((ValueError, TypeError)):
        Entry("m:f", {"shape": (1, 2)})  # a tuple would come back a list: not plain JSON
    with pytest.raises(ValueError):
        Entry.from_json('["run", "--rounds", "2"]')


def test_an_entry_runs_in_its_own_interpreter_too(tmp_path):
    entry = Entry("tests.core.forked_target:record", {"path": str(tmp_path / "got.json"), **GIVEN})
    r = subprocess.run(
        entry.command(), capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[2]
    )
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads((tmp_path / "got.json").read_text())
    assert {k: got[k] for k in GIVEN} == GIVEN and not got["cli"]


@pytest.mark.slow  # starts a fork server (a fresh interpreter importing the preload) and forks three workers
def test_a_forked_worker_keeps_popens_contract(tmp_path):
    log = tmp_path / "w.log"
    log.touch()
    env = {**os.environ, "COLUMNS": "60", "SILOFL_NO_PROGRESS": "1"}
    entry = Entry("tests.core.forked_target:record", {"path": str(tmp_path / "got.json"), **GIVEN})
    p = ForkedPopen("json", run_entry, (entry.to_json(), env, str(log)), "entry")
    assert p.wait(60) == 0 and p.returncode == 0 and p.poll() == 0
    assert "recorded" in log.read_text()  # its output went to its log
    got = json.loads((tmp_path / "got.json").read_text())
    assert {k: got[k] for k in GIVEN} == GIVEN and not got["cli"]  # the data as given, no command line parsed
    bad = ForkedPopen(
        "json",
        run_entry,
        (Entry("tests.core.forked_target:leave", {"code": 2}).to_json(), env, str(log)),
        "bad",
    )
    assert bad.wait(60) == 2
    hung = ForkedPopen("json", _sleep, (), "hung")
    with pytest.raises(subprocess.TimeoutExpired):
        hung.wait(0.2)
    assert hung.poll() is None
    hung.send_signal(signal.SIGTERM)
    assert hung.wait(60) == -signal.SIGTERM  # Popen's convention: killed by that signal
    hung.kill()  # ended already: nothing happens


def test_workers_fork_unless_turned_off(monkeypatch):
    monkeypatch.delenv("SILOFL_FORK_WORKERS", raising=False)
    assert forking()
    monkeypatch.setenv("SILOFL_FORK_WORKERS", "0")
    assert not forking()


CHILD = textwrap.dedent(
    """
    import signal, subprocess, sys, threading, time
    from silofl.core.forking import ForkedChild

    def speak():
        print("from the child", flush=True)

    def leave():
        sys.exit(3)

    def fail():
        raise ValueError("in the child")

    assert ForkedChild(speak, ()).wait(10) == 0
    assert ForkedChild(leave, ()).wait(10) == 3
    assert ForkedChild(fail, ()).wait(10) == 1  # its traceback in its output, then status 1
    hung = ForkedChild(time.sleep, (60,))
    try:
        hung.wait(0.2)
        raise AssertionError("wait returned before the child ended")
    except subprocess.TimeoutExpired:
        pass
    assert hung.poll() is None
    hung.send_signal(signal.SIGTERM)
    assert hung.wait(10) == -signal.SIGTERM and hung.returncode == -signal.SIGTERM
    hung.kill()  # ended already: nothing happens
    threading.Thread(target=time.sleep, args=(2,), daemon=True).start()
    try:
        ForkedChild(speak, ())
        raise AssertionError("forked from a process with two threads")
    except RuntimeError:
        pass
    print("parent done")
    """
)


def test_a_child_forked_from_a_single_threaded_process_keeps_popens_contract():
    # in a fresh interpreter: a pytest-xdist worker has threads of its own, so this one may not fork
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == ["from the child", "parent done"]
    assert "ValueError: in the child" in r.stderr
