"""The engines a run can take, by name: :data:`ENGINES` (entry-point group ``silofl.engines``).

An engine carries a method's calls to its sites (:mod:`silofl.comm.engine`); what differs between engines is
where the sites run and how a run on them is started. An entry is an :class:`EngineEntry`: plain data that
names its code by ``"package.module:attribute"`` references, resolved only when used (the Flower engine needs
``flwr`` and lives a layer above this one), so listing the engines imports none of them::

    ENGINES.register("myengine", EngineEntry(engine="mypkg.engine:MyEngine", start="mypkg.run:start",
                                             call=("progress",), launched_by="this process",
                                             processes="one", description="…"))

Built-ins: ``simulator`` (every site an object in this process), ``torch.distributed`` (one process per rank,
started by ``silofl launch``), ``flower-local`` (a SuperLink and one process per site on this machine,
``silofl deploy local``) and ``flower`` (sites at other institutions, ``silofl deploy start``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from silofl.core.registry import Registry, load_ref


@dataclass(frozen=True)
class EngineEntry:
    """An engine and how a run is started on it.

    * ``engine``: ``"module:Class"`` of the :class:`~silofl.comm.engine.Engine` that carries the calls;
    * ``start``: ``"module:function"`` that runs a resolved :class:`~silofl.runner.config.RunConfig` on it and
      returns the run's summary, called as ``start(cfg, **{k: v for k in call})``;
    * ``call``: the keyword arguments ``start`` takes besides the config (a test checks they are its
      parameters);
    * ``launched_by``: what starts its processes (``this process``, ``silofl launch``, …);
    * ``processes``: ``one``, ``one per rank`` or ``one per site``;
    * ``data_at_sites``: each site reads its own data (its site folder); the coordinator reads none;
    * ``extra``: the pip extra it needs (``silofl[deploy]``), None for none;
    * ``selectable``: a run can be given it by name (torch.distributed is started by ``silofl launch``
    instead);
    * ``vs_alone``: ``--vs-alone``'s going-alone baseline can train in the process that ran it.
    """

    engine: str
    start: str
    call: tuple[str, ...]
    launched_by: str
    processes: str
    data_at_sites: bool = False
    extra: str | None = None
    description: str = ""
    selectable: bool = (
        True  # chosen by ``--engine`` / ``silofl.run(engine=…)`` (torch.distributed: by silofl launch)
    )
    vs_alone: bool = False  # --vs-alone's baseline trains in this process after the run

    def engine_class(self) -> type:
        """The engine's class (imported now)."""
        cls: type = load_ref(self.engine)
        return cls

    def starter(self) -> Callable[..., Any]:
        """The function that starts a run on this engine (imported now)."""
        fn: Callable[..., Any] = load_ref(self.start)
        return fn

    def check(self) -> None:
        """Raise ValueError unless both references resolve and ``start`` takes every keyword of ``call``."""
        self.engine_class()
        params = inspect.signature(self.starter()).parameters
        missing = [k for k in self.call if k not in params]
        if missing:
            raise ValueError(f"{self.start} takes no {', '.join(missing)}")


ENGINES: Registry[EngineEntry] = Registry("engine", "silofl.engines")

ENGINES.register(
    "simulator",
    EngineEntry(
        engine="silofl.comm.engine:InProcessEngine",
        start="silofl.api:start_simulator",
        call=("resume", "overwrite", "progress", "console", "opts"),
        launched_by="this process",
        processes="one",
        vs_alone=True,
        description="every site an object in this process: messages are real wire bytes, calls are method "
        "calls",
    ),
)
ENGINES.register(
    "torch.distributed",
    EngineEntry(
        engine="silofl.comm.torchdist:TorchDistEngine",
        start="silofl.api:start_torch_distributed",
        call=("resume", "overwrite", "progress", "console", "opts"),
        selectable=False,
        vs_alone=True,
        launched_by="silofl launch (torchrun; each process runs silofl.runner.entry.run_rank)",
        processes="one per rank",
        description="one process per rank over torch.distributed (gloo), frames authenticated by the run's "
        "key",
    ),
)
ENGINES.register(
    "flower-local",
    EngineEntry(
        engine="silofl.deploy.coordinator:FlowerEngine",
        start="silofl.api:start_flower_local",
        call=("resume", "overwrite", "progress", "console", "opts"),
        launched_by="silofl deploy local",
        processes="one per site",
        extra="deploy",
        description="a Flower SuperLink and a SuperNode process per site on this machine (TLS, node auth)",
    ),
)
ENGINES.register(
    "flower",
    EngineEntry(
        engine="silofl.deploy.coordinator:FlowerEngine",
        start="silofl.api:start_flower",
        call=("resume", "overwrite", "progress", "console", "opts"),
        launched_by="silofl deploy start",
        processes="one per site",
        data_at_sites=True,
        extra="deploy",
        description="sites at other institutions, each reading its own data and keeping its own ledger",
    ),
)


def engines() -> tuple[str, ...]:
    """Every registered engine's name, built-ins first."""
    return ENGINES.names()


def selectable_engines() -> tuple[str, ...]:
    """The engines a run can be given by name (``--engine``; the CLI's choices)."""
    return tuple(n for n, e in ENGINES.entries().items() if e.obj.selectable)


def engine_entry(name: str) -> EngineEntry:
    """The entry of engine ``name``; a one-line ConfigError naming the choices if there is none."""
    return ENGINES.get(name)
