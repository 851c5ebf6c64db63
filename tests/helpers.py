"""Helpers shared by the tests: a run's parts built in one process, without writing a run folder."""

from __future__ import annotations

from dataclasses import dataclass

from silofl.comm.engine import InProcessEngine
from silofl.data import SplitData
from silofl.fl.coordinator import Coordinator
from silofl.run.config import RunConfig
from silofl.run.loop import build


@dataclass
class Built:
    cfg: RunConfig
    split: SplitData
    coordinator: Coordinator
    engine: InProcessEngine

    @property
    def sites(self) -> list:
        return [self.engine.sites[k] for k in sorted(self.engine.sites)]

    @property
    def test(self):
        return self.split.test


def build_run(cfg: RunConfig) -> Built:
    """Resolve ``cfg``, split its data and connect its coordinator to in-process sites."""
    return Built(*build(cfg))


def spy_packets(engine: InProcessEngine) -> list[tuple[int, int, bytes]]:
    """Record every packet sites send (in their replies) and every packet delivered to them, as
    ``(src, dst, data)``, in order."""
    seen: list[tuple[int, int, bytes]] = []
    real = engine.call

    def call(step, requests):
        replies = real(step, requests)
        if step == "batch":  # its parts came through this call one by one (InProcessEngine.call)
            return replies
        for r in replies.values():
            seen.extend((p.src, p.dst, p.data) for p in r.packets)
        return replies

    engine.call = call  # type: ignore[method-assign]
    return seen


# a two-process ProxyFL run on digits, one round: what tests of torch.distributed runs launch
TINY_LAUNCH = (
    "launch --nproc-per-node 2 --method proxyfl --dataset digits --clients 2 --rounds 1 "
    "--samples-per-client 100 --batch-size 25 --delta 1e-3 --test-limit 100 --threads 1 --quiet"
).split()


def launch_tiny(out, *extra: str):
    """Run :data:`TINY_LAUNCH` into ``out`` (plus ``extra`` arguments) as a real `silofl launch`; the finished
    process (its return code and output)."""
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "silofl.cli.main", *TINY_LAUNCH, "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=300,
    )


MODEL_FOR = {"fedbn": {"proxy_model": "cnn-gn"}}
"""What a method needs on top of a shared test config: FedBN keeps normalisation layers, so a model with
GroupNorm (the shared configs' ``mlp`` has none, and FedBN refuses it)."""
