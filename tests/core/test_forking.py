"""Workers forked from a preloaded fork server (silofl.core.forking) behave as the processes they replace:
Popen's exit codes (negative: the signal), their own environment, their output in their log, their own
session."""

import os
import signal
import subprocess
import time

import pytest

from silofl.core.forking import ForkedPopen, forking, run_cli


def _sleep() -> None:
    time.sleep(60)


@pytest.mark.slow  # starts a fork server (a fresh interpreter importing the preload) and forks three workers
def test_a_forked_worker_keeps_popens_contract(tmp_path):
    log = tmp_path / "w.log"
    log.touch()
    env = {**os.environ, "COLUMNS": "60", "SILOFL_NO_PROGRESS": "1"}
    p = ForkedPopen("json", run_cli, (["--help"], env, str(log)), "help")
    assert p.wait(60) == 0 and p.returncode == 0 and p.poll() == 0
    text = log.read_text()  # its output went to its log, under its own environment (the width)
    assert "Usage" in text and max(len(line) for line in text.splitlines()) <= 60
    bad = ForkedPopen("json", run_cli, (["run", "--rounds", "x"], env, str(log)), "bad")
    assert bad.wait(60) == 2 and "Traceback" not in log.read_text()  # the CLI's one-line error, code 2
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
