#!/usr/bin/env bash
# Wall time of the papers-setting 300-round ProxyFL job (the README's first command before the budget-first main job), per privacy mode.
#   bash bench/main_job.sh [strict|paper|off ...]   (default: strict paper)
# Writes runs/main-<mode>/ and prints wall time, seconds per round, train/eval split and final figures.
set -euo pipefail
cd "$(dirname "$0")/.."
modes=("$@"); [ ${#modes[@]} -gt 0 ] || modes=(strict paper)
for mode in "${modes[@]}"; do
  SILOFL_NO_PROGRESS=1 .venv/bin/silofl run --method proxyfl --dataset fashion-mnist --clients 8 --rounds 300 \
    --seed 0 --privacy "$mode" --eval-every 10 --out "runs/main-$mode" --quiet > "runs/main-$mode.log" 2>&1
  .venv/bin/python - "$mode" <<'PY'
import json, sys
mode = sys.argv[1]
s = json.load(open(f"runs/main-{mode}/summary.json"))
f = s["final"]
print(f"{mode:>6}: wall {s['wall_time_s']:.0f} s, {s['seconds_per_round']:.2f} s/round "
      f"(train {s['train_time_s']:.0f} s, eval {s['eval_time_s']:.0f} s), {s['threads']} threads; "
      f"private {f['private_acc']['mean']:.4f}±{f['private_acc']['std']:.4f}, proxy {f['proxy_acc']['mean']:.4f}±{f['proxy_acc']['std']:.4f}, "
      f"ε {f['epsilon']['mean']}")
PY
done
