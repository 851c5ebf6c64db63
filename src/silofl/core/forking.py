"""Worker processes forked from one fork server that imported what they need once.

A silofl worker process — a deployed site's worker, a process of ``silofl launch`` — spends seconds of CPU
importing torch, the run loop, Opacus and torch's dynamo (which torch.optim imports at the first optimizer)
before its first step. A command that starts several of them on one machine (``deploy local``, ``silofl
launch``) starts a :mod:`multiprocessing` fork server instead, which imports a *preload* module once, and
forks each worker from it: the workers share those pages and skip the imports. What a worker runs is an
:class:`Entry` — a function named by module and name, with plain-JSON keyword arguments — never a command
line. Importing starts no thread
and opens no connection, so forking after it is as safe as torch's own DataLoader workers, which fork after
importing torch. ``SILOFL_FORK_WORKERS=0`` starts each worker as its own interpreter instead, as before.

:class:`ForkedPopen` gives a forked worker the part of :class:`subprocess.Popen`'s interface that the
launchers use (``pid``, ``poll``, ``wait``, ``returncode``, ``send_signal``, ``kill``): exit codes follow
Popen's convention (negative: killed by that signal). :class:`ForkedChild` gives the same interface to a child
forked directly from a single-threaded process that has already imported what the child runs (a forked
site's worker starting its SuperNode).
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

FORK_ENV = "SILOFL_FORK_WORKERS"


def forking() -> bool:
    """Whether workers are forked from a preloaded fork server (else: one interpreter each)."""
    return os.environ.get(FORK_ENV, "1") != "0"


def fork_server(preload: str) -> Any:
    """The fork-server context, its server started now (importing the module ``preload``) if it is not
    running yet. A process has one fork server: its first preload is the one it keeps."""
    import multiprocessing
    from multiprocessing import forkserver

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([preload])
    forkserver.ensure_running()
    return ctx


class _Signals:
    """Popen's ``send_signal`` and ``kill`` for a forked process with ``pid`` and ``poll``."""

    pid: int

    def poll(self) -> int | None:
        """Its exit code if it has ended, else None."""
        raise NotImplementedError

    def send_signal(self, sig: int) -> None:
        """Send it ``sig`` (nothing if it has ended)."""
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """SIGKILL."""
        self.send_signal(signal.SIGKILL)


class ForkedPopen(_Signals):
    """A worker forked from the fork server of ``preload``, running ``target(*args)``; Popen-like."""

    def __init__(self, preload: str, target: Callable[..., Any], args: tuple, name: str = "silofl-worker"):
        self.proc = fork_server(preload).Process(target=target, args=args, name=name, daemon=True)
        self.proc.start()
        self.pid: int = self.proc.pid
        self.args = [name]

    @property
    def returncode(self) -> int | None:
        """Its exit code, None while it runs (negative: killed by that signal)."""
        return self.proc.exitcode

    def poll(self) -> int | None:
        """Its exit code if it has ended, else None."""
        return self.proc.exitcode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for it to end (TimeoutExpired after ``timeout`` seconds); its exit code."""
        self.proc.join(timeout)
        if self.proc.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.proc.exitcode


class ForkedChild(_Signals):
    """``target(*args)`` in a child forked from this process now (:func:`os.fork`); Popen-like, as
    :class:`ForkedPopen`. Only from a single-threaded process (RuntimeError otherwise): a lock another thread
    holds at the fork would stay held in the child. The child ends with ``target``'s exit status, without
    the interpreter's teardown."""

    def __init__(self, target: Callable[..., Any], args: tuple, name: str = "silofl-child"):
        if threading.active_count() != 1:
            raise RuntimeError("a child is forked only from a single-threaded process")
        self.args: list[str] = [name]
        self.returncode: int | None = None
        self.pid = os.fork()
        if self.pid == 0:  # the child
            code = 1
            try:
                target(*args)
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else int(e.code is not None)
            except BaseException:  # noqa: BLE001 - reported in the child's output, then its exit status
                traceback.print_exc()
            finally:
                for f in (sys.stdout, sys.stderr):
                    try:
                        f.flush()
                    except Exception:  # noqa: BLE001, S110 - nothing to flush into
                        pass
                os._exit(code)

    def poll(self) -> int | None:
        """Its exit code if it has ended, else None."""
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for it to end (TimeoutExpired after ``timeout`` seconds); its exit code."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            time.sleep(0.02)
        return code


def detach(env: dict[str, str] | None, log_path: str | None) -> None:
    """A forked worker's start, as a started command's: its own session and output to ``log_path`` (appended),
    ``env`` as its environment (each unless None)."""
    if log_path is not None:
        os.setsid()
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    if env is not None:
        os.environ.clear()
        os.environ.update(env)


@dataclass(frozen=True)
class Entry:
    """A process's entry point as data: the function ``target`` (``"package.module:function"``) called
    with the keyword arguments ``kwargs`` (plain JSON: a run's ``RunConfig.to_dict()``, an engine-options
    dict, paths as strings). A launcher passes it to a forked or started process as JSON, never as a command
    line to re-parse: a renamed CLI flag cannot break a launched worker, and this module imports nothing of
    silofl's above it (the target is imported by name in the worker)."""

    target: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        module, colon, function = self.target.partition(":")
        if not colon or not module or not function.isidentifier():
            raise ValueError(f"an entry's target is 'package.module:function', got {self.target!r}")
        if json.loads(json.dumps(self.kwargs)) != self.kwargs:  # TypeError for what JSON cannot hold
            raise ValueError(f"{self.target}: its arguments are not plain JSON (tuples, non-string keys?)")

    def to_json(self) -> str:
        """The entry as one JSON object (``target``, ``kwargs``)."""
        return json.dumps({"target": self.target, "kwargs": self.kwargs})

    @classmethod
    def from_json(cls, text: str) -> Entry:
        """The entry :meth:`to_json` wrote."""
        d = json.loads(text)
        if not isinstance(d, dict) or set(d) != {"target", "kwargs"} or not isinstance(d["kwargs"], dict):
            raise ValueError("an entry is a JSON object with 'target' and 'kwargs'")
        return cls(str(d["target"]), d["kwargs"])

    def call(self) -> Any:
        """Import the target's module and call the function with the arguments."""
        module, _, function = self.target.partition(":")
        return getattr(importlib.import_module(module), function)(**self.kwargs)

    def command(self) -> list[str]:
        """The process that runs this entry as its own interpreter (``SILOFL_FORK_WORKERS=0``, torchrun's
        own workers): ``python -m silofl.core.forking ENTRY_JSON``."""
        return [sys.executable, "-m", __name__, self.to_json()]


def run_entry(entry: str, env: dict[str, str] | None = None, log_path: str | None = None) -> None:
    """A forked worker's body: ``env`` as its environment, its output to ``log_path`` (in its own session, as
    a command started with ``start_new_session`` is), then the :class:`Entry` whose JSON is ``entry``. A clean
    :class:`SystemExit` (0) returns; another propagates (the worker's exit status)."""
    detach(env, log_path)
    try:
        Entry.from_json(entry).call()
    except SystemExit as e:
        if e.code not in (0, None):
            raise


if __name__ == "__main__":  # Entry.command(): one worker as its own interpreter
    run_entry(sys.argv[1])
