"""Helpers shared by the tests: a run's parts built in one process, without writing a run folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from silofl.comm.engine import InProcessEngine
from silofl.data import SplitData
from silofl.fl.coordinator import Coordinator
from silofl.runner.config import RunConfig
from silofl.runner.loop import build


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


def silofl_here(args: list[str], cwd, env: dict | None = None):
    """``silofl ARGS`` through the command-line app in this process (typer's CliRunner), in ``cwd`` with
    ``env`` (the variables it sets or changes), as a completed process: return code, stdout, stderr (with the
    traceback of an exception that escaped; SystemExit is an exit code). A python process per command costs
    about 2 s of CPU importing torch; the tests of commands "as written" run their argv this way unless the
    command serves. The working folder and torch's thread count are restored."""
    import os
    import subprocess
    import traceback

    import torch
    from typer.testing import CliRunner

    from silofl.cli.main import app

    here, threads = os.getcwd(), torch.get_num_threads()
    os.chdir(cwd)
    try:
        changed = {k: v for k, v in (env or {}).items() if os.environ.get(k) != v}
        r = CliRunner().invoke(app, args, env=changed)
    finally:
        os.chdir(here)
        torch.set_num_threads(threads)
    escaped = r.exception is not None and not isinstance(r.exception, SystemExit)
    crash = "".join(traceback.format_exception(r.exception)) if escaped else ""
    return subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr + crash)


# a two-process ProxyFL run on digits, one round: what tests of torch.distributed runs launch
TINY_LAUNCH = (
    "launch --nproc-per-node 2 --method proxyfl --dataset digits --clients 2 --rounds 1 "
    "--samples-per-client 100 --batch-size 25 --delta 1e-3 --test-limit 100 --threads 1 --quiet"
).split()


def silofl_cli(*args: str, timeout: float = 300):
    """``silofl ARGS`` as a real process of this interpreter; the finished process (return code, output)."""
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "silofl.cli.main", *args], capture_output=True, text=True, timeout=timeout
    )


def launch_tiny(out, *extra: str):
    """Run :data:`TINY_LAUNCH` into ``out`` (plus ``extra`` arguments) as a real `silofl launch`; the finished
    process (its return code and output)."""
    return silofl_cli(*TINY_LAUNCH, "--out", str(out), *extra)


MODEL_FOR = {"fedbn": {"proxy_model": "cnn-gn"}}
NEEDS = {
    "dp-ssp": {"proxy_model": "linear", "secure_aggregation": True, "rounds": 1, "samples_per_client": 100}
}
"""What a method needs of any config: dp-ssp releases its statistics once, through the secure sum, for a
linear head."""
"""What a method needs on top of a shared test config: FedBN keeps normalisation layers, so a model with
GroupNorm (the shared configs' ``mlp`` has none, and FedBN refuses it)."""


def write_survival_sites(
    root, sites: int = 3, rows: int = 300, seed: int = 0, bins=(0.5, 1.0, 2.0, 4.0), persons: bool = False
):
    """Generated multi-site survival tables under ``root`` (site{k}.csv and schema.yaml): two numeric features
    and a categorical one, exponential event times with hazard exp(0.9·x1 − 0.6·x2 + 0.5·[grp = b]) and
    uniform censoring on [0, 5]; each site's x1 shifted. ``persons``: a ``pid`` column (two rows per person,
    listed under ``ignore``). Returns (schema path, site paths, true β)."""
    import numpy as np
    import pandas as pd
    import yaml

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    beta = np.array([0.9, -0.6, 0.5])
    paths = []
    for k in range(sites):
        x1 = np.clip(rng.normal(0.3 * (k - 1), 1.0, rows), -3, 3)
        x2 = np.clip(rng.normal(0.0, 1.0, rows), -3, 3)
        grp = rng.integers(0, 2, rows)
        lin = beta[0] * x1 + beta[1] * x2 + beta[2] * grp
        t_event = rng.exponential(1.0 / np.exp(lin))
        t_cens = rng.uniform(0.0, 5.0, rows)
        df = pd.DataFrame(
            {
                "x1": x1.round(4),
                "x2": x2.round(4),
                "grp": np.where(grp == 1, "b", "a"),
                "days": np.minimum(t_event, t_cens).round(5),
                "died": (t_event <= t_cens).astype(int),
            }
        )
        if persons:
            df["pid"] = [f"p{k}-{i // 2}" for i in range(rows)]
        p = root / f"site{k}.csv"
        df.to_csv(p, index=False)
        paths.append(str(p))
    schema = {
        "target": {"type": "survival", "time": "days", "event": "died", "bins": list(bins)},
        "features": {
            "x1": {"type": "numeric", "bounds": [-3, 3]},
            "x2": {"type": "numeric", "bounds": [-3, 3]},
            "grp": {"type": "categorical", "levels": ["a", "b"]},
        },
        **({"ignore": ["pid"]} if persons else {}),
    }
    sp = root / "schema.yaml"
    sp.write_text(yaml.safe_dump(schema))
    return str(sp), paths, beta


def secure_or_plain(kw: dict, secure: bool) -> dict:
    """Run options ``kw`` for the secure run (``secure``) or its plain twin: the twin drops the
    ``secagg_*`` options, which a run without secure aggregation refuses."""
    return {
        **{k: v for k, v in kw.items() if secure or not k.startswith("secagg_")},
        "secure_aggregation": secure,
    }
