"""Workers forked from a preloaded fork server (silofl.core.forking) behave as the processes they replace:
Popen's exit codes (negative: the signal), their own environment, their output in their log, their own
session."""

import os
import signal
import subprocess
import sys
import textwrap
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
