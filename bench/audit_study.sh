#!/usr/bin/env bash
# Regenerates docs/audit.md: 18 audits (silofl audit) one after another, then the document.
#   bash bench/audit_study.sh            (PYTHON=... to use another interpreter; default .venv/bin/python)
# Reduced from the papers' settings to fit a shared 2-core CPU (see docs/audit.md, Set-up): Fashion-MNIST,
# 4 clients × 1000 images (p_major 0.8), batch 250, LeNet-5 private / MLP proxy, 30 rounds; 1000 canaries at
# site 0. σ is chosen so that the audited site's accountant lands at ε ≈ 1, 3, 8 (δ = 1e-5): with seed 0 its
# coins put 531 canaries in, so it holds 1531 examples (q = 250/1531, 6 steps per round, 180 steps); σ = 1 is the
# papers' noise multiplier. Client-level: 6 hospitals × 1000 images (IID), MLP-256, 20 rounds, 500 canary
# hospitals, z for ε ≈ 1, 3, 8 at q = 1 and 20 rounds. PubSub: a DP-SGD network published at ε = 1, 3, 8.
# Finished audits are kept (delete reports/audit/NAME to redo one).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=reports/audit
mkdir -p "$OUT"
export SILOFL_NO_PROGRESS=1
audit() {  # NAME ARGS...
  local name=$1; shift
  if [ -f "$OUT/$name/audit.json" ]; then echo "kept $OUT/$name"; return; fi
  rm -rf "$OUT/$name"
  echo "$(date +%T) $name"
  "$PY" -m silofl.cli.main audit "$@" --seed 0 --threads 2 --quiet --out "$OUT/$name" > "$OUT/$name.log" 2>&1 \
    || { echo "failed: $name (see $OUT/$name.log)"; exit 1; }
}
EX=(--dataset fashion-mnist --clients 4 --samples-per-client 1000 --batch-size 250 --rounds 30 --canaries 1000
    --reference-models 2)
PROXY=(--method proxyfl --private-model lenet5 --proxy-model mlp "${EX[@]}")
for mode in strict paper; do
  audit "proxyfl-$mode-eps1" "${PROXY[@]}" --privacy $mode --noise-multiplier 9.062
  audit "proxyfl-$mode-eps3" "${PROXY[@]}" --privacy $mode --noise-multiplier 3.457
  audit "proxyfl-$mode-eps8" "${PROXY[@]}" --privacy $mode --noise-multiplier 1.632
  audit "proxyfl-$mode-sigma1" "${PROXY[@]}" --privacy $mode --noise-multiplier 1.0
done
audit proxyfl-off "${PROXY[@]}" --privacy off
for e in 1:9.062 3:3.457 8:1.632; do
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
