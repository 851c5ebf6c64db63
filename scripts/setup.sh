#!/usr/bin/env bash
# Install silofl into .venv at the repository root: torch==2.13.0 first (the CPU wheel; an unpinned
# torch would pull GBs of CUDA wheels), then the package and its dependencies, then Fashion-MNIST
# (Debian package dataset-fashion-mnist) when it is not already present. Safe to run repeatedly.
#
# The package is installed with the extras named in SILOFL_EXTRAS (comma-separated; default: none, the core —
# the simulator, which is what the README's first command runs). scripts/test.sh sets SILOFL_EXTRAS=all,dev:
# every extra (deploy, pubsub, export, studies, …) and the test tools. An extra installed once stays installed.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  if ! "$PY" -m venv .venv 2>/dev/null; then
    # Debian's python3 ships venv separately
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
      "$PY" -m venv .venv
    else
      echo "error: '$PY -m venv' failed; install python3-venv (Python >= 3.11 is required)" >&2
      exit 1
    fi
  fi
fi
pipi() { .venv/bin/python -m pip install --disable-pip-version-check -q "$@"; }
if ! .venv/bin/python -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.13.0")' 2>/dev/null; then
  pipi torch==2.13.0
fi
EXTRAS=${SILOFL_EXTRAS:-}
if [[ ! "$EXTRAS" =~ ^[a-z,]*$ ]]; then
  echo "error: SILOFL_EXTRAS takes extras' names separated by commas (e.g. all,dev), got '$EXTRAS'" >&2
  exit 2
fi
pipi -e ".${EXTRAS:+[$EXTRAS]}"

if [ "${SILOFL_SKIP_DATA:-0}" != 1 ] && ! ls /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte* >/dev/null 2>&1 \
   && [ -z "${SILOFL_DATA:-}" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing Fashion-MNIST (dataset-fashion-mnist)…"
    apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist >/dev/null
  else
    echo "note: Fashion-MNIST not found; run 'apt-get install dataset-fashion-mnist' as root or set SILOFL_DATA" >&2
  fi
fi
