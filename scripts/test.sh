#!/usr/bin/env bash
# Install (same as scripts/setup.sh), type-check the privacy, comm, site and core modules, and run the test
# suite on both cores (all of it; `bash scripts/test.sh -m "not slow"` is the fast tier). CI runs exactly this
# (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export SILOFL_NO_PROGRESS=1
.venv/bin/mypy  # the files named in pyproject.toml: privacy, comm, site, core
# two workers (the CI machine's two cores); a test file stays on one worker (module fixtures start deployments once)
exec .venv/bin/python -m pytest -q -n 2 --dist loadfile "$@"
