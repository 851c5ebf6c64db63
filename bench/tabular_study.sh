#!/usr/bin/env bash
# The tabular example (Palmer penguins, one site per island): Local, ProxyFL, FedAvg (DP and not), DP-FedAvg and
# PubSub-ML on the same per-site files and split, three seeds (about two minutes on 2 cores), then docs/tabular.md.
# Usage: bash bench/tabular_study.sh [OUT=reports/tabular]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-reports/tabular}
SILOFL_NO_PROGRESS=1 .venv/bin/python -m studies.tabular --out "$OUT"
.venv/bin/python -m studies.tabular_doc --runs "$OUT" --out docs/tabular.md
