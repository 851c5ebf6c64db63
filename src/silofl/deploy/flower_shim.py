"""Flower 1.41's SuperNode without its idle sleeps while a run is on: the one place silofl reaches into
Flower.

Stock ``flower-supernode`` (``flwr/supernode/start_client_internal.py``) pulls one message at a time from the
SuperLink and, when a pull comes back empty, sleeps a literal 3 s; while a message is being worked on it
checks for the reply every 0.5 s. In a silofl round every site answers every step, so each step waited about 3
s for the last site to notice it. This module runs the same SuperNode (``python -m silofl.deploy.flower_shim
ARGS`` takes ``flower-supernode``'s arguments) with two module globals of that file replaced — nothing else:

- ``time``: a copy of the module whose ``sleep`` paces the loop: an empty pull waits :data:`ACTIVE_S` (0.1 s)
  while a run is on (a message was pulled within the last :data:`IDLE_AFTER_S`, or the SuperNode started
  within it) — until :data:`LEAD` of the shortest of the last intervals between two messages has passed
  since the last one, an empty pull waits that long (:class:`Pacer`) — then backs off by doubling up to
  Flower's 3 s when idle,
  so K idle sites do not flood the SuperLink; the reply check waits :data:`REPLY_S`;
- ``_pull_and_store_message``: the same function, which also rings the site's *doorbell* (a datagram on the
  Unix socket named by ``SILOFL_DOORBELL``, if set) after a message is stored, so the site's warm executor
  (:mod:`silofl.deploy.executor`) takes the task at once instead of polling for it.

And in every silofl process that talks to Flower (the SuperNode, the site's executor, the coordinator's
ServerApp), :func:`fast_pulls` lowers the backoff of Flower's object pulls — a message's content arrives just
after the message, and Flower's first retry waits 1 s, doubling to 10 s — to :data:`PULL_BACKOFF_S`.

Only flwr 1.41.0's loop is known; on any other version the SuperNode runs stock (with a warning), slower but
correct (the executor then finds tasks by polling).

The SuperNode process loads this file by its path (:func:`command`), not as ``silofl.deploy.flower_shim``:
importing the ``silofl`` package imports torch (about a second of CPU per site at start-up, on cores the
other sites' start-ups share), which a SuperNode never uses — so this module imports nothing of silofl at its
top."""

from __future__ import annotations

import os
import socket
import sys
import time
import types
import warnings

SUPPORTED = "1.41.0"
# an empty pull while a run is on waits this long (SILOFL_SUPERNODE_POLL_S): each pull costs the SuperLink and
# the SuperNode CPU, and on 2 cores with 8 sites 0.05 / 0.1 / 0.2 s gave 1.45 / 1.35 / 1.16 s a round
# (bench/deployment.py)
ACTIVE_S = float(os.environ.get("SILOFL_SUPERNODE_POLL_S", "0.1"))
IDLE_AFTER_S = 15.0  # no message for this long: back off towards Flower's 3 s
# an empty pull sleeps until LEAD × the shortest of the last PERIODS intervals between two messages has
# passed since the last one (each empty pull is a request the SuperLink serves; see bench/deployment.py); a
# step that comes sooner than that costs up to LEAD × that interval, once
LEAD = 0.75
PERIODS = 3
REPLY_S = 0.005  # the wait between two checks for the reply of the message in work (in-memory, cheap)
DOORBELL_ENV = "SILOFL_DOORBELL"
PULL_BACKOFF_S = (0.01, 1.0)  # first retry, cap (Flower: 1 s, 10 s; up to 500 tries per object either way)


def supported() -> bool:
    """Whether this is the Flower whose internals this module knows (MissingExtra without Flower)."""
    from silofl.core.extras import require

    flwr = require("flwr", "deploy")
    return bool(flwr.__version__ == SUPPORTED)


def command(python: str = sys.executable) -> list[str]:
    """The command line of a paced SuperNode, before ``flower-supernode``'s arguments: this file run by its
    path, so the process never imports the ``silofl`` package (and torch with it)."""
    run = "import runpy, sys; runpy.run_path(sys.argv.pop(1), run_name='__main__')"  # argv[0]: this file
    return [python, "-c", run, __file__]


