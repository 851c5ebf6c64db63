#!/usr/bin/env bash
# Every run behind docs/results.md (the ProxyFL papers' Fashion-MNIST study), then the doc itself.
# Settings of the papers: 8 clients x 1000 images, p_major 0.8, batch 250, C = 1, sigma = 1, Adam 1e-3,
# LeNet5 private / MLP proxy (the shared model of FedAvg, AvgPush and CWT), strict privacy mode.
# Then the DP vs non-DP preset (ABL_ROUNDS) and a long single-seed run (LONG_ROUNDS) to see convergence.
# ROUNDS and JOBS may be overridden: ROUNDS=300 JOBS=2 bash bench/results_study.sh (about 2 h on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-300}
ABL_ROUNDS=${ABL_ROUNDS:-100}
JOBS=${JOBS:-2}
SILOFL=${SILOFL:-.venv/bin/silofl}
export SILOFL_NO_PROGRESS=${SILOFL_NO_PROGRESS:-}
$SILOFL compare --methods proxyfl,fedavg,fml,avgpush,cwt,regular,joint --dataset fashion-mnist \
  --seeds 0,1,2 --rounds "$ROUNDS" --eval-every 25 --jobs "$JOBS" --resume \
  --comm-clients 2,4,8,16,32,64 --out reports/fmnist --quiet
$SILOFL compare --methods proxyfl,fedavg,fml,avgpush,cwt,regular --preset dp --dataset fashion-mnist \
  --seeds 0,1,2 --rounds "$ABL_ROUNDS" --eval-every 25 --jobs "$JOBS" --resume --out reports/fmnist-dp --quiet
$SILOFL compare --methods proxyfl,fedavg,cwt --dataset fashion-mnist --seeds 0 --rounds "${LONG_ROUNDS:-800}" \
  --eval-every 50 --threads 1 --resume --out reports/fmnist-long --quiet
$SILOFL compare --config bench/cwt_one_hop.yaml --resume --quiet
.venv/bin/python -m studies.results_doc reports/fmnist --dp reports/fmnist-dp --long reports/fmnist-long \
  --extra reports/fmnist-cwt1 > docs/results.md
