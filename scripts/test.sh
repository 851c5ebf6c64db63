#!/usr/bin/env bash
# Install (same as scripts/setup.sh) and run the test suite. CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export SILOFL_NO_PROGRESS=1
exec .venv/bin/python -m pytest -q "$@"
