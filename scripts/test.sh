#!/usr/bin/env bash
# Install (scripts/setup.sh with every extra and the test tools: .[all,dev]), type-check the privacy, comm, site and
# core modules, and run the test suite (all of it; `bash scripts/test.sh -m "not slow"` is the fast tier). CI runs
# exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
SILOFL_EXTRAS=all,dev bash scripts/setup.sh
export SILOFL_NO_PROGRESS=1
.venv/bin/mypy  # the files named in pyproject.toml: privacy, comm, site, core
exec .venv/bin/python -m pytest -q "$@"
