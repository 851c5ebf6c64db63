#!/usr/bin/env bash
# Regenerates docs/audit.md: audits (silofl audit) one after another, then the document.
#   bash bench/audit_study.sh [full|reduced]     (default full; PYTHON=... for another interpreter, default .venv/bin/python;
#                                                JOBS=N runs N audits at a time, default 1: each audit uses one core)
#
# Example-level rows, white-box *gradient* canaries (silofl.auditing.gradient): 4000 Dirac canaries at site 0 on the
# quiet coordinates (--canary-placement quiet: where real gradients on public rows are smallest before the run), each
# in with probability ½ and sampled at the site's q at every DP step; scored per step (noisy gradients) and per
# release.
#   full:    the papers' ProxyFL/FedAvg settings (Fashion-MNIST, 8 clients × 1000 images, p_major 0.8, batch 250 so
#            q = 0.25, LeNet-5 private / MLP proxy, Adam 1e-3) with 100 rounds (400 steps) instead of 300; σ from
#            Opacus' RDP accountant for ε = 1, 3, 8 at δ = 1e-5, q = 0.25, 400 steps: 20.469, 7.578, 3.315.
#            Two black-box rows (1000 mislabelled input canaries, ε = 8, strict and paper) for comparison, and
#            the target rows (no-DP controls, ε = 8) again with seeds 1 and 2, and ProxyFL's ε = 8 row again on
#            a local Flower deployment (--engine flower-local).
#   reduced: 4 clients, 30 rounds (120 steps): σ = 11.25, 4.277, 1.958 for ε = 1, 3, 8 (same accountant).
# PubSub-ML's dp-nn gets the same canaries in its DP-SGD step (quiet: on training rows the publisher does not hold). Each method has a no-DP control (--privacy off) with the same canaries, and a σ = 0.1 row (clipped, almost no noise). Client-level rows: as before (6 hospitals ×
# 1000 images, IID, MLP-256, 20 rounds, adaptive intermediaries, 500 canary hospitals, z for ε ≈ 1, 3, 8 at q = 1).
# Finished audits are kept (delete reports/audit[-reduced]/NAME to redo one).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
SCALE=${1:-full}
case "$SCALE" in
  full) OUT=reports/audit; CLIENTS=8; ROUNDS=100; SIGMAS=(1:20.469 3:7.578 8:3.315) ;;
  reduced) OUT=reports/audit-reduced; CLIENTS=4; ROUNDS=30; SIGMAS=(1:11.25 3:4.277 8:1.958) ;;
  *) echo "usage: bash bench/audit_study.sh [full|reduced]" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
