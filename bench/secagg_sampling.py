"""Client sampling and the sub-client privacy unit with secure aggregation, side by side with central noise:
DP-FedAvg at the same noise multiplier, client rate q and v sub-clients per hospital (``--privacy-unit
subclient``), over several seeds. The central run's ε per sub-client is amplified by sampling (the server is
trusted and the sample secret from outsiders); the secure run claims no amplification (the server picks the
sample), so its ε against the server composes each hospital's own rounds, unamplified — the price of holding
against the server, printed beside the accuracy.

    python bench/secagg_sampling.py [--seeds 0,1,2] [--rounds 20] [--rate 0.5] [--v 2] [--out FILE.json]

Set-up: Fashion-MNIST IID, 6 hospitals × 1000 images, mlp256, batch 64, one local epoch, local lr 0.05,
C = 1, z = 1, δ = 1e-5; secure aggregation with its defaults (20 bits, min_survivors round(q·K) − 1, at least
2: smaller samples skip the round). Each run is a real ``silofl run`` process; the figures are read from its
summary.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from secagg_accuracy import COMMON as BASE  # bench/ is the script's folder (sys.path[0])
from secagg_accuracy import mean_sd, write_result
from secagg_accuracy import run as run_common

COMMON = [*BASE, "--noise-multiplier", "1.0", "--privacy-unit", "subclient"]


def run(out: Path, *args: str) -> dict:
    """``silofl run`` of this bench's setting and ``args`` into ``out``; its summary.json."""
    return run_common(out, *args, common=COMMON)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--rate", type=float, default=0.5)
    ap.add_argument("--v", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            base = ["--rounds", str(a.rounds), "--eval-every", str(a.rounds), "--seed", str(seed)]
            base += ["--client-rate", repr(a.rate), "--intermediaries", str(a.v)]
            c = run(Path(tmp) / f"c{seed}", *base)
            s = run(Path(tmp) / f"s{seed}", *base, "--secure-aggregation")
            p = s["privacy"]
            per = p["epsilon_vs_server_per_hospital"].values()
            rows.append(
                {
                    "seed": seed,
                    "central_acc": c["final"]["per_client"][0]["global_acc"],
                    "central_epsilon_subclient_amplified": c["privacy"]["epsilon_subclient"],
                    "secure_acc": s["final"]["per_client"][0]["global_acc"],
                    "secure_epsilon_vs_server_subclient_max": p["epsilon_vs_server"],
                    "secure_epsilon_vs_server_subclient_min": min(per),
                    "secure_epsilon_vs_server_hospital_max": p["epsilon_vs_server_hospital"],
                    "secure_central_epsilon_subclient_unamplified": p["epsilon_subclient"],
                    "rounds_released": p["rounds_released"],
                    "rounds_skipped": p["rounds_skipped_small_sample"],
                    "rounds_per_hospital": p["rounds_per_hospital"],
                }
            )
            print(json.dumps(rows[-1]), flush=True)

    def ms(key: str) -> str:
        return mean_sd(rows, key)

    print(
        f"DP-FedAvg, Fashion-MNIST IID, 6 × 1000, {a.rounds} rounds, q = {a.rate}, v = {a.v}, "
        "sub-client unit, "
        f"z = 1, seeds {a.seeds} (mean ± sd)"
    )
    print(
        f"central noise:      acc {ms('central_acc')}, ε per sub-client (amplified by sampling) "
        f"{ms('central_epsilon_subclient_amplified')}"
    )
    print(
        f"secure aggregation: acc {ms('secure_acc')}, ε vs server per sub-client, largest hospital "
        f"{ms('secure_epsilon_vs_server_subclient_max')}, "
        f"smallest {ms('secure_epsilon_vs_server_subclient_min')}; "
        f"per hospital {ms('secure_epsilon_vs_server_hospital_max')}; Gaussian unamplified "
        f"{ms('secure_central_epsilon_subclient_unamplified')}"
    )
    write_result(
        a.out,
        a.rounds,
        rows,
        f"python bench/secagg_sampling.py --seeds {a.seeds} --rounds {a.rounds} --rate {a.rate} --v {a.v}",
    )


if __name__ == "__main__":
    main()
