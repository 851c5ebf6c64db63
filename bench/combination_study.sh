#!/usr/bin/env bash
# Combination at inference (silofl.site.combine) on the ProxyFL benchmark: Fashion-MNIST, 8 sites x 1000 examples,
# p_major 0.8, 30 rounds, eps = 3 per site (delta 1e-5, budget-first), strict mode, one thread, seeds 0-2; each run
# also trains going alone (--vs-alone). Then docs/combination.md:
#   python -m studies.combination_doc --runs reports/combination --out docs/combination.md
set -euo pipefail
OUT=${OUT:-reports/combination}
S=${SILOFL:-.venv/bin/silofl}
A=(--method proxyfl --dataset fashion-mnist --clients 8 --rounds 30 --target-epsilon 3 --privacy strict --threads 1
   --eval-every 10 --quiet)
export OMP_NUM_THREADS=1 SILOFL_NO_PROGRESS=1
for seed in 0 1 2; do
  "$S" run "${A[@]}" --seed "$seed" --combine stack --vs-alone --out "$OUT/stackbal_s$seed"
done
"$S" run "${A[@]}" --seed 0 --combine stack --set combine_balance=false --out "$OUT/stack_s0"
"$S" run "${A[@]}" --seed 0 --combine weights --set combine_balance=false --out "$OUT/weights_s0"
"$S" run "${A[@]}" --seed 0 --combine weights --out "$OUT/weightsbal_s0"
"$S" run "${A[@]}" --seed 0 --dml-alpha 0 --combine stack --vs-alone --out "$OUT/stackbal_a0_s0"
# 100 rounds at the same budget (alpha 0: the private model learns from its own rows only)
"$S" run "${A[@]}" --seed 0 --dml-alpha 0 --rounds 100 --eval-every 25 --combine stack --out "$OUT/stackbal_a0_r100_s0"
# going alone at 30 rounds with a batch of 200 (what the combining sites' 800 rows get): how much it moves
"$S" run --method regular --privacy off --private-model lenet5 --dataset fashion-mnist --clients 8 --rounds 30 \
  --batch-size 200 --threads 1 --seed 0 --eval-every 30 --quiet --out "$OUT/alone_b200_s0"
# a stronger going-alone reference: the same split, 100 rounds
"$S" run --method regular --privacy off --private-model lenet5 --dataset fashion-mnist --clients 8 --rounds 100 \
  --threads 1 --seed 0 --eval-every 25 --quiet --out "$OUT/alone100_s0"
