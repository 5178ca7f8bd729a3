#!/usr/bin/env bash
# Mixtures of experts on a GPU: builds bmt-run (bench/gpu_build.sh), then for
# each tiny MoE plan in $DEVCARRY/moe (made where bmt-opt is: traced
# Mixtral, Qwen3-MoE, gpt-oss, DeepSeek-V3 of scripts/architectures.py; each with
# NAME.in.pt and NAME.cpu.pt, bmt-run --dump on the CPU) runs --dump on cuda
# and prints the largest difference of logits, loss and every gradient from
# the CPU's (which test_moe.py and test_architectures_parallel.py check
# against eager transformers); then trains each plan 20 steps on cuda.
#
# usage: bash bench/gpu_moe.sh LOGS
set -euo pipefail
logs=${1:-/tmp/gpu-moe}; mkdir -p "$logs"
source bench/gpu_build.sh "$logs"
for plan in "$carry"/moe/*.sharded.pt; do
  name=$(basename "$plan" .sharded.pt)
  "$B" "$plan" --dump "$carry/moe/$name.in.pt" "$logs/$name.cuda.pt" --device cuda \
    > "$logs/$name.dump.log" 2>&1 || { echo "$name: --dump on cuda failed:"; tail -5 "$logs/$name.dump.log"; continue; }
  python3 - "$carry/moe/$name.cpu.pt" "$logs/$name.cuda.pt" "$name" <<'PY'
import sys, torch
cpu, cuda = torch.load(sys.argv[1]), torch.load(sys.argv[2])
assert cpu.keys() == cuda.keys(), sorted(set(cpu) ^ set(cuda))
worst = max(cpu, key=lambda k: (cpu[k].float() - cuda[k].float().cpu()).abs().max().item())
diff = lambda k: (cpu[k].float() - cuda[k].float().cpu()).abs().max().item()
print(f"{sys.argv[3]}: cuda --dump against cpu: logits {diff('logits'):.1e}, loss {diff('loss'):.1e}, "
      f"largest of {len(cpu)} tensors {diff(worst):.1e} ({worst})")
PY
  python3 -c "import torch; torch.save(torch.randint(0, 128, (20, 8, 13), generator=torch.Generator().manual_seed(0)), '$logs/batches.pt')"
  # DeepSeek-V3's router bias moves after each step (docs/passes/moe-layers.md).
  extra=(); [ "$name" = deepseek_v3 ] && extra=(--moe-bias-update-rate 0.01)
  "$B" "$plan" --batches "$logs/batches.pt" --steps 20 --micro-batch 8 --device cuda "${extra[@]}" \
    > "$logs/$name.train.log" 2>&1 && echo "$name: 20 steps on cuda: $(grep -o 'step 20/20.*' "$logs/$name.train.log" | head -1)" \
    || { echo "$name: training on cuda failed:"; tail -5 "$logs/$name.train.log"; }
done
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
