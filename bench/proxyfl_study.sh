#!/usr/bin/env bash
# Every run behind docs/proxyfl.md, then the doc itself (about 1 h on 2 cores).
#   bash bench/proxyfl_study.sh
# Seed 0 of each mode runs alone with 2 threads (its wall time is reported); the other runs go two at a
# time with one thread each, as they were measured.
set -euo pipefail
cd "$(dirname "$0")/.."
run() { SILOFL_NO_PROGRESS=1 .venv/bin/silofl run --method proxyfl --dataset fashion-mnist --clients 8 --rounds 300 \
          --eval-every 10 --quiet "$@" > /dev/null; }
bash bench/main_job.sh strict paper                     # runs/main-strict, runs/main-paper (seed 0, reset)
for s in 1 2; do
  run --privacy strict --seed $s --threads 1 --out runs/strict-reset-s$s &
  run --privacy paper --seed $s --threads 1 --out runs/paper-reset-s$s &
  wait
done
for s in 0 1 2; do
  t=1; [ $s = 0 ] && t=2
  run --privacy strict --seed $s --threads $t --optimizer-state keep --out runs/strict-keep-s$s &
  [ $s = 0 ] && wait
  run --privacy paper --seed $s --threads $t --optimizer-state keep --out runs/paper-keep-s$s &
  wait
done
.venv/bin/python bench/dp_step.py --json docs/data/dp_step.json
.venv/bin/python bench/proxyfl_round.py --privacy paper --rounds 5 --json docs/data/proxyfl_round.json
.venv/bin/python -m studies.proxyfl_doc --strict runs/main-strict --paper runs/main-paper \
  --seeds strict=runs/main-strict,runs/strict-reset-s1,runs/strict-reset-s2 \
  --seeds paper=runs/main-paper,runs/paper-reset-s1,runs/paper-reset-s2 \
  --seeds "strict, optimizer_state keep"=runs/strict-keep-s0,runs/strict-keep-s1,runs/strict-keep-s2 \
  --seeds "paper, optimizer_state keep"=runs/paper-keep-s0,runs/paper-keep-s1,runs/paper-keep-s2 \
  --bench-step docs/data/dp_step.json --bench-round docs/data/proxyfl_round.json --out docs/proxyfl.md
