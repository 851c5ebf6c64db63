"""Threads on a busy machine: the same seeded round, quiet and beside a fixed competing load.

    .venv/bin/python bench/threads.py [--repeats 3] [--rounds 3] [--clients 8] [--variants old,new,passive]

Each variant is one ``silofl run`` (a fresh process, so the OpenMP wait policy in its environment takes
effect): the seeded ProxyFL round of the issue (Fashion-MNIST, 8 sites × 1000, LeNet5 private, MLP proxy,
paper-mode DP, evaluation every round on 1000 test images). The bench alternates the variants, once as the
machine is and once beside ``--load`` busy processes it starts and stops itself (pure Python loops, one core
each), ``--repeats`` times, and prints per variant the median seconds per round (``summary.json``
``seconds_per_round``, so start-up is excluded), its spread, the CPU seconds the run used per round, and the
ratio loaded/as-is. Variants:

- ``old``: torch's choice before silofl chose (all cores, libgomp's default spin-then-sleep wait);
- ``new``: silofl's default (:mod:`silofl.core.threads`, one thread per process; no ``--threads``);
- ``passive``: all cores with ``OMP_WAIT_POLICY=PASSIVE``; ``one``: ``--threads 1`` (the default, asked).

"As the machine is" is quiet only on a quiet machine: say what else ran when quoting the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROUND = [
    "--method", "proxyfl", "--dataset", "fashion-mnist", "--private-model", "lenet5", "--proxy-model", "mlp",
    "--privacy", "paper", "--eval-every", "1", "--test-limit", "1000", "--seed", "1", "--quiet",
]  # fmt: skip
CORES = len(os.sched_getaffinity(0))
VARIANTS: dict[str, tuple[list[str], dict[str, str]]] = {
    "old": (["--threads", str(CORES)], {}),
    "new": ([], {}),
    "one": (["--threads", "1"], {}),
    "passive": (["--threads", str(CORES)], {"OMP_WAIT_POLICY": "PASSIVE"}),
}


def one_run(variant: str, size: list[str], work: Path) -> tuple[float, float]:
    """(seconds per round, CPU seconds per round of the run's process) of one run of ``variant``."""
    args, env_extra = VARIANTS[variant]
    out = Path(tempfile.mkdtemp(dir=work))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_", "MKL_"))}
    env.update({"SILOFL_NO_PROGRESS": "1", **env_extra})
    cmd = [sys.executable, "-m", "silofl.cli.main", "run", *ROUND, *size, *args]
    before = os.times()
    subprocess.run([*cmd, "--out", str(out / "run")], env=env, check=True, capture_output=True)
    after = os.times()
    summary = json.loads((out / "run" / "summary.json").read_text())
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return float(summary["seconds_per_round"]), cpu / int(summary["rounds_run"])


def busy(n: int) -> list[subprocess.Popen]:
    """``n`` processes that each keep one core busy until stopped."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop(procs: list[subprocess.Popen]) -> None:
    """Stop the load processes this bench started."""
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait()


def spread(xs: list[float]) -> str:
    """min–max of the samples."""
    return f"{min(xs):.2f}–{max(xs):.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--samples-per-client", type=int, default=1000)
    ap.add_argument("--load", type=int, default=2, help="busy processes beside the loaded runs")
    ap.add_argument("--variants", default="old,new,passive")
    ap.add_argument("--json", default=None, help="also write every sample to this JSON file")
    args = ap.parse_args()
    variants = args.variants.split(",")
    size = ["--clients", str(args.clients), "--samples-per-client", str(args.samples_per_client)]
    size += ["--rounds", str(args.rounds)]
    samples: dict[str, dict[str, list[tuple[float, float]]]] = {
        v: {"as-is": [], "loaded": []} for v in variants
    }
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for cond in ("as-is", "loaded") if rep % 2 == 0 else ("loaded", "as-is"):
                load = busy(args.load) if cond == "loaded" else []
                try:
                    time.sleep(0.5 if load else 0.0)
                    for v in variants if rep % 2 == 0 else variants[::-1]:
                        samples[v][cond].append(one_run(v, size, Path(tmp)))
                        print(f"rep {rep} {cond:6} {v:8} {samples[v][cond][-1][0]:.2f} s/round", flush=True)
                finally:
                    stop(load)
    print(
        f"\n{args.clients} sites × {args.samples_per_client}, {args.rounds} rounds per run, {CORES} cores, "
        f"load = {args.load} busy processes; medians of {args.repeats} (min–max)"
    )
    print(
        f"{'variant':8} {'as-is s/round':>18} {'loaded s/round':>18} "
        f"{'CPU s/round loaded (whole run)':>30} {'ratio':>6}"
    )
    for v in variants:
        a = [s for s, _ in samples[v]["as-is"]]
        b = [s for s, _ in samples[v]["loaded"]]
        c = [c for _, c in samples[v]["loaded"]]
        ma, mb = statistics.median(a), statistics.median(b)
        print(
            f"{v:8} {ma:7.2f} ({spread(a):>9}) {mb:7.2f} ({spread(b):>9}) "
            f"{statistics.median(c):9.2f} ({spread(c)}) {mb / ma:5.2f}×"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(samples, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
