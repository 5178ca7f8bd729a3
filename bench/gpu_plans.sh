#!/usr/bin/env bash
# Tiny plans on a GPU against the CPU: for each PLANS/NAME.sharded.pt (made
# where bmt-opt is, weights included) with PLANS/NAME.in.pt (a --dump batch)
# and PLANS/NAME.cpu.pt (bmt-run --dump of it on the CPU, which the tests
# check against eager), runs --dump on cuda and prints the largest
# difference of logits, loss and every gradient from the CPU's; then trains
# every plan 20 steps on cuda (8 rows of 12 tokens, vocabulary 128 as
# scripts/architectures.py's models). Expects B (bmt-run) and LD_LIBRARY_PATH
# from bench/gpu_build.sh; extra bmt-run flags for NAME in EXTRA_<NAME>.
#
# usage: source bench/gpu_build.sh LOGS; bash bench/gpu_plans.sh LOGS PLANS
set -euo pipefail
logs=$1; plans=$2
python3 -c "import torch; torch.save(torch.randint(0, 128, (20, 8, 13), generator=torch.Generator().manual_seed(0)), '$logs/batches.pt')"
for plan in "$plans"/*.sharded.pt; do
  name=$(basename "$plan" .sharded.pt)
  if [ -f "$plans/$name.in.pt" ]; then
    "$B" "$plan" --dump "$plans/$name.in.pt" "$logs/$name.cuda.pt" --device cuda \
      > "$logs/$name.dump.log" 2>&1 || { echo "$name: --dump on cuda failed:"; tail -5 "$logs/$name.dump.log"; continue; }
    python3 - "$plans/$name.cpu.pt" "$logs/$name.cuda.pt" "$name" <<'PY'
import sys, torch
cpu, cuda = torch.load(sys.argv[1]), torch.load(sys.argv[2])
assert cpu.keys() == cuda.keys(), sorted(set(cpu) ^ set(cuda))
diff = lambda k: (cpu[k].float() - cuda[k].float().cpu()).abs().max().item()
worst = max(cpu, key=diff)
print(f"{sys.argv[3]}: cuda --dump against cpu: logits {diff('logits'):.1e}, loss {diff('loss'):.1e}, "
      f"largest of {len(cpu)} tensors {diff(worst):.1e} ({worst})")
PY
  fi
  extra_var="EXTRA_${name//[-.]/_}"; read -r -a extra <<< "${!extra_var:-}"
  "$B" "$plan" --batches "$logs/batches.pt" --steps 20 --micro-batch 8 --device cuda "${extra[@]}" \
    > "$logs/$name.train.log" 2>&1 && echo "$name: 20 steps on cuda: $(grep -o 'step 20/20.*' "$logs/$name.train.log" | head -1)" \
    || { echo "$name: training on cuda failed:"; tail -5 "$logs/$name.train.log"; }
done