def fast_pulls() -> bool:
    """Lower the retry backoff of Flower's object pulls in this process (see the module doc); whether it
    did."""
    import flwr

    if flwr.__version__ != SUPPORTED:
        return False
    from flwr.supercore.inflatable import inflatable_utils as iu

    for f in (iu.pull_objects, iu.pull_and_inflate_object_from_tree):
        kw = f.__kwdefaults__
        if not kw or "initial_backoff" not in kw or "backoff_cap" not in kw:
            return False
        kw["initial_backoff"], kw["backoff_cap"] = PULL_BACKOFF_S
    return True


class Pacer:
    """The sleeps of the SuperNode's loop, as a function of how recently a message came and of the intervals
    between the site's last messages (:data:`PERIODS` of them): while a run is on, an empty pull sleeps until
    :data:`LEAD` of the shortest of those intervals has passed since the last message, then pulls every
    :data:`ACTIVE_S` (each empty pull is a request the SuperLink serves). The interval between two messages
    is the step's, the same for every site (each step waits for the last reply), so the site that answers
    last — the one a step waits for — is not held back by the waits of the rounds when it was early."""

    def __init__(self, clock=time.monotonic, sleep=time.sleep):
        self.clock, self._sleep = clock, sleep
        # a SuperNode that just connected is about to be asked (a run is submitted once the sites are up):
        # it starts at the active pace, as if a message had just come
        self.last_message = clock()
        self.idle_s = ACTIVE_S
        self.periods: list[float] = []  # the last PERIODS intervals between two messages (none idle)
        self.had_message = False

    def pulled(self) -> None:
        """A message was pulled: the run is on."""
        now = self.clock()
        if self.had_message and now - self.last_message < IDLE_AFTER_S:
            self.periods = [*self.periods, now - self.last_message][-PERIODS:]
        self.had_message = True
        self.last_message = now
        self.idle_s = ACTIVE_S

    def delay(self, asked: float) -> float:
        """What to sleep where stock Flower sleeps ``asked`` seconds."""
        if asked < 1.0:  # the reply / object checks (0.5 s in flwr 1.41)
            return min(asked, REPLY_S)
        now = self.clock()
        if now - self.last_message < IDLE_AFTER_S:
            early = self.last_message + LEAD * min(self.periods, default=0.0) - now
            return min(asked, max(ACTIVE_S, early))
        self.idle_s = min(asked, self.idle_s * 2)
        return self.idle_s

    def sleep(self, asked: float) -> None:
        """Stand-in for ``time.sleep`` in the SuperNode's loop."""
        self._sleep(self.delay(asked))


def ring(path: str | None) -> None:
    """One datagram to the doorbell at ``path`` (nobody listening: nothing happens)."""
    if not path:
        return
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.setblocking(False)
            s.sendto(b"1", path)
    except OSError:
        pass


def patch(module: types.ModuleType, pacer: Pacer, doorbell: str | None) -> None:
    """Replace ``time`` and ``_pull_and_store_message`` in flwr 1.41's ``start_client_internal`` module."""
    clock = types.SimpleNamespace(**{n: getattr(time, n) for n in dir(time) if not n.startswith("_")})
    clock.sleep = pacer.sleep
    pull = module._pull_and_store_message

    def pull_and_ring(*args, **kwargs):
        run_id = pull(*args, **kwargs)
        if run_id is not None:
            pacer.pulled()
            ring(doorbell)
        return run_id

    module.time = clock
    module._pull_and_store_message = pull_and_ring


def main(argv: list[str] | None = None) -> None:
    """``flower-supernode ARGS``, paced (see the module doc)."""
    import flwr
    from flwr.supernode import start_client_internal as sci
    from flwr.supernode.cli import flower_supernode

    if flwr.__version__ == SUPPORTED and hasattr(sci, "_pull_and_store_message") and hasattr(sci, "time"):
        patch(sci, Pacer(), os.environ.get(DOORBELL_ENV))
        fast_pulls()
    else:
        warnings.warn(
            f"silofl paces Flower {SUPPORTED}'s SuperNode only; flwr {flwr.__version__} runs stock (a 3 s "
            "sleep when a pull is empty)",
            stacklevel=1,
        )
    sys.argv = ["flower-supernode", *(sys.argv[1:] if argv is None else argv)]
    flower_supernode()


if __name__ == "__main__":
    main()