echo "$SCALE" > "$OUT/SCALE"
export SILOFL_NO_PROGRESS=1 OMP_NUM_THREADS=1
JOBS=${JOBS:-1}
[[ "$JOBS" =~ ^[1-9][0-9]*$ ]] || { echo "JOBS takes a positive whole number, got '$JOBS'" >&2; exit 2; }
rm -f "$OUT"/*.failed
run_audit() {  # NAME ARGS...
  local name=$1; shift
  echo "$(date +%T) $name"
  # --seed 0 first: a row that gives its own --seed later overrides it (the last value of an option wins)
  "$PY" -m silofl.cli.main audit --seed 0 "$@" --threads 1 --quiet --out "$OUT/$name" > "$OUT/$name.log" 2>&1 \
    || { echo "failed: $name (see $OUT/$name.log)"; touch "$OUT/$name.failed"; return 1; }
}
audit() {  # NAME ARGS...: runs now (JOBS=1) or in the background, at most JOBS at a time
  local name=$1
  if [ -f "$OUT/$name/audit.json" ]; then echo "kept $OUT/$name"; return; fi
  rm -rf "$OUT/$name"
  if [ "$JOBS" = 1 ]; then run_audit "$@" || exit 1; return; fi
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
  run_audit "$@" &
}
EX=(--dataset fashion-mnist --clients "$CLIENTS" --samples-per-client 1000 --batch-size 250 --rounds "$ROUNDS")
GRAD=(--canary-kind dirac --canary-placement quiet --canaries 4000 --reference-models 0)
PROXY=(--method proxyfl --private-model lenet5 --proxy-model mlp "${EX[@]}")
FEDAVG=(--method fedavg --proxy-model mlp "${EX[@]}")
# controls and ε = 8 first: they carry the study's two targets
audit proxyfl-off-grad "${PROXY[@]}" "${GRAD[@]}" --privacy off
audit fedavg-off-grad "${FEDAVG[@]}" "${GRAD[@]}" --privacy off
for e in "${SIGMAS[@]:2:1}" "${SIGMAS[@]:1:1}" "${SIGMAS[@]:0:1}"; do
  for mode in strict paper; do
    audit "proxyfl-$mode-eps${e%%:*}-grad" "${PROXY[@]}" "${GRAD[@]}" --privacy $mode --noise-multiplier "${e##*:}"
  done
  audit "fedavg-eps${e%%:*}-grad" "${FEDAVG[@]}" "${GRAD[@]}" --noise-multiplier "${e##*:}"
done
# the mechanism's own power control: DP-SGD's clipping and sampling with almost no noise (σ = 0.1; the accountant's ε
# is astronomical), so the canaries are limited only by the real examples' clipped gradients and by m
audit proxyfl-strict-sigma0.1-grad "${PROXY[@]}" "${GRAD[@]}" --privacy strict --noise-multiplier 0.1
audit fedavg-sigma0.1-grad "${FEDAVG[@]}" "${GRAD[@]}" --noise-multiplier 0.1
# PubSub-ML's published dp-nn (1000 rows, 20 epochs, σ from Opacus for the ε) with the canaries in its DP-SGD step
PS=(--pubsub-model dp-nn --dataset fashion-mnist --samples-per-client 1000 "${GRAD[@]}")
audit pubsub-dpnn-off-grad "${PS[@]}" --privacy off
for e in 8 3 1; do
  audit "pubsub-dpnn-eps$e-grad" "${PS[@]}" --epsilon $e
done
if [ "$SCALE" = full ]; then
  e=${SIGMAS[2]}
  for mode in strict paper; do  # black-box: does distilling from the private model leak more about real examples?
    audit "proxyfl-$mode-eps8-input" "${PROXY[@]}" --canaries 1000 --reference-models 2 --privacy $mode \
      --noise-multiplier "${e##*:}"
  done
  # the rows behind the issue's targets (the no-DP controls' power, the share of ε at ε = 8) again with seeds 1
  # and 2: the spread over seeds (docs/audit.md, "Seeds")
  for seed in 1 2; do
    audit "proxyfl-off-grad-seed$seed" "${PROXY[@]}" "${GRAD[@]}" --privacy off --seed $seed
    audit "fedavg-off-grad-seed$seed" "${FEDAVG[@]}" "${GRAD[@]}" --privacy off --seed $seed
    audit "proxyfl-strict-eps8-grad-seed$seed" "${PROXY[@]}" "${GRAD[@]}" --privacy strict \
      --noise-multiplier "${e##*:}" --seed $seed
    audit "fedavg-eps8-grad-seed$seed" "${FEDAVG[@]}" "${GRAD[@]}" --noise-multiplier "${e##*:}" --seed $seed
    audit "pubsub-dpnn-off-grad-seed$seed" "${PS[@]}" --privacy off --seed $seed
    audit "pubsub-dpnn-eps8-grad-seed$seed" "${PS[@]}" --epsilon 8 --seed $seed
  done
  # the mechanism as a deployment runs it: the ε = 8 ProxyFL row again on a local Flower deployment (one process
  # per site, payloads sealed; the audited site arms and scores itself): docs/audit.md, "Engines"
  audit "proxyfl-strict-eps8-grad-flower" "${PROXY[@]}" "${GRAD[@]}" --privacy strict \
    --noise-multiplier "${e##*:}" --engine flower-local
fi
CL=(--method dp-fedavg --dataset fashion-mnist --partition iid --clients 6 --samples-per-client 1000 --batch-size 64
    --proxy-model mlp256 --rounds 20 --intermediaries adaptive --privacy-unit hospital --canaries 500
    --reference-models 2)
for e in 8:2.854 3:6.68 1:18.125; do
  audit "dpfedavg-adaptive-eps${e%%:*}" "${CL[@]}" --noise-multiplier "${e##*:}"
done
wait
if ls "$OUT"/*.failed >/dev/null 2>&1; then echo "some audits failed; docs/audit.md not written" >&2; exit 1; fi
"$PY" -m studies.audit_doc "$OUT" > docs/audit.md.new && mv docs/audit.md.new docs/audit.md
echo "docs/audit.md written"
