#!/usr/bin/env bash
# The throughput figures of BENCHMARKS.md. Run on a quiet machine: with other processes on the cores, every
# OpenMP barrier can wait a scheduler quantum and multi-threaded timings lose all meaning.
#   THREADS=2 benchmarks/throughput.sh          # results as JSON under benchmarks/results/
set -euo pipefail
THREADS=${THREADS:-$(nproc)}
OUT=${OUT:-benchmarks/results}
VITLAB=${VITLAB:-vitlab}
mkdir -p "$OUT"
"$VITLAB" bench --model ViT-S/16 --batch-size 32 --compare timm --threads "$THREADS" --json "$OUT/vit-s16_b32.json"
"$VITLAB" bench --model ViT-B/16 --batch-size 32 --compare timm --mode infer --threads "$THREADS" \
    --json "$OUT/vit-b16_b32_infer.json"
"$VITLAB" bench --model ViT-S/16 --batch-size 32 --compare timm --threads "$THREADS" --no-malloc-tuning \
    --json "$OUT/vit-s16_b32_default-malloc.json"
