#!/usr/bin/env bash
# Regenerates docs/client_dp.md: the client-level DP study (240 runs), fixed v = 6, the pilot's cell on all
# 60,000 images, adaptive clipping and client sampling (24 runs), then the document. About 85 minutes on the 2-core CPU (two runs at a time).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
.venv/bin/silofl compare --config bench/client_dp_study.yaml --resume --quiet
.venv/bin/silofl compare --config bench/client_dp_fixed_v.yaml --resume --quiet
.venv/bin/silofl compare --config bench/client_dp_full_data.yaml --resume --quiet
.venv/bin/silofl compare --config bench/client_dp_clip_sampling.yaml --resume --quiet
.venv/bin/python bench/client_dp_round.py --rounds 3 --threads 2 --out docs/data/client_dp_round.json
.venv/bin/python -m studies.client_dp_doc reports/client-dp --fixed-v reports/client-dp-fixed-v \
  --full-data reports/client-dp-full --clip-sampling reports/client-dp-clip > docs/client_dp.md
