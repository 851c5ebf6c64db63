"""How many torch threads a process runs: chosen for the machine as it is, not as it would be if quiet.

torch's own choice is one OpenMP thread per core, and its threads wait for each other by spinning. On a
machine where anything else runs — a hospital's server always has something else running, and a
simulation or a ``silofl compare`` runs several processes — the spinning threads take the cores from the
ones doing the work, and a round collapses (PERF_NOTES: 19–28 s against 2.2 s with one thread; measured
again by ``bench/threads.py``, which runs the same seeded round as the machine is and beside two busy
processes). One thread per process does not collapse: it loses at most its fair share of the cores.

So the default is **one thread per process**. It has a second property that a load-dependent choice
lacks: a seeded run computes the same bits whatever the machine's core count or load (reductions are
split per thread, so results change in the last bits with the thread count). ``--threads N`` overrides it
— on a dedicated, quiet machine N = the number of cores is faster; beside other work
``OMP_WAIT_POLICY=PASSIVE`` in the environment (read once, when torch loads OpenMP) keeps N > 1 from
collapsing. The choice and its reason are recorded in the run's summary (``threads``, ``threads_chosen``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_THREADS = 1
WAIT_POLICY_ENV = "OMP_WAIT_POLICY"


@dataclass(frozen=True)
class ThreadChoice:
    """The threads one process runs and why."""

    threads: int
    asked: bool  # True: the user's ``--threads``; False: silofl's default
    reason: str

    def describe(self) -> dict:
        """What a run's summary records about the choice."""
        return {
            "threads": self.threads,
            "asked": self.asked,
            "reason": self.reason,
            "wait_policy": os.environ.get(WAIT_POLICY_ENV, "libgomp's default (spin, then sleep)"),
            "cores": cores(),
        }


def cores() -> int:
    """The cores this process may run on (its CPU affinity, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - platforms without affinity
        return os.cpu_count() or 1


def choose(requested: int | None) -> ThreadChoice:
    """The user's ``requested`` threads, else one thread per process (see the module doc)."""
    if requested is not None:
        return ThreadChoice(int(requested), True, f"--threads {int(requested)}")
    return ThreadChoice(
        DEFAULT_THREADS,
        False,
        f"one thread per process (silofl's default on {cores()} cores: it does not collapse when other "
        "work shares the cores, and seeded results do not depend on them; --threads N overrides)",
    )


def apply(requested: int | None) -> ThreadChoice:
    """Choose (:func:`choose`) and set this process's torch threads; the choice."""
    import torch

    choice = choose(requested)
    if torch.get_num_threads() != choice.threads:
        torch.set_num_threads(choice.threads)
    return choice
