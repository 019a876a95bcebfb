#!/usr/bin/env bash
# Issue 4's measurements on the embedded data (CPU, a few minutes each):
#  1. few-shot linear accuracy (1/5/10/25 shots, 3 seeds) on digits of a ViT pre-trained by `vitlab train`
#     (supervised on MNIST, supervised on digits, self-supervised MPP on digits) vs the same ViT randomly initialised;
#  2. MPP pre-training then fine-tuning vs training from scratch with the same fine-tuning budget.
# Usage: bash benchmarks/pretraining_value.sh [OUT_DIR]   (results: OUT_DIR/*.json and the printed tables)
set -euo pipefail
OUT=${1:-runs/pretraining-value}
V=${VITLAB:-.venv/bin/vitlab}
mkdir -p "$OUT"
SMALL=(--model ViT-Ti/4 --depth 4 --width 128 --heads 4 --mlp-dim 256 --image-size 16)
FT=(--data digits --steps 300 --batch-size 128 --lr 0.03 --warmup 30 --crop-scale 0.5 1 --no-flip --eval-every 100)

[ -f "$OUT/sup-mnist/model.safetensors" ] || $V train --recipe demo --data mnist --out "$OUT/sup-mnist" --resume auto
[ -f "$OUT/sup-digits/model.safetensors" ] || $V train --recipe demo --data digits --out "$OUT/sup-digits" --resume auto
[ -f "$OUT/mpp-digits/model.safetensors" ] || \
  $V train --recipe demo --objective mpp --data digits --out "$OUT/mpp-digits" --resume auto

for run in sup-mnist sup-digits mpp-digits; do
  $V fewshot --weights "$OUT/$run" --data digits --json "$OUT/fewshot-$run.json"
done
$V fewshot --weights "$OUT/sup-digits" --data digits --random-init --json "$OUT/fewshot-random.json"

[ -f "$OUT/ft-mpp/model.safetensors" ] || $V finetune --init "$OUT/mpp-digits" "${FT[@]}" --image-size 16 \
  --out "$OUT/ft-mpp" --resume auto
[ -f "$OUT/ft-scratch/model.safetensors" ] || $V train --recipe finetune "${SMALL[@]}" "${FT[@]}" \
  --out "$OUT/ft-scratch" --resume auto
for run in ft-mpp ft-scratch; do
  echo "$run: $($V eval --weights "$OUT/$run" --data digits --confusion "$OUT/$run/confusion.png" --json)"
done
