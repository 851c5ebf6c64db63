"""Cost per site as the number of sites grows: the README's recipe on the simulator, K = 8 … 64.

    .venv/bin/python bench/scaling.py [--sites 8,16,32,48] [--rounds 3] [--features scatter]

Each K runs in a fresh process (one torch thread): the README's ProxyFL recipe (complete graph, PushSum
self-weight 1/K, linear models on ScatterNet features), ``--samples-per-client`` examples per site so that
every site does the same work whatever K, seeded. After a warm-up round it times ``--rounds`` rounds
(evaluation excluded, as in the recipe's rounds between evaluations) and prints, per K: the median seconds
per round and per site per round (with the min–max over rounds), the ratio of the latter to the smallest K's,
how many payloads were decoded per round (:func:`silofl.comm.wire.decode` calls; K − 1 per site before
payloads were shared), and the process's peak RSS. Counts and RSS do not depend on what else runs; the
seconds do, so say what shared the machine when quoting them.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

RECIPE = dict(
    method="proxyfl",
    dataset="fashion-mnist",
    target_epsilon=8.0,
    private_model="linear",
    proxy_model="linear",
    graph="complete",
    optimizer="sgd",
    momentum=0.9,
    optimizer_state="keep",
    lr=10.0,
    clip=0.1,
    sample_rate=0.5,
    local_steps=1,
    private_lr=0.003,
    dml_alpha=0.5,
    eval_every=1000,
    threads=1,
    seed=1,
)


def one(k: int, rounds: int, samples: int, features: str, out: str) -> dict:
    """Run K sites in this process; its figures."""
    from silofl.comm import wire
    from silofl.runner.config import RunConfig
    from silofl.runner.loop import build

    decodes = [0]
    real = wire.decode

    def counting(data, *args):
        decodes[0] += 1
        return real(data, *args)

    wire.decode = counting  # type: ignore[assignment]
    cfg = RunConfig.from_dict(
        {**RECIPE, "clients": k, "self_weight": 1.0 / k, "rounds": rounds + 2, "samples_per_client": samples}
        | {"features": features, "out": out}
    )
    _, _, coordinator, _ = build(cfg)
    coordinator.run_round(0)
    coordinator.run_round(1)  # warm-up; its deliveries go with the next round's request
    times = []
    decodes[0] = 0
    for r in range(2, rounds + 2):
        t = time.perf_counter()
        coordinator.run_round(r)
        times.append(time.perf_counter() - t)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"k": k, "seconds": times, "decodes_per_round": decodes[0] / rounds, "peak_rss_mb": rss_mb}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sites", default="8,16,32,48")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--samples-per-client", type=int, default=800)
    ap.add_argument("--features", default="scatter")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # the child process
    ap.add_argument("--out", default="/tmp/silofl-scaling", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(one(args.one, args.rounds, args.samples_per_client, args.features, args.out)))
        return 0
    rows = []
    for k in (int(x) for x in args.sites.split(",")):
        cmd = [sys.executable, __file__, "--one", str(k), "--rounds", str(args.rounds)]
        cmd += ["--samples-per-client", str(args.samples_per_client), "--features", args.features]
        res = subprocess.run([*cmd, "--out", f"{args.out}/k{k}"], capture_output=True, text=True, check=True)
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(
            f"K = {k}: {statistics.median(r['seconds']):.3f} s/round, peak RSS {r['peak_rss_mb']:.0f} MB",
            flush=True,
        )
    base = statistics.median(rows[0]["seconds"]) / rows[0]["k"]
    print(
        f"\n{'K':>3} {'s/round':>8} {'s/site/round (min–max)':>28} {'×K0':>5} "
        f"{'decodes/round':>14} {'peak RSS':>9}"
    )
    for r in rows:
        per = [s / r["k"] for s in r["seconds"]]
        m = statistics.median(per)
        print(
            f"{r['k']:>3} {statistics.median(r['seconds']):8.3f} {m:10.4f} ({min(per):.4f}–{max(per):.4f}) "
            f"{m / base:5.2f} {r['decodes_per_round']:14.0f} {r['peak_rss_mb']:6.0f} MB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
