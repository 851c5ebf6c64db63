#!/usr/bin/env bash
# Regenerates docs/audit.md: 19 audits (silofl audit) one after another, then the document (about 30 minutes on
# the shared 2-core CPU, one torch thread: two threads on a contended machine ran ~50x slower).
#   bash bench/audit_study.sh            (PYTHON=... to use another interpreter; default .venv/bin/python)
# Example-level rows: the papers' ProxyFL/FedAvg settings (Fashion-MNIST, 8 clients × 1000 images, p_major 0.8,
# batch 250, LeNet-5 private / MLP proxy, Adam 1e-3) with 100 rounds instead of 300; 1000 mislabelled canaries at
# site 0. With seed 0 the coins put 531 canaries in, so site 0 holds 1531 examples (q = 250/1531, 6 steps a
# round, 600 steps); σ is chosen so that its accountant lands at ε ≈ 1, 3, 8 (δ = 1e-5), and σ = 1 is the papers'
# noise multiplier. `regular --privacy off` is a control: the same site training its LeNet-5 alone without DP,
# audited as if that model were released. Client-level rows: 6 hospitals × 1000 images (IID), MLP-256, 20 rounds
# (Jiang et al.: 2000 images, 50 rounds), adaptive intermediaries, 500 canary hospitals, z for ε ≈ 1, 3, 8 at
# q = 1. PubSub rows: a DP-SGD network published at ε = 1, 3, 8 by a site holding 1000 images.
# Finished audits are kept (delete reports/audit/NAME to redo one).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=reports/audit
mkdir -p "$OUT"
export SILOFL_NO_PROGRESS=1 OMP_NUM_THREADS=1
audit() {  # NAME ARGS...
  local name=$1; shift
  if [ -f "$OUT/$name/audit.json" ]; then echo "kept $OUT/$name"; return; fi
  rm -rf "$OUT/$name"
  echo "$(date +%T) $name"
  "$PY" -m silofl.cli.main audit "$@" --seed 0 --threads 1 --quiet --out "$OUT/$name" > "$OUT/$name.log" 2>&1 \
    || { echo "failed: $name (see $OUT/$name.log)"; exit 1; }
}
EX=(--dataset fashion-mnist --clients 8 --samples-per-client 1000 --batch-size 250 --rounds 100 --canaries 1000
    --reference-models 2)
PROXY=(--method proxyfl --private-model lenet5 --proxy-model mlp "${EX[@]}")
for mode in strict paper; do
  audit "proxyfl-$mode-eps1" "${PROXY[@]}" --privacy $mode --noise-multiplier 16.406
  audit "proxyfl-$mode-eps3" "${PROXY[@]}" --privacy $mode --noise-multiplier 6.084
  audit "proxyfl-$mode-eps8" "${PROXY[@]}" --privacy $mode --noise-multiplier 2.69
  audit "proxyfl-$mode-sigma1" "${PROXY[@]}" --privacy $mode --noise-multiplier 1.0
done
audit proxyfl-off "${PROXY[@]}" --privacy off
audit regular-off --method regular --private-model lenet5 "${EX[@]}" --privacy off
for e in 1:16.406 3:6.084 8:2.69; do
  audit "fedavg-eps${e%%:*}" --method fedavg --proxy-model mlp "${EX[@]}" --noise-multiplier "${e##*:}"
done
for e in 1 3 8; do
  audit "pubsub-dpnn-eps$e" --pubsub-model dp-nn --epsilon $e --dataset fashion-mnist --samples-per-client 1000 \
    --canaries 1000 --reference-models 2
done
CL=(--method dp-fedavg --dataset fashion-mnist --partition iid --clients 6 --samples-per-client 1000 --batch-size 64
    --proxy-model mlp256 --rounds 20 --intermediaries adaptive --privacy-unit hospital --canaries 500
    --reference-models 2)
for e in 1:18.125 3:6.68 8:2.854; do
  audit "dpfedavg-adaptive-eps${e%%:*}" "${CL[@]}" --noise-multiplier "${e##*:}"
done
"$PY" scripts/audit_doc.py "$OUT" > docs/audit.md
echo "docs/audit.md written"
