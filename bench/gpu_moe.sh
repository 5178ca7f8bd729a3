#!/usr/bin/env bash
# Mixtures of experts on a GPU: builds bmt-run (bench/gpu_build.sh), then
# bench/gpu_plans.sh over the tiny MoE plans in $DEVCARRY/moe (made where
# bmt-opt is: traced Mixtral, Qwen3-MoE, gpt-oss, DeepSeek-V3 of
# scripts/architectures.py; each with NAME.in.pt and NAME.cpu.pt, bmt-run
# --dump on the CPU, which test_moe.py and test_architectures_parallel.py
# check against eager transformers): --dump on cuda against the CPU's, then
# 20 steps on cuda.
#
# usage: bash bench/gpu_moe.sh LOGS
set -euo pipefail
logs=${1:-/tmp/gpu-moe}; mkdir -p "$logs"
source bench/gpu_build.sh "$logs"
# DeepSeek-V3's router bias moves after each step (docs/passes/moe-layers.md).
B="$B" EXTRA_deepseek_v3="--moe-bias-update-rate 0.01" bash bench/gpu_plans.sh "$logs" "$carry/moe"
# A Mixtral shape in bfloat16 (86 M parameters: hidden 512, 4 layers, 8
# experts of 1024, top 2; $DEVCARRY/moe-bf16.sharded.pt, bmt-opt --random-init
# of bmt-export-hf --config mixtral --dtype bfloat16 with those --set values):
# 30 steps of 8 x 1024 tokens on cuda, _grouped_mm in bf16.
if [ -f "$carry/moe-bf16.sharded.pt" ]; then
  python3 -c "import torch; torch.save(torch.randint(0, 32000, (30, 8, 1025), generator=torch.Generator().manual_seed(0)), '$logs/batches-bf16.pt')"
  "$B" "$carry/moe-bf16.sharded.pt" --batches "$logs/batches-bf16.pt" --steps 30 --micro-batch 8 \
    --device cuda > "$logs/bf16.train.log" 2>&1 && grep -E "step (1|10|20|30)/30" "$logs/bf16.train.log" \
    || { echo "bf16 Mixtral: training on cuda failed:"; tail -8 "$logs/bf16.train.log"; }
fi
