#!/usr/bin/env bash
# Install (scripts/setup.sh with every extra and the test tools: .[all,dev]), type-check the privacy, comm, site and
# core modules, check the import layers (lint-imports), and run the test suite (all of it; `bash scripts/test.sh -m "not slow"` is the fast tier). CI runs
# exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
SILOFL_EXTRAS=all,dev bash scripts/setup.sh
# the docs site's browser test (tests/docs): Debian's Chromium + chromedriver
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null
  else
    echo "note: no /usr/bin/chromium; run 'apt-get install chromium chromium-driver' as root (tests/docs skips its browser test)" >&2
  fi
fi
export SILOFL_NO_PROGRESS=1
.venv/bin/mypy  # the files named in pyproject.toml: privacy, comm, site, core
.venv/bin/lint-imports  # the layers of src/silofl (pyproject.toml [tool.importlinter]): nothing imports upward
# two workers (pytest-xdist), whole files each (a file's deployments share their fixtures); the fast tier as
# `pytest -m "not slow"` stays one process
exec .venv/bin/python -m pytest -q -n "${SILOFL_TEST_WORKERS:-2}" --dist loadfile "$@"
