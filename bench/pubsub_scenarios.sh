#!/usr/bin/env bash
# Every PubSub-ML scenario at full size (scale first, on a quiet machine: its seconds are the result),
# then docs/pubsub.md from the tables. Usage: bash bench/pubsub_scenarios.sh [OUT=reports/pubsub]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-reports/pubsub}
for s in scale distributed-features regression noisy-sites stream iid non-iid; do
  .venv/bin/python -m studies.pubsub_scenarios "$s" --out "$OUT/$s"
done
.venv/bin/python -m studies.pubsub_doc --runs "$OUT" --out docs/pubsub.md
