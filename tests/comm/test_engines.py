"""The engines' registry (silofl.comm.engines): names, what each entry says, and that its references hold."""

from __future__ import annotations

import pytest

from silofl.comm.engine import Engine, InProcessEngine
from silofl.comm.engines import ENGINES, EngineEntry, engine_entry, engines
from silofl.core.errors import ConfigError


def test_builtins_and_their_shape():
    assert engines() == ("simulator", "torch.distributed", "flower-local", "flower")
    sim = engine_entry("simulator")
    assert sim.engine_class() is InProcessEngine and sim.processes == "one" and not sim.data_at_sites
    assert engine_entry("flower").data_at_sites and engine_entry("flower-local").extra == "deploy"
    with pytest.raises(ConfigError) as e:
        engine_entry("ray")
    choices = "simulator, torch.distributed, flower-local, flower"
    assert str(e.value) == f"unknown engine 'ray'; choose one of: {choices}"


def test_an_entry_whose_start_lacks_a_keyword_is_caught():
    bad = EngineEntry(
        engine="silofl.comm.engine:InProcessEngine",
        start="silofl.core.registry:load_ref",
        call=("progress",),
        launched_by="this process",
        processes="one",
    )
    with pytest.raises(ValueError, match="takes no progress"):
        bad.check()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["simulator", "torch.distributed", "flower-local", "flower"])
def test_every_entry_resolves_and_its_start_takes_its_keywords(name):
    """Imports each engine and its starter (Flower's needs flwr): the references and keywords are real."""
    entry = engine_entry(name)
    entry.check()
    assert issubclass(entry.engine_class(), Engine) and name in ENGINES
